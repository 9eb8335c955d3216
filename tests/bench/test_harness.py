"""``bench/harness.py`` accounts for where a benchmark row's cores went."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from bench.harness import OutputWatcher, core_note, python_workers, settle_compactions
from millstream.connectors import cassandra as cassandra_connector
from millstream.connectors import kafka as kafka_connector
from millstream.engine.config import MillstreamConfig

if TYPE_CHECKING:
    from cassandra.cluster import Session

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


@pytest.mark.unit
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


def started(*args: str) -> subprocess.Popen[bytes]:
    """A busy Python child with ``args`` after its script, returned once /proc shows its
    command line. ``Popen`` returns as the exec closes the child's descriptors, before the
    kernel has set its arguments up: read then, its cmdline is empty (the test failed so on
    a loaded machine)."""
    argv = [sys.executable, "-c", BURN, *args]
    child = subprocess.Popen(argv)
    expected = b"".join(arg.encode() + b"\0" for arg in argv)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with open(f"/proc/{child.pid}/cmdline", "rb") as command:
            if command.read() == expected:
                return child
        time.sleep(0.01)
    child.kill()
    child.wait()
    raise AssertionError(f"process {child.pid} did not show its command line within 10 s")


@pytest.mark.unit
@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc (Linux)")
def test_python_workers_are_the_daemons_processes_not_the_jvm_naming_pyspark_or_it() -> None:
    # The JVM's command line names pyspark too (its classpath); only the daemon's module
    # name tells Spark's Python workers.
    jvm_like = started("-cp", "site-packages/pyspark/conf")
    # ... and, in millstream's sessions, the daemon's module among its ``--conf`` arguments.
    conf_like = started("--conf", "spark.python.daemon.module=millstream.spark.daemon")
    worker_like = started("-m", "pyspark.daemon")
    ours_like = started("-m", "millstream.spark.daemon")
    try:
        assert {worker_like.pid, ours_like.pid} <= set(python_workers())
        assert not {jvm_like.pid, conf_like.pid} & set(python_workers())
    finally:
        for child in (jvm_like, conf_like, worker_like, ours_like):
            child.kill()  # by its own pid
            child.wait()


@pytest.mark.unit
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


@pytest.mark.integration
def test_a_run_starts_once_the_node_has_no_compaction_running(
    services: MillstreamConfig, cassandra: Session
) -> None:
    # A dropped keyspace that had Paxos writes flushes system.paxos, which compacts after.
    keyspace = "settle_" + os.urandom(4).hex()
    cassandra_connector.create_keyspace(cassandra, keyspace)
    try:
        cassandra.execute(f"CREATE TABLE {keyspace}.t (k int PRIMARY KEY, v int)")
        for k in range(20):
            cassandra.execute(f"INSERT INTO {keyspace}.t (k, v) VALUES ({k}, 1) IF NOT EXISTS")
    finally:
        cassandra_connector.drop_keyspace(cassandra, keyspace)
    waited = settle_compactions(services, timeout=60.0, quiet=0.3)
    # At least the quiet time, never the timeout (other tests' drops may compact meanwhile,
    # so what the node runs the moment after is not asserted).
    assert 0.3 <= waited < 60.0


@pytest.mark.integration
def test_the_output_watcher_counts_messages_as_they_come_and_gives_each_once_asked(
    services: MillstreamConfig, kafka_topic: Callable[..., str]
) -> None:
    topic = kafka_topic(partitions=2)
    watcher = OutputWatcher(services, topic, 2)
    try:
        producer = kafka_connector.producer(services)
        sent = {f"k{n}".encode(): f"v{n}".encode() for n in range(7)}
        for key, value in sent.items():
            producer.produce(topic, value, key)
        assert producer.flush(30) == 0
        at = watcher.wait(7, timeout=30)
        assert watcher.count() == 7
        assert watcher.reached(7) == at
        assert watcher.reached(8) is None
        first = list(watcher.messages)
        assert {m.key: m.value for m in first} == sent
        # Seen when their fetch came, the last of them when the count was reached.
        assert all(m.timestamp > 0 and m.seen <= at * 1_000 for m in first)
        assert max(m.seen for m in first) == at * 1_000
        producer.produce(topic, b"late", b"k7")
        assert producer.flush(30) == 0
        watcher.wait(8, timeout=30)
        # Made once: a later read keeps the first ones and adds the new one.
        again = watcher.messages
        assert again[:7] == first
        assert [m.value for m in again[7:]] == [b"late"]
    finally:
        watcher.close()
