"""The Kafka production sink on the real broker, strong productions end to end, and the
watermark topic.

The strong-production tests run the per-key protocol on the real Cassandra store with the real
Kafka sink, crash a worker between its commit and the acknowledgement of its productions, and
check that the new owner resends them and a downstream consumer that deduplicates by record ID
sees each effect exactly once.

The watermark tests publish and read reports on a compacted topic of their own.
"""

from __future__ import annotations

import dataclasses
import json
import socket
import time
from collections.abc import Callable, Iterator, Sequence, Set
from typing import TYPE_CHECKING, Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import ConfigResource, ResourceType

from millstream.connectors import kafka as kafka_connector
from millstream.connectors.kafka import (
    WATERMARK_TOPIC_CONFIG,
    KafkaProductionSink,
    KafkaWatermarkTopic,
    stream_topic,
)
from millstream.engine.clock import ManualClock
from millstream.engine.computation import Computation
from millstream.engine.config import MillstreamConfig
from millstream.engine.context import Context
from millstream.engine.errors import ConfigError
from millstream.engine.productions import Production
from millstream.engine.protocol import WEAK_SEND_CHUNK, Delivery, IntervalWorker
from millstream.engine.records import MIN_EVENT_TIME, Record, decode_record, injector_record_id
from millstream.engine.stores.cassandra import CassandraIntervalStore, create_schema
from millstream.engine.topology import ComputationOptions, ComputationSpec, InputStream
from millstream.engine.watermarks import (
    ExpectedSet,
    InputWatermark,
    WatermarkReport,
    computation_source,
    injector_source,
)
from tests.watermark_topics import delete_watermark_topics

if TYPE_CHECKING:
    from cassandra.cluster import Session

pytestmark = pytest.mark.integration


def consume(
    config: MillstreamConfig, topic: str, expected: int, timeout: float = 30
) -> list[Record]:
    """Every record on ``topic`` from the beginning, waiting until ``expected`` arrived."""
    consumer = kafka_connector.consumer(config, "test")
    consumer.subscribe([topic])
    records: list[Record] = []
    deadline = time.monotonic() + timeout
    try:
        while len(records) < expected and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            assert message.error() is None, message.error()
            value = message.value()
            assert value is not None
            records.append(decode_record(value))
        # Anything beyond ``expected`` (an unwanted duplicate) must show up too.
        while (message := consumer.poll(1.0)) is not None:
            value = message.value()
            assert value is not None
            records.append(decode_record(value))
    finally:
        consumer.close()
    return records


def _record(n: int, key: str = "k") -> Record:
    return Record(key, f"v{n}".encode(), 1_000_000 + n, injector_record_id("sink-test", 0, n))


def test_sent_productions_arrive_on_their_streams_topics(
    services: MillstreamConfig, kafka_topic: Callable[..., str]
) -> None:
    first, second = kafka_topic(), kafka_topic(partitions=2)
    productions = [Production(first, _record(n)) for n in range(5)] + [
        Production(second, _record(n, key=f"k{n}")) for n in range(5, 12)
    ]
    sink = KafkaProductionSink(services)
    acknowledged = sink.send(productions, timeout=30)
    assert acknowledged == {p.record_id for p in productions}
    assert stream_topic(first) == first
    assert consume(services, first, 5) == [p.record for p in productions[:5]]
    assert sorted(consume(services, second, 7), key=lambda r: r.timestamp) == [
        p.record for p in productions[5:]
    ]


def test_a_production_the_broker_refuses_is_the_one_not_acknowledged(
    services: MillstreamConfig, kafka_topic: Callable[..., str], caplog: pytest.LogCaptureFixture
) -> None:
    """One send: the production the broker refuses is not acknowledged, the others are."""
    # The broker refuses a topic's record batch whole: the refused production has its own.
    small, plain = kafka_topic(config={"max.message.bytes": "1000"}), kafka_topic()
    fine = [Production(plain, _record(n)) for n in range(3)]
    too_large = Production(small, Record("k", b"x" * 2_000, 1, injector_record_id("big", 0, 0)))
    sink = KafkaProductionSink(services)
    try:
        acknowledged = sink.send([fine[0], too_large, *fine[1:]], timeout=30)
    finally:
        sink.close(0)
    assert acknowledged == {p.record_id for p in fine}
    assert f"production {too_large.record_id.hex()} not delivered" in caplog.text
    assert consume(services, plain, 3) == [p.record for p in fine]


def test_a_stream_deleted_under_a_live_producer_is_not_created_again(
    services: MillstreamConfig, kafka_topic: Callable[..., str]
) -> None:
    # librdkafka producers ask the broker to create any topic they write to or know of
    # (Kafka brokers do, by default, with one partition): a live producer would bring a
    # deleted stream's topic back, with the wrong partitions, on its next metadata refresh.
    topic = kafka_topic(partitions=2)
    sink = KafkaProductionSink(services)
    admin = kafka_connector.admin_client(services)
    try:
        first, second = _record(0), _record(1)
        assert sink.send([Production(topic, first)], timeout=30) == {first.record_id}
        kafka_connector.delete_topics(services, [topic])
        assert sink.send([Production(topic, second)], timeout=5) == frozenset()
        assert topic not in admin.list_topics(timeout=10).topics
    finally:
        sink.close(0)


def test_an_unreachable_broker_acknowledges_nothing_within_the_timeout(
    services: MillstreamConfig,
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free_port = probe.getsockname()[1]
    nowhere = MillstreamConfig(kafka_bootstrap=f"127.0.0.1:{free_port}")
    sink = KafkaProductionSink(nowhere, **{"message.timeout.ms": 60_000})
    started = time.monotonic()
    acknowledged = sink.send([Production("anything", _record(1))], timeout=2)
    assert acknowledged == set()
    assert time.monotonic() - started < 10


class CountAndEmit(Computation):
    """Counts records per key; emits ``key=count`` to ``stream`` for every record."""

    def __init__(self, stream: str) -> None:
        self.stream = stream

    def process_record(self, ctx: Context, record: Record) -> None:
        count = int(ctx.get_state() or b"0") + 1
        ctx.set_state(str(count).encode())
        ctx.produce(self.stream, f"{ctx.key}={count}".encode(), record.timestamp)


def counter(output: str, *, strong_productions: bool = True) -> ComputationSpec:
    """:class:`CountAndEmit` to ``output`` as computation ``counter``, on one key interval."""
    return ComputationSpec(
        "counter",
        CountAndEmit(output),
        (InputStream("searches"),),
        (output,),
        ComputationOptions(key_intervals=1, strong_productions=strong_productions),
    )


class CrashingSink:
    """Passes sends through to Kafka, or not, then dies: a worker crash around the send."""

    def __init__(self, inner: KafkaProductionSink, deliver_first: bool) -> None:
        self.inner = inner
        self.deliver_first = deliver_first

    def send(self, productions: Sequence[Production], timeout: float) -> Set[bytes]:
        if self.deliver_first:
            self.inner.send(productions, timeout)
        raise RuntimeError("worker process killed around the send")


@pytest.mark.parametrize(
    "deliver_first", [False, True], ids=["crash-before-send", "crash-after-send-before-ack"]
)
def test_strong_productions_survive_a_crash_and_are_deduplicated_downstream(
    services: MillstreamConfig,
    cassandra: Session,
    cassandra_keyspace: Callable[[], str],
    kafka_topic: Callable[..., str],
    deliver_first: bool,
) -> None:
    keyspace = cassandra_keyspace()
    create_schema(cassandra, keyspace)
    output = kafka_topic()
    spec = counter(output)
    keys = ["a", "b", "a", "c", "a", "b"]
    deliveries = [Delivery(key, _record(n, key)) for n, key in enumerate(keys)]
    clock = ManualClock(2_000_000)
    kafka = KafkaProductionSink(services)

    doomed = IntervalWorker(
        spec,
        0,
        store=CassandraIntervalStore(cassandra, keyspace, clock),
        sink=CrashingSink(kafka, deliver_first),
        clock=clock,
    )
    with pytest.raises(RuntimeError, match="killed"):
        doomed.process(deliveries, 0)

    # A new owner (a retried task in another process) gets the whole batch again.
    store = CassandraIntervalStore(cassandra, keyspace, clock)
    result = IntervalWorker(spec, 0, store=store, sink=kafka, clock=clock).process(deliveries, 0)
    assert (result.rescanned, result.processed, result.duplicates) == (True, 0, len(keys))
    assert result.acknowledged == len(keys)  # the pending productions, resent
    lease = store.acquire("counter", 0)
    assert store.scan(lease).productions == ()
    assert [store.read_state(lease, key) for key in "abc"] == [b"3", b"2", b"1"]

    delivered = consume(services, output, len(keys))
    # Delivered once, or twice when the crash came after the send: never lost.
    assert len(delivered) == len(keys) * (2 if deliver_first else 1)
    distinct = {record.record_id: record.value for record in delivered}
    assert sorted(distinct.values()) == sorted([b"a=1", b"a=2", b"a=3", b"b=1", b"b=2", b"c=1"])


class CountingSink:
    """Passes sends through to Kafka, counting them and what each held."""

    def __init__(self, sink: KafkaProductionSink) -> None:
        self.sink = sink
        self.sizes: list[int] = []

    def send(self, productions: Sequence[Production], timeout: float) -> Set[bytes]:
        self.sizes.append(len(productions))
        return self.sink.send(productions, timeout)


def test_a_large_batch_of_weak_productions_arrives_whole_in_chunks_and_checkpoints_none(
    services: MillstreamConfig,
    cassandra: Session,
    cassandra_keyspace: Callable[[], str],
    kafka_topic: Callable[..., str],
) -> None:
    keyspace = cassandra_keyspace()
    create_schema(cassandra, keyspace)
    output = kafka_topic(partitions=2)
    spec = counter(output, strong_productions=False)
    keys = 3 * WEAK_SEND_CHUNK + 5
    deliveries = [Delivery(f"k{n:05}", _record(n, f"k{n:05}")) for n in range(keys)]
    clock = ManualClock(2_000_000)
    store = CassandraIntervalStore(cassandra, keyspace, clock)
    sink = CountingSink(KafkaProductionSink(services))
    try:
        result = IntervalWorker(spec, 0, store=store, sink=sink, clock=clock).process(deliveries, 0)
    finally:
        sink.sink.close(0)

    assert result.acknowledged == keys
    # Sent a chunk at a time as the keys ran, the last ones after them; one send at most of
    # anything but a chunk (the thread may have found several chunks waiting).
    assert sum(sink.sizes) == keys
    assert len(sink.sizes) >= 2
    assert sink.sizes[-1] % WEAK_SEND_CHUNK != 0
    lease = store.acquire("counter", 0)
    assert store.scan(lease).productions == ()
    delivered = consume(services, output, keys)
    assert sorted(r.value for r in delivered) == sorted(f"k{n:05}=1".encode() for n in range(keys))


# -- the watermark topic ------------------------------------------------------------------


@pytest.fixture
def watermarks(
    services: MillstreamConfig, unique: Callable[[str], str]
) -> Iterator[MillstreamConfig]:
    """The services' configuration with a watermark topic of this test's own, created."""
    config = dataclasses.replace(services, kafka_watermark_topic=unique("watermarks"))
    kafka_connector.create_watermark_topic(config)
    yield config
    delete_watermark_topics(config)


@pytest.fixture
def publisher(watermarks: MillstreamConfig) -> Iterator[KafkaWatermarkTopic]:
    publisher = KafkaWatermarkTopic(watermarks)
    yield publisher
    publisher.close()


@pytest.fixture
def make_reader(watermarks: MillstreamConfig) -> Iterator[Callable[[], KafkaWatermarkTopic]]:
    readers: list[KafkaWatermarkTopic] = []

    def make() -> KafkaWatermarkTopic:
        readers.append(KafkaWatermarkTopic(watermarks, create=False))
        return readers[-1]

    yield make
    for reader in readers:
        reader.close()


def _report(source: str, watermark: int, sequence: int = 1) -> WatermarkReport:
    return WatermarkReport(
        source,
        ("sessions", "sessions.dead-letters"),
        watermark,
        sequence,
        {"sessions": {0: 4, 1: 2}},
        input_watermark=watermark + 1,
        held_by="interval 3",
    )


def test_the_watermark_topic_is_compacted_and_has_one_partition(
    watermarks: MillstreamConfig,
) -> None:
    topic = watermarks.kafka_watermark_topic
    kafka_connector.create_watermark_topic(watermarks)  # again: left as it is
    admin = kafka_connector.admin_client(watermarks)
    resource = ConfigResource(ResourceType.TOPIC, topic)
    entries = admin.describe_configs([resource])[resource].result(timeout=30)
    assert entries["cleanup.policy"].value == "compact"
    assert {name: entries[name].value for name in WATERMARK_TOPIC_CONFIG} == dict(
        WATERMARK_TOPIC_CONFIG
    )
    assert list(admin.list_topics(topic, timeout=30).topics[topic].partitions) == [0]


def test_a_watermark_topic_that_deletes_old_reports_is_refused(
    services: MillstreamConfig, kafka_topic: Callable[..., str]
) -> None:
    deleting = dataclasses.replace(
        services, kafka_watermark_topic=kafka_topic(1, {"cleanup.policy": "delete"})
    )
    with pytest.raises(ConfigError, match=r"cleanup\.policy='delete', not compact"):
        kafka_connector.create_watermark_topic(deleting)
    with pytest.raises(ConfigError, match=r"cleanup\.policy=compact"):
        KafkaWatermarkTopic(deleting)


def test_published_reports_are_read_in_order_each_once(
    publisher: KafkaWatermarkTopic, make_reader: Callable[[], KafkaWatermarkTopic]
) -> None:
    first = _report(computation_source("topo", "sessionize"), 100)
    second = _report(injector_source("clicks"), 200)
    reader = make_reader()
    assert reader.read() == []

    publisher.publish(first)
    publisher.publish(second)
    assert reader.read() == [(first.source, first), (second.source, second)]
    assert reader.read() == []

    third = _report(first.source, 300, sequence=2)
    publisher.publish(third)
    assert reader.read() == [(third.source, third)]
    # A new reader starts from the beginning.
    assert [r for _, r in make_reader().read()] == [first, second, third]


class _ConsumerFailingOnce:
    """A real consumer whose ``fail_at``-th delivered message is lost to a transport error,
    as when the broker goes away in the middle of a read."""

    def __init__(self, consumer: Any, fail_at: int) -> None:
        self._consumer = consumer
        self._fail_at = fail_at
        self._delivered = 0

    def poll(self, timeout: float) -> Any:
        message = self._consumer.poll(timeout)
        if message is not None and message.error() is None:
            self._delivered += 1
            if self._delivered == self._fail_at:
                raise KafkaException(KafkaError(KafkaError._TRANSPORT))
        return message

    def __getattr__(self, name: str) -> Any:
        return getattr(self._consumer, name)


def test_a_read_that_fails_halfway_skips_nothing_and_a_reconnect_repeats_nothing(
    watermarks: MillstreamConfig, publisher: KafkaWatermarkTopic
) -> None:
    reports = [_report(injector_source(f"clicks-{n}"), 100 + n) for n in range(4)]
    for report in reports[:3]:
        publisher.publish(report)

    class FailingReader(KafkaWatermarkTopic):
        def _new_consumer(self) -> Any:
            return _ConsumerFailingOnce(super()._new_consumer(), fail_at=3)

    reader = FailingReader(watermarks)
    try:
        # The first two reports were consumed when the third was lost: the read fails as a
        # whole and the next one starts where it did.
        with pytest.raises(KafkaException):
            reader.read()
        assert [r for _, r in reader.read()] == reports[:3]
        # A new consumer (after an outage) goes on from the last report returned.
        reader.reconnect()
        publisher.publish(reports[3])
        assert [r for _, r in reader.read()] == reports[3:]
        assert reader.read() == []
    finally:
        reader.close()


def test_an_expected_set_is_read_under_its_injector_key_and_can_be_retired(
    publisher: KafkaWatermarkTopic, make_reader: Callable[[], KafkaWatermarkTopic]
) -> None:
    expected = ExpectedSet("clicks", ("clicks",), ("0", "1"))
    report = _report(injector_source("clicks", "1"), 100)
    publisher.declare(expected)
    publisher.publish(report)
    reader = make_reader()
    assert reader.read() == [("injector/clicks", expected), (report.source, report)]

    retired = expected.retire("1")
    publisher.declare(retired)
    publisher.retire(report.source)
    assert reader.read() == [("injector/clicks", retired), (report.source, None)]
    assert reader.skipped == 0


def test_a_report_wakes_the_consumers_of_each_stream_it_names_after_it_is_written(
    watermarks: MillstreamConfig,
    publisher: KafkaWatermarkTopic,
    make_reader: Callable[[], KafkaWatermarkTopic],
) -> None:
    report = _report(injector_source("clicks"), 100)
    publisher.publish(report)
    offsets = kafka_connector.consumer(watermarks, "test")
    try:
        wakes = [kafka_connector.wake_topic(watermarks, s) for s in report.streams]
        assert kafka_connector.end_offsets(offsets, wakes) == {w: {0: 1} for w in wakes}
        # The report was durable before the wake-ups: a woken reader finds it.
        assert make_reader().read() == [(report.source, report)]
        publisher.publish(dataclasses.replace(report, streams=(), sequence=2))
        assert kafka_connector.end_offsets(offsets, wakes) == {w: {0: 1} for w in wakes}
        alarm = kafka_connector.alarm_topic(watermarks, "topo", "count")
        publisher.wake([alarm], "alarm/topo/count")
        assert kafka_connector.end_offsets(offsets, [alarm]) == {alarm: {0: 1}}
    finally:
        offsets.close()


def test_a_report_on_streams_covers_their_current_end_offsets(
    services: MillstreamConfig,
    publisher: KafkaWatermarkTopic,
    make_reader: Callable[[], KafkaWatermarkTopic],
    kafka_topic: Callable[..., str],
) -> None:
    stream = kafka_topic(partitions=2)
    writer = kafka_connector.producer(services)
    for n, partition in enumerate([0, 0, 1, 0, 1]):
        writer.produce(stream, value=f"v{n}".encode(), key=b"k", partition=partition)
    assert writer.flush(30) == 0
    offsets = kafka_connector.consumer(services, "test")
    try:
        assert kafka_connector.end_offsets(offsets, [stream]) == {stream: {0: 3, 1: 2}}
        source = injector_source("clicks")
        sent = publisher.report_streams(offsets, source, [stream], 500, 7)
    finally:
        offsets.close()
    assert sent == WatermarkReport(source, (stream,), 500, 7, {stream: {0: 3, 1: 2}})
    assert make_reader().read() == [(source, sent)]

    # A consumer of the stream applies it only once it read every record it covers.
    watermark = InputWatermark({stream: stream_topic(stream)})
    watermark.offer(sent)
    reader = kafka_connector.consumer(services, "test")
    reader.subscribe([stream])
    consumed: dict[int, int] = {}
    seen: list[int] = []
    deadline = time.monotonic() + 30
    try:
        while len(seen) < 5 and time.monotonic() < deadline:
            message = reader.poll(0.5)
            if message is None:
                continue
            assert message.error() is None, message.error()
            at, offset = message.partition(), message.offset()
            assert at is not None
            assert offset is not None
            consumed[at] = offset + 1
            seen.append(watermark.advance({stream: consumed}))
    finally:
        reader.close()
    assert seen == [MIN_EVENT_TIME] * 4 + [500]


def test_a_malformed_message_is_skipped_and_counted(
    watermarks: MillstreamConfig,
    publisher: KafkaWatermarkTopic,
    make_reader: Callable[[], KafkaWatermarkTopic],
) -> None:
    topic = watermarks.kafka_watermark_topic
    good = _report(injector_source("clicks"), 100)
    future = json.loads(good.encode()) | {"version": 99}
    raw = kafka_connector.producer(watermarks)
    raw.produce(topic, key=b"garbage", value=b"\x00 not a report")
    raw.produce(topic, key=b"future", value=json.dumps(future).encode())
    assert raw.flush(30) == 0
    publisher.publish(good)

    reader = make_reader()
    assert reader.read() == [(good.source, good)]
    assert reader.skipped == 2


def test_a_retired_source_reads_as_none(
    publisher: KafkaWatermarkTopic, make_reader: Callable[[], KafkaWatermarkTopic]
) -> None:
    report = _report(injector_source("clicks", "3"), 100)
    publisher.publish(report)
    publisher.retire(report.source)
    assert make_reader().read() == [(report.source, report), (report.source, None)]
