"""``bench/harness.py`` accounts for where a benchmark row's cores went."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from bench.harness import core_note, core_use, python_workers

pytestmark = pytest.mark.unit

BURN = "import time\nend = time.time() + 5\nwhile time.time() < end:\n    pass\n"


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc (Linux)")
def test_a_busy_process_counts_under_its_service_name_and_as_a_descendant() -> None:
    child = subprocess.Popen([sys.executable, "-c", BURN])
    try:
        before = core_use({"service": child.pid})
        time.sleep(1.0)
        after = core_use({"service": child.pid})
    finally:
        child.kill()  # by its own pid
        child.wait()
    assert set(after) == {"service", "bench+driver", "Spark JVM", "Python workers", "others"}
    # A core's worth of busy loop, give or take a loaded machine.
    assert after["service"] - before["service"] > 0.3
    assert after["others"] - before["others"] > 0.3  # a child that is no Spark process
    # Not counted as a Spark process: this process's own Spark session, if an earlier test
    # started one, counts there, idle (a busy loop would add about a core).
    assert after["Spark JVM"] - before["Spark JVM"] < 0.3
    assert after["Python workers"] - before["Python workers"] < 0.3


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc (Linux)")
def test_python_workers_are_the_pyspark_daemons_processes_not_the_jvm_naming_pyspark() -> None:
    # The JVM's command line names pyspark too (its classpath); only the daemon's module
    # name tells Spark's Python workers.
    jvm_like = subprocess.Popen([sys.executable, "-c", BURN, "-cp", "site-packages/pyspark/conf"])
    worker_like = subprocess.Popen([sys.executable, "-c", BURN, "-m", "pyspark.daemon"])
    try:
        assert worker_like.pid in python_workers()
        assert jvm_like.pid not in python_workers()
    finally:
        for child in (jvm_like, worker_like):
            child.kill()  # by its own pid
            child.wait()


def test_the_note_gives_each_role_its_cores_and_the_machine_what_is_left() -> None:
    before = {"cassandra": 10.0, "kafka": 4.0, "Python workers": 0.0, "others": 0.0}
    after = {"cassandra": 12.0, "kafka": 4.5, "Python workers": 1.0, "others": 0.001}
    idle = (os.cpu_count() or 1) - 1.75
    assert core_note(before, after, 2.0) == (
        "cores busy over 2.0 s: cassandra 1.00, kafka 0.25, Python workers 0.50; "
        f"idle {max(idle, 0.0):.2f}"
    )
