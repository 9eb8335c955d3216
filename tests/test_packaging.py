"""`pip install .` from the repository gives namespaced imports that work from anywhere."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[1]


def test_the_wheel_installs_and_imports_outside_the_repository(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(tmp_path), REPO],
        check=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("millstream-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for expected in (
        "millstream/engine/__init__.py",
        "millstream/engine/py.typed",
        "millstream/connectors/local/pom.xml",
        "millstream/connectors/local/maven-settings.xml",
        "millstream/schemas/envelope.avsc",
    ):
        assert expected in names, f"{expected} missing from {wheel.name}"
    assert not any(name.startswith(("engine/", "connectors/", "tests/")) for name in names)

    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", site, wheel],
        check=True,
        timeout=300,
    )
    probe = (
        "import millstream.engine, millstream.connectors.local.artifacts as a;"
        "from millstream.engine.records import default_registry;"
        "print(millstream.engine.__file__);"
        "print(a.pinned_versions()['kafka.version']);"
        "print(len(default_registry()))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(site)},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    module_file, kafka_version, schema_count = result.stdout.split()
    assert Path(module_file).is_relative_to(site)
    assert kafka_version.startswith("4.")
    assert int(schema_count) >= 1
