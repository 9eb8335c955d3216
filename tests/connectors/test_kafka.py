"""The Kafka production sink on the real broker, and strong productions end to end.

The last tests run the per-key protocol on the real Cassandra store with the real Kafka sink,
crash a worker between its commit and the acknowledgement of its productions, and check that
the new owner resends them and a downstream consumer that deduplicates by record ID sees each
effect exactly once.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Sequence, Set
from typing import TYPE_CHECKING

import pytest

from millstream.connectors import kafka as kafka_connector
from millstream.connectors.kafka import KafkaProductionSink, stream_topic
from millstream.engine.clock import ManualClock
from millstream.engine.computation import Computation
from millstream.engine.config import MillstreamConfig
from millstream.engine.context import Context
from millstream.engine.productions import Production
from millstream.engine.protocol import Delivery, IntervalWorker
from millstream.engine.records import Record, decode_record, injector_record_id
from millstream.engine.stores.cassandra import CassandraIntervalStore, create_schema
from millstream.engine.topology import ComputationOptions, ComputationSpec, InputStream

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
    spec = ComputationSpec(
        "counter",
        CountAndEmit(output),
        (InputStream("searches"),),
        (output,),
        ComputationOptions(key_intervals=1),
    )
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
