"""A speculative attempt of an interval task on a Spark standalone cluster: exactly one commits.

Spark speculates only on a cluster (never in ``local`` mode), and launches a speculative copy
only on a host where no attempt of the task ran; so the cluster has two Workers, one under
127.0.0.1 and one under localhost, which Spark takes for two hosts. The pipeline is
``speculation_app.py`` (next to this file), submitted with spark-submit. Its one interval task
orders the race whatever the timing: the speculative copy acquires the interval's sequencer
only after the first attempt did, the first attempt leaves user code only once the copy has
acquired it, and the copy commits only once the first attempt's task has ended. Spark's event
log tells which attempt ran where and how it ended; Cassandra and Kafka tell whose work was
committed.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from millstream.connectors import kafka as kafka_connector
from millstream.devtools.local.spark_standalone import StandaloneSparkCluster
from millstream.engine.clock import SystemClock
from millstream.engine.config import MillstreamConfig
from millstream.engine.records import decode_record, encode_record
from millstream.engine.stores.cassandra import CassandraIntervalStore
from tests.cli.test_run import submit_run
from tests.spark import speculation_app
from tests.spark.test_runner import JSON, events, produce, read_topic

if TYPE_CHECKING:
    from cassandra.cluster import Session

pytestmark = pytest.mark.integration

APP_DIRECTORY = Path(__file__).resolve().parent
LOOPBACK = "127.0.0.1"
SUBMIT_TIMEOUT = 180.0
# Spark's scheduler speculates a stage with no more tasks than an executor has slots once a
# task ran this long (spark.speculation.task.duration.threshold); the interval's stage is
# one task on one-core executors.
SPECULATE_AFTER_MS = 2000


def _progress(message: str) -> None:
    print(f"[spark cluster {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@pytest.fixture
def two_host_cluster(tmp_path: Path) -> Iterator[StandaloneSparkCluster]:
    with StandaloneSparkCluster(
        tmp_path / "spark",
        _progress,
        cores=1,
        memory="1g",
        worker_hosts=(LOOPBACK, "localhost"),
    ) as cluster:
        yield cluster
    assert cluster.processes() == {}


def test_a_speculative_attempt_fences_the_original_and_only_one_commits(
    services: MillstreamConfig,
    cassandra: Session,
    cassandra_keyspace: Callable[[], str],
    unique: Callable[[str], str],
    tmp_path: Path,
    two_host_cluster: StandaloneSparkCluster,
) -> None:
    suffix = unique("s").removeprefix("s_")
    keyspace = cassandra_keyspace()
    names = speculation_app.names(suffix)
    signals = tmp_path / "signals"
    signals.mkdir()
    streams = speculation_app.speculation_topology(suffix, str(signals)).streams()
    event_log = tmp_path / "events"
    event_log.mkdir()
    app = f"millstream-speculation-{suffix}"
    env = {
        **{k: v for k, v in os.environ.items() if k != "MILLSTREAM_SPARK_MASTER"},
        # One machine: executors run this interpreter, which has millstream installed.
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": LOOPBACK,
        "SPECULATION_SUFFIX": suffix,
        "SPECULATION_DIRECTORY": str(signals),
    }
    settings = {
        "spark.speculation": "true",
        "spark.speculation.interval": "100ms",
        "spark.speculation.task.duration.threshold": f"{SPECULATE_AFTER_MS}ms",
        # Stages of several tasks (Kafka reads) are not to be speculated: only the threshold
        # above applies, to single-task stages.
        "spark.speculation.minTaskRuntime": "10min",
        "spark.executor.cores": "1",
        "spark.sql.shuffle.partitions": "1",
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": event_log.as_uri(),
        "spark.eventLog.compress": "false",
        "spark.eventLog.rolling.enabled": "false",
    }
    try:
        kafka_connector.create_topics(services, [names["events"]], partitions=1)
        produce(services, names["events"], [encode_record(events(1)[0])])
        output, log = spark_submit(
            two_host_cluster, app, keyspace, tmp_path / "ckpt", env, settings
        )
        produced = [decode_record(v).value for _, _, v in read_topic(services, names["outcomes"])]
    finally:
        kafka_connector.delete_topics(services, sorted(streams))  # dead letters' too

    # Both attempts reached user code: the original, then Spark's speculative copy.
    attempts = {
        n: json.loads((signals / f"attempt-{n}.json").read_text())
        for n in (0, 1, 2)
        if (signals / f"attempt-{n}.json").exists()
    }
    assert sorted(attempts) == [0, 1], f"attempts that ran user code: {sorted(attempts)}\n{log}"

    # Exactly one attempt's effects landed: the speculative copy's state and production.
    store = CassandraIntervalStore(cassandra, keyspace, SystemClock())
    assert store.sequencer(names["race"], 0) == 2  # acquired by both attempts, nobody else
    assert store.fenced(names["race"]) == {0: 1}  # the original's refused commit, counted
    rows = cassandra.execute(
        f"SELECT key, value FROM {keyspace}.intervals "
        "WHERE computation = %s AND interval = 0 AND kind = 'state'",
        (names["race"],),
    )
    assert [JSON.decode(row.value) for row in rows] == ["speculative"]
    assert produced == [b"speculative"]
    # The driver saw one successful task: nothing for it to re-run.
    assert f"{names['race']}: 1 inputs, 1 processed, 0 duplicates, 0 dead letters" in output
    assert "attempt 1/" not in log

    # Spark's event log: the second attempt was a speculative copy of the same task, on the
    # other host; the original, holding a stale lease, was refused its commit and failed with
    # FencedError while the copy ran on and then succeeded. No third attempt ran.
    started, ended = task_events(event_log)
    original, speculative = (attempts[n]["task_id"] for n in (0, 1))
    assert started[original]["Stage ID"] == started[speculative]["Stage ID"] == attempts[0]["stage"]
    stage = [info for info in started.values() if info["Stage ID"] == attempts[0]["stage"]]
    assert len(stage) == 2, f"the interval's task ran {len(stage)} attempts"
    first, copy = started[original]["Task Info"], started[speculative]["Task Info"]
    assert (first["Attempt"], first["Speculative"]) == (0, False)
    assert (copy["Attempt"], copy["Speculative"]) == (1, True)
    assert first["Index"] == copy["Index"]
    assert first["Host"] != copy["Host"]
    assert original in ended, "the original attempt never ended"
    reason = ended[original]["Task End Reason"]
    assert reason["Reason"] == "ExceptionFailure", f"the original attempt ended: {reason}"
    assert "FencedError" in reason["Description"], reason["Description"]
    assert "(sequencer 2, this lease 1)" in reason["Description"]
    assert speculative in ended, "the speculative attempt never ended"
    assert ended[speculative]["Task End Reason"]["Reason"] == "Success"


def spark_submit(
    cluster: StandaloneSparkCluster,
    app: str,
    keyspace: str,
    checkpoints: Path,
    env: dict[str, str],
    settings: dict[str, str],
) -> tuple[str, str]:
    """Run ``speculation_app`` through spark-submit to the end; its stdout and stderr."""
    _, output, log = submit_run(
        cluster,
        app,
        "speculation_app:topology",
        cwd=APP_DIRECTORY,
        env=env,
        options=[
            f"--keyspace={keyspace}",
            f"--checkpoint-root={checkpoints}",
            "--no-create-keyspace",
        ],
        settings=settings,
        timeout=SUBMIT_TIMEOUT,
    )
    return output, log


def task_events(directory: Path) -> tuple[dict[int, Any], dict[int, Any]]:
    """The ``SparkListenerTaskStart`` and ``SparkListenerTaskEnd`` events, by task ID, of the
    one application logged under ``directory``."""
    (log,) = (path for path in directory.rglob("*") if path.is_file())
    started: dict[int, Any] = {}
    ended: dict[int, Any] = {}
    for line in log.read_text().splitlines():
        event = json.loads(line)
        kind = {"SparkListenerTaskStart": started, "SparkListenerTaskEnd": ended}
        if event["Event"] in kind:
            kind[event["Event"]][int(event["Task Info"]["Task ID"])] = event
    return started, ended
