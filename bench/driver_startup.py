"""How long a local driver takes to start: its SparkSession and its first job, with the class
archive and without it, beside bare PySpark.

    python bench/driver_startup.py [--runs 5]

Each start is a fresh Python process, as a driver restarted after a crash is: it creates its
session and runs a first job that crosses into Python and back (``mapInArrow`` and an
aggregation), then stops. Three kinds take turns, so that drift on a shared machine falls on
each alike: millstream's session with its class archive (``millstream.spark.class_archive``,
trained first if this Java and Spark have none), millstream's session without it
(``[spark] class_archive = false``), and a bare ``SparkSession.builder`` with only the master
set, the floor a PySpark user starts from. Prints each kind's median, its spread, and the
ratios to the bare session. No services needed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `bench.*` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

KINDS = ("millstream, class archive", "millstream, no archive", "bare PySpark")

_START = """
import json, sys, time
started = time.monotonic()
kind = sys.argv[1]
if kind == "bare PySpark":
    from pyspark.sql import SparkSession
    builder = SparkSession.builder.master("local[*]").config("spark.ui.enabled", "false")
    session = builder.getOrCreate()
else:
    from dataclasses import replace
    from millstream.engine.config import load_config
    from millstream.spark.session import spark_session
    config = replace(load_config(), spark_class_archive=kind == "millstream, class archive")
    session = spark_session(config, app_name="driver-startup", progress=lambda m: None)
ready = time.monotonic()
frame = session.range(10_000).selectExpr("id", "id % 10 AS k")
frame.mapInArrow(lambda batches: batches, frame.schema).groupBy("k").count().collect()
done = time.monotonic()
session.stop()
print(json.dumps({"session": ready - started, "first_job": done - ready}))
"""


def start(kind: str) -> dict[str, float]:
    """One fresh driver process of ``kind``: seconds to its session and to its first job."""
    finished = subprocess.run(
        [sys.executable, "-c", _START, kind],
        capture_output=True,
        text=True,
        timeout=600,
        # The Python workers run this interpreter (a user's virtualenv), as millstream's do.
        env={**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"},
    )
    if finished.returncode != 0:
        raise SystemExit(f"{kind}: the driver failed:\n{finished.stderr[-2000:]}")
    return dict(json.loads(finished.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="starts of each kind (default 5)")
    args = parser.parse_args()
    start(KINDS[0])  # trains the archive if this Java and Spark have none; not counted
    times: dict[str, list[dict[str, float]]] = {kind: [] for kind in KINDS}
    for run in range(args.runs):
        for kind in KINDS:
            times[kind].append(start(kind))
            print(f"  run {run + 1} {kind}: {times[kind][-1]}", flush=True)
    floor = {
        phase: statistics.median(t[phase] for t in times["bare PySpark"])
        for phase in ("session", "first_job")
    }
    print()
    print(f"{'start of a local driver':<28} {'session':>16} {'first job':>16} {'both':>16}")
    for kind in KINDS:
        cells = []
        for phase in ("session", "first_job", "both"):
            values = [
                t["session"] + t["first_job"] if phase == "both" else t[phase] for t in times[kind]
            ]
            median = statistics.median(values)
            base = sum(floor.values()) if phase == "both" else floor[phase]
            cells.append(f"{median:5.2f} s (x{median / base:.2f})")
        print(f"{kind:<28} {cells[0]:>16} {cells[1]:>16} {cells[2]:>16}")
    print(f"\n{args.runs} starts of each kind, medians; x: of bare PySpark's median")


if __name__ == "__main__":
    main()
