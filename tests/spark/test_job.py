"""A job on a fresh stack: its injectors and its topology provision what they need, whichever
comes first, and the job runs under one lifecycle until its input is complete.

The regression: the main job's first run on a fresh machine failed with ``keyspace
'millstream' does not exist``. Its injector had connected to Cassandra, the topology then
created the keyspace, and the injector's own ``CREATE KEYSPACE IF NOT EXISTS`` found it
without its session's schema cache seeing it (:mod:`millstream.connectors.provisioning`).
The test makes that order happen every time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from millstream.connectors import cassandra as cassandra_connector
from millstream.connectors import kafka as kafka_connector
from millstream.connectors import read_stream
from millstream.engine import Computation, Context, Record, Topology
from millstream.engine.config import MillstreamConfig
from millstream.injectors import InjectorProcess, LogFileSource, connect_injector
from millstream.spark import ProcessingTime, RunningTopology, run_topology
from tests.injectors.logfile_app import parse

if TYPE_CHECKING:
    from cassandra.cluster import Session
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.integration

SECOND = 1_000_000


class Echo(Computation):
    """Produces each record's value again (its code reaches the executors by itself)."""

    def __init__(self, output: str) -> None:
        self.output = output

    def process_record(self, ctx: Context, record: Record) -> None:
        ctx.produce(self.output, record.value, record.timestamp)


def keyspace_exists(session: Session, keyspace: str) -> bool:
    """Whether the cluster has ``keyspace`` (read from the schema tables, not a cache)."""
    rows = session.execute(
        "SELECT keyspace_name FROM system_schema.keyspaces WHERE keyspace_name = %s", (keyspace,)
    )
    return rows.one() is not None


def write_log(directory: Path, prefix: str, count: int) -> list[bytes]:
    directory.mkdir()
    lines = [f"{SECOND * (1_000 + n)} k{n % 5} {prefix}-{n}" for n in range(count)]
    (directory / "a.log").write_text("\n".join(lines) + "\n")
    return [f"{prefix}-{n}".encode() for n in range(count)]


def test_a_first_run_provisions_a_fresh_keyspace_whichever_entry_point_comes_first(
    services: MillstreamConfig,
    spark: SparkSession,
    cassandra: Session,
    unique: Callable[[str], str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    keyspace = unique("fresh")  # nobody created it: a fresh machine
    settings = replace(
        services.run, keyspace=keyspace, checkpoint_root=tmp_path / "checkpoints", partitions=1
    )
    early, hosted, echoes = unique("early"), unique("hosted"), unique("echoes")
    topology = Topology(echoes, streams=[early, hosted])
    topology.add_computation(echoes, Echo(echoes), inputs=[early, hosted], outputs=[echoes])
    expected = write_log(tmp_path / "early", "early", 200) + write_log(
        tmp_path / "hosted", "hosted", 300
    )

    # The injector connects first. Before it provisions anything, the topology starts on a
    # thread of its own, as the main job's did, and the injector goes on the moment the
    # topology has created the keyspace: before its session learns of it from an event.
    real_connect = cassandra_connector.connect
    started: list[RunningTopology] = []
    failed: list[BaseException] = []

    def start_topology() -> None:
        try:
            started.append(
                run_topology(topology, services, settings, trigger=ProcessingTime(0.5), spark=spark)
            )
        except BaseException as exc:
            failed.append(exc)

    def the_topology_starts_meanwhile(config: MillstreamConfig, *args: Any) -> Any:
        connection = real_connect(config, *args)
        monkeypatch.setattr(cassandra_connector, "connect", real_connect)
        threading.Thread(target=start_topology, daemon=True).start()
        deadline = time.monotonic() + 120
        while not keyspace_exists(cassandra, keyspace):
            assert not failed, failed
            assert time.monotonic() < deadline, "the topology did not create the keyspace"
            time.sleep(0.002)
        return connection

    monkeypatch.setattr(cassandra_connector, "connect", the_topology_starts_meanwhile)
    injectors: dict[str, InjectorProcess] = {}
    try:
        source = LogFileSource(tmp_path / "early", parse, early, follow=False)
        with connect_injector(services, early, source, settings=settings) as injector:
            stats = injector.run(until_exhausted=True)
        assert (stats.emitted, stats.dead_letters) == (200, 0)
        deadline = time.monotonic() + 120
        while not started:
            assert not failed, failed
            assert time.monotonic() < deadline, "the topology did not start"
            time.sleep(0.1)
        (running,) = started
        with running:
            # The job's own injector, under the topology's lifecycle.
            source = LogFileSource(tmp_path / "hosted", parse, hosted, follow=False)
            running.add_injector(hosted, source)
            running.await_input_complete(timeout=240)
            injectors = running.injectors
        assert injectors[hosted].stats.emitted == 300
        assert injectors[hosted].exhausted
        assert running.metrics()[echoes].processed == len(expected)
        echoed = [record.value for record in read_stream(services, echoes, dedup=True)]
        assert sorted(echoed) == sorted(expected)
    finally:
        if started:
            started[0].stop()
        cassandra_connector.drop_keyspace(cassandra, keyspace)
        streams = [*topology.streams(), f"{early}.dead-letters", f"{hosted}.dead-letters"]
        kafka_connector.delete_topics(
            services, sorted(kafka_connector.stream_topic(s) for s in streams)
        )
