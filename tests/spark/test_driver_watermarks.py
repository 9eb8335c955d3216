"""The driver's watermark bookkeeping keeps a report it could not publish (Kafka down), and
wakes its query again while productions are pending, also on the real stack once the input
has ended; a topology's computations share one reader and publisher of the topic."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from millstream.connectors import kafka as kafka_connector
from millstream.connectors.kafka.transactions import transactional_id
from millstream.engine import pause_points
from millstream.engine.authority import WatermarkAuthority
from millstream.engine.clock import ManualClock, SystemClock
from millstream.engine.computation import Computation
from millstream.engine.config import MillstreamConfig
from millstream.engine.context import Context
from millstream.engine.errors import TopologyError
from millstream.engine.records import Record, decode_record, encode_record, injector_record_id
from millstream.engine.stores.cassandra import CassandraIntervalStore
from millstream.engine.topology import ComputationOptions, Topology
from millstream.engine.watermark_topic import MemoryWatermarkTopic
from millstream.engine.watermarks import WatermarkReport
from millstream.engine.watermarks.intervals import IntervalProgress
from millstream.spark import driver_watermarks
from millstream.spark.driver_watermarks import DriverWatermarks, TopologyWatermarks
from millstream.spark.runner import ProcessingTime, run_topology
from tests.spark.test_runner import BASE_TIME, produce, read_topic, register_by_value
from tests.waiting import wait_until

if TYPE_CHECKING:
    from cassandra.cluster import Session
    from pyspark.sql import SparkSession


class Forward(Computation):
    def __init__(self, output: str = "out") -> None:
        self.output = output

    def process_record(self, ctx: Context, record: Record) -> None:
        ctx.produce(self.output, record.value, record.timestamp)


class Unused:
    """Stands in for a Kafka client this test never reaches."""

    def close(self) -> None:
        pass


class FlakyTopic(MemoryWatermarkTopic):
    """Fails its first ``failures`` publishes as a broker that is down would."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    def publish(self, report: WatermarkReport) -> None:
        if self.failures:
            self.failures -= 1
            raise TimeoutError("the broker did not acknowledge the report within 30 s")
        super().publish(report)


@pytest.fixture
def driver(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[DriverWatermarks, FlakyTopic]]:
    monkeypatch.setattr(driver_watermarks, "offsets_consumer", lambda config: Unused())
    monkeypatch.setattr(kafka_connector, "end_offsets", lambda *_: {"out": {0: 7}})
    topology = Topology("flaky", streams=["in"])
    spec = topology.add_computation("forward", Forward(), inputs=["in"], outputs=["out"])
    topic = FlakyTopic(failures=1)
    authority = WatermarkAuthority(MemoryWatermarkTopic())  # a topic without messages
    watermarks = DriverWatermarks(
        MillstreamConfig(), topology, spec, topic, ManualClock(), authority
    )
    yield watermarks, topic
    watermarks.close()


@pytest.mark.unit
def test_a_report_that_failed_to_publish_is_published_by_the_next_call(
    driver: tuple[DriverWatermarks, FlakyTopic],
) -> None:
    watermarks, topic = driver
    made: list[WatermarkReport] = []

    def report_once(sequence: int, offsets: Any) -> WatermarkReport | None:
        # The bookkeeping makes a report once per change: after the first it says "no change".
        if made:
            return None
        made.append(
            WatermarkReport(
                watermarks.state.source, ("out",), 5, sequence, offsets, input_watermark=6
            )
        )
        return made[0]

    with pytest.raises(TimeoutError):
        watermarks.after_batch(1, report_once)
    assert topic.reports() == []
    watermarks.after_batch(1, report_once)  # the batch retried once Kafka is back
    assert topic.reports() == made
    watermarks.after_batch(2, report_once)
    assert topic.reports() == made  # published once, not again


@pytest.mark.unit
def test_a_batch_that_left_productions_pending_wakes_its_query_for_another(
    driver: tuple[DriverWatermarks, FlakyTopic], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the input has ended nothing else starts the batch that delivers them (a
    transaction fenced in the last batch left a proving run's driver waiting for good)."""
    watermarks, topic = driver
    topic.failures = 0
    monkeypatch.setattr(driver_watermarks, "UNDELIVERED_RETRY_SECONDS", 0.05)
    intervals = watermarks.state.intervals
    interval = min(intervals.ids)
    intervals.record(interval, IntervalProgress(oldest_work=3, pending=2))
    watermarks.after_batch(1, lambda *_: None)
    wait_until("the watermarks wake the alarm topic", lambda: topic.wakes, timeout=5, every=0.01)
    assert topic.wakes == [(watermarks.alarm_topic, f"alarm/flaky/{watermarks.spec.name}")]

    # Delivered: no more wake-ups.
    topic.wakes.clear()
    intervals.record(interval, IntervalProgress())
    watermarks.after_batch(2, lambda *_: None)
    time.sleep(0.2)
    assert topic.wakes == []


@pytest.mark.integration
def test_productions_fenced_in_the_last_batch_of_input_leave_without_further_input(
    services: MillstreamConfig,
    spark: SparkSession,
    cassandra: Session,
    unique: Callable[[str], str],
    cassandra_keyspace: Callable[[], str],
    tmp_path: Path,
) -> None:
    """The batch that runs the last input has its Kafka transaction fenced (a new producer of
    its transactional ID opened while the worker held it open), so its productions stay
    pending in Cassandra. No input ever comes again, yet they reach a plain read_committed
    reader, each once: the driver's retry alarm starts the batch that resends them (before
    the alarm, the driver waited for good)."""
    register_by_value(sys.modules[__name__])
    name = unique("fenced")
    inputs, outputs = f"{name}_in", f"{name}_out"
    keyspace = cassandra_keyspace()
    topology = Topology(name, streams=[inputs])
    topology.add_computation(
        name,
        Forward(outputs),
        inputs=[inputs],
        outputs=[outputs],
        options=ComputationOptions(key_intervals=1),  # one transactional ID: interval 0
    )
    sent = [
        Record(f"key-{n}", f"r{n}".encode(), BASE_TIME + n, injector_record_id(name, 0, n))
        for n in range(12)
    ]
    # The Python workers park at the first transaction of the computation: the one of its
    # first batch, which takes every input there will ever be.
    pauses = tmp_path / "pauses"
    pauses.mkdir()
    point = f"executor.transaction.{name}"
    (pauses / f"arm.{point}").touch()
    environment = spark.sparkContext.environment
    environment[pause_points.ENVIRONMENT_VARIABLE] = str(pauses)
    run = replace(
        services.run, keyspace=keyspace, checkpoint_root=tmp_path / "cp", create_keyspace=False
    )
    try:
        kafka_connector.create_topics(services, [inputs], partitions=1)
        produce(services, inputs, [encode_record(record) for record in sent])
        with run_topology(topology, services, run, trigger=ProcessingTime(0.5), spark=spark) as (
            running
        ):
            deadline = time.monotonic() + 120
            while not (pauses / f"at.{point}").exists():
                running.raise_failure()
                assert time.monotonic() < deadline, "no worker reached the transaction"
                time.sleep(0.05)
            # A new producer of the interval's transactional ID fences the parked one and
            # aborts its open transaction.
            store = CassandraIntervalStore(cassandra, keyspace, SystemClock(), table=run.table)
            namespace = kafka_connector.store_namespace(keyspace, run.table, store.table_id)
            fencer = kafka_connector.producer(
                services, **{"transactional.id": transactional_id(namespace, name, 0)}
            )
            fencer.init_transactions(30)
            (pauses / f"release.{point}").touch()

            # No input comes again: only the driver can start the batch that delivers them.
            expected = sorted(record.value for record in sent)
            deadline = time.monotonic() + 60
            while not (
                (batches := running.batches(name))
                and batches[-1].pending == 0  # the batch that delivered them is over
                and delivered(services, outputs) == expected
            ):
                running.raise_failure()
                assert time.monotonic() < deadline, (
                    f"read {delivered(services, outputs)} of {expected} 60 s after the fence; "
                    f"batches: {batches}"
                )
                time.sleep(0.2)
    finally:
        del environment[pause_points.ENVIRONMENT_VARIABLE]
        kafka_connector.delete_topics(services, sorted(topology.streams()))  # dead letters too

    (fenced, *after) = [batch for batch in batches if batch.inputs or batch.resent]
    # The fenced batch took every input, committed its productions and delivered none.
    assert (fenced.inputs, fenced.processed, fenced.pending) == (12, 12, 12)
    assert (fenced.transactions, fenced.transaction_failures, fenced.fenced_producers) == (0, 1, 1)
    # Then, without input, a batch resent them in one transaction.
    (resent,) = after
    assert (resent.inputs, resent.resent, resent.acknowledged) == (0, 12, 12)
    assert (resent.transactions, resent.fenced_producers, resent.pending) == (1, 0, 0)


def delivered(config: MillstreamConfig, stream: str) -> list[bytes]:
    """The values of every record a plain read_committed reader reads from ``stream`` (no
    deduplication), sorted."""
    return sorted(decode_record(value).value for _, _, value in read_topic(config, stream))


@pytest.mark.integration
def test_a_topologys_computations_share_one_reader_and_publisher_until_closed(
    services: MillstreamConfig,
) -> None:
    topology = Topology("shared", streams=["in", "mid", "out"])
    first = topology.add_computation("first", Forward("mid"), inputs=["in"], outputs=["mid"])
    second = topology.add_computation("second", Forward(), inputs=["mid"], outputs=["out"])
    watermarks = TopologyWatermarks(services, topology, SystemClock())
    try:
        with pytest.raises(TopologyError, match="has not run"):
            watermarks.get("first")
        one, two = watermarks.of(first), watermarks.of(second)
        assert watermarks.of(first) is one  # kept across the query's restarts
        assert watermarks.get("second") is two
        assert one.authority is two.authority
        assert one.topic is two.topic
        assert set(watermarks.snapshots()) == {"first", "second"}

        assert watermarks.pop("second") is two
        two.close()
        assert set(watermarks.snapshots()) == {"first"}
        assert watermarks.pop("second") is None

        watermarks.close()
        assert watermarks.snapshots() == {}
        with pytest.raises(TopologyError):
            watermarks.get("first")
        again = watermarks.of(first)  # a computation run after close: a reader of its own
        assert again is not one
        assert again.authority is not one.authority
    finally:
        watermarks.close()
