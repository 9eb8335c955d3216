"""``scripts/main`` bootstraps in the repository but starts the stack and runs the job where
it was called from, so the paths given to it (and ./millstream.toml) are the caller's.
Checked on a copy of the repository whose bootstrap, ``millstream`` and job are stand-ins
that record what they saw."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[1]

BOOTSTRAP = """\
echo "$PWD" > bootstrapped-in
mkdir -p .venv/bin
ln -sf "{python}" .venv/bin/python
printf '#!/bin/sh\\necho "$PWD: $*" >> "{log}"\\n' > .venv/bin/millstream
chmod +x .venv/bin/millstream
export PATH="$PWD/.venv/bin:$PATH"
"""

JOB = """\
import argparse, json, os, sys
from pathlib import Path

parser = argparse.ArgumentParser()
parser.add_argument("--series", type=Path)
args = parser.parse_args()
print(json.dumps({
    "cwd": os.getcwd(),
    "job": __file__,
    "series": str(args.series.resolve()),
    "found": sorted(p.name for p in args.series.glob("*.csv")),
}))
"""


def test_main_reads_a_relative_series_directory_from_where_it_is_called(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy2(REPO / "scripts" / "main", repo / "scripts" / "main")
    log = tmp_path / "millstream.log"
    (repo / "scripts" / "bootstrap.sh").write_text(BOOTSTRAP.format(python=sys.executable, log=log))
    job = repo / "examples" / "zeitgeist" / "__main__.py"
    job.parent.mkdir(parents=True)
    (job.parent / "__init__.py").write_text("")
    job.write_text(JOB)
    caller = tmp_path / "work"
    (caller / "data" / "nab").mkdir(parents=True)
    (caller / "data" / "nab" / "ibm.csv").write_text("timestamp,value\n")
    # A package of the same name where the caller stands is not the job.
    (caller / "zeitgeist").mkdir()
    (caller / "zeitgeist" / "__main__.py").write_text("raise SystemExit('the wrong job')\n")

    result = subprocess.run(
        [repo / "scripts" / "main", "--series", "data/nab"],
        cwd=caller,
        env={**os.environ, "PYTHONPATH": ""},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    assert Path(seen["cwd"]).resolve() == caller.resolve()
    assert Path(seen["job"]).resolve() == job.resolve()
    assert Path(seen["series"]).resolve() == (caller / "data" / "nab").resolve()
    assert seen["found"] == ["ibm.csv"]
    assert Path((repo / "bootstrapped-in").read_text().strip()).resolve() == repo.resolve()
    # The stack reads the same settings as the job: ./millstream.toml of the caller.
    ran_in, _, command = log.read_text().partition(": ")
    assert (Path(ran_in).resolve(), command) == (caller.resolve(), "up\n")
