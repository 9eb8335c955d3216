"""``bench/harness.py`` accounts for where a benchmark row's cores went."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.harness import core_note, python_workers

pytestmark = pytest.mark.unit

BURN = "import time\nend = time.time() + 5\nwhile time.time() < end:\n    pass\n"


# Run in a process of its own: ``core_use`` counts every descendant of the process that
# calls it, and a test worker that ran Spark earlier has its JVM and Python workers, busy
# now and then.
MEASURE = f"""
import json, subprocess, sys, time
from bench.harness import core_use, role_use
child = subprocess.Popen([sys.executable, "-c", {BURN!r}])
try:
    before = core_use({{"service": child.pid}})
    time.sleep(1.0)
    after = core_use({{"service": child.pid}})
finally:
    child.kill()  # by its own pid
    child.wait()
print(json.dumps(role_use(before, after)))
"""


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc (Linux)")
def test_a_busy_process_counts_under_its_service_name_and_as_a_descendant() -> None:
    root = Path(__file__).resolve().parents[2]
    measured = subprocess.run(
        [sys.executable, "-c", MEASURE],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    used = json.loads(measured.stdout)
    assert list(used) == ["service", "bench+driver", "Spark JVM", "Python workers", "others"]
    # A core's worth of busy loop, give or take a loaded machine.
    assert used["service"] > 0.3
    assert used["others"] > 0.3  # a child that is no Spark process
    assert used["Spark JVM"] == used["Python workers"] == 0.0


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc (Linux)")
def test_python_workers_are_the_daemons_processes_not_the_jvm_naming_pyspark_or_it() -> None:
    # The JVM's command line names pyspark too (its classpath); only the daemon's module
    # name tells Spark's Python workers.
    jvm_like = subprocess.Popen([sys.executable, "-c", BURN, "-cp", "site-packages/pyspark/conf"])
    # ... and, in millstream's sessions, the daemon's module among its ``--conf`` arguments.
    conf_like = subprocess.Popen(
        [sys.executable, "-c", BURN, "--conf", "spark.python.daemon.module=millstream.spark.daemon"]
    )
    worker_like = subprocess.Popen([sys.executable, "-c", BURN, "-m", "pyspark.daemon"])
    ours_like = subprocess.Popen([sys.executable, "-c", BURN, "-m", "millstream.spark.daemon"])
    try:
        assert {worker_like.pid, ours_like.pid} <= set(python_workers())
        assert not {jvm_like.pid, conf_like.pid} & set(python_workers())
    finally:
        for child in (jvm_like, conf_like, worker_like, ours_like):
            child.kill()  # by its own pid
            child.wait()


def test_the_note_gives_each_role_its_cores_and_the_machine_what_is_left() -> None:
    before = {("cassandra", 1): 10.0, ("kafka", 2): 4.0, ("others", 5): 7.0}
    after = {
        ("cassandra", 1): 12.0,
        ("kafka", 2): 4.5,
        ("Python workers", 3): 1.0,  # started in the window
        ("others", 4): 0.001,
    }  # others 5 ended in it: missed, not counted against its role
    idle = (os.cpu_count() or 1) - 1.7505
    assert core_note(before, after, 2.0) == (
        "cores busy over 2.0 s: cassandra 1.00, kafka 0.25, Python workers 0.50; "
        f"idle {max(idle, 0.0):.2f}"
    )
