"""Transactional productions on the real broker: markers, fencing, and what a plain
``read_committed`` consumer reads (confluent-kafka only, no millstream decoding)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition

from millstream.connectors.kafka import (
    KafkaProductionSink,
    KafkaTransactionalSink,
    create_transaction_marker_topic,
    delete_transaction_markers,
    store_namespace,
    stream_topic,
    transaction_marker_topic,
)
from millstream.connectors.kafka.clients import producer
from millstream.connectors.kafka.transactions import transactional_id
from millstream.engine.clock import ManualClock
from millstream.engine.computation import Computation
from millstream.engine.config import MillstreamConfig
from millstream.engine.context import Context
from millstream.engine.productions import (
    CommitTag,
    DeliveryOutcome,
    Production,
    TransactionalSink,
)
from millstream.engine.protocol import Delivery, IntervalWorker
from millstream.engine.records import Record, decode_record, encode_record, injector_record_id
from millstream.engine.stores.cassandra import (
    DEFAULT_TABLE,
    CassandraIntervalStore,
    create_schema,
)
from millstream.engine.topology import ComputationOptions, ComputationSpec, InputStream

if TYPE_CHECKING:
    from cassandra.cluster import Session

pytestmark = pytest.mark.integration

TIMEOUT = 30.0


@pytest.fixture
def config(services: MillstreamConfig) -> MillstreamConfig:
    create_transaction_marker_topic(services)
    return services


@pytest.fixture
def namespace(config: MillstreamConfig, unique: Callable[[str], str]) -> Iterator[str]:
    keyspace = unique("ks")
    yield keyspace + ".table"
    delete_transaction_markers(config, keyspace)


@pytest.fixture
def sinks(
    config: MillstreamConfig, namespace: str
) -> Iterator[Callable[[], KafkaTransactionalSink]]:
    """Factory: each sink stands for one process's producers."""
    made: list[KafkaTransactionalSink] = []

    def make() -> KafkaTransactionalSink:
        made.append(KafkaTransactionalSink(config, namespace))
        return made[-1]

    yield make
    for sink in made:
        sink.close()


def productions(topic: str, *values: bytes) -> list[Production]:
    out = []
    for number, value in enumerate(values):
        record = Record("k", value, 1, injector_record_id("test", 0, number))
        out.append(Production(topic, record, encode_record(record)))
    return out


def read_committed(config: MillstreamConfig, topic: str) -> list[bytes]:
    """Every value a plain read_committed consumer reads from the topic's one partition, up
    to its end offset (which the last transaction's commit marker occupies)."""
    reader = Consumer(
        {
            "bootstrap.servers": config.kafka_bootstrap,
            "group.id": f"plain-{time.monotonic_ns()}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "enable.partition.eof": True,
        }
    )
    try:
        reader.assign([TopicPartition(topic, 0, 0)])
        values: list[bytes] = []
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            message = reader.poll(0.5)
            if message is None:
                continue
            error = message.error()
            if error is not None:
                assert error.code() == KafkaError._PARTITION_EOF, error
                return values
            value = message.value()
            assert value is not None
            values.append(value)
        raise AssertionError(f"{topic} not read to its end in {TIMEOUT} s")
    finally:
        reader.close()


def test_a_transaction_delivers_its_productions_and_records_its_marker(
    config: MillstreamConfig,
    sinks: Callable[[], KafkaTransactionalSink],
    kafka_topic: Callable[..., str],
) -> None:
    topic = kafka_topic()
    sink = sinks()
    assert sink.open("comp", 3, TIMEOUT) is None
    sent = productions(topic, b"a", b"b")
    outcome = sink.deliver("comp", 3, sent, CommitTag(7, 1), TIMEOUT)

    assert outcome is DeliveryOutcome.COMMITTED
    assert read_committed(config, stream_topic(topic)) == [p.envelope for p in sent]
    # Another process opening the interval reads the marker back.
    assert sinks().open("comp", 3, TIMEOUT) == CommitTag(7, 1)
    assert sinks().open("comp", 4, TIMEOUT) is None  # markers are per interval


def test_a_commit_settles_once_its_marker_reads_back_as_committed(
    config: MillstreamConfig,
    namespace: str,
    sinks: Callable[[], KafkaTransactionalSink],
    kafka_topic: Callable[..., str],
    unique: Callable[[str], str],
) -> None:
    topic = kafka_topic()
    sink = sinks()
    sink.open("comp", 0, TIMEOUT)
    assert sink.deliver("comp", 0, productions(topic, b"a"), CommitTag(7, 1), TIMEOUT) is (
        DeliveryOutcome.COMMITTED
    )
    # Read back at once: the coordinator's markers may land a few milliseconds later.
    assert sink.settled("comp", 0, CommitTag(7, 1), TIMEOUT)
    assert not sink.settled("comp", 0, CommitTag(7, 2), TIMEOUT)  # a later commit's: undone

    # A transaction holding the marker pending (another producer's offsets for the
    # interval's group): not readable as committed while it lasts.
    name = transactional_id(namespace, "comp", 0)
    holder = producer(config, **{"transactional.id": unique("holder")})
    holder.init_transactions(TIMEOUT)
    holder.begin_transaction()
    group = Consumer({"bootstrap.servers": config.kafka_bootstrap, "group.id": name})
    marker = TopicPartition(transaction_marker_topic(config), 0, 9, metadata="held")
    holder.send_offsets_to_transaction([marker], group.consumer_group_metadata(), TIMEOUT)
    group.close()
    started = time.monotonic()
    assert not sink.settled("comp", 0, CommitTag(7, 1), 2.0)
    # Asked again until its timeout (short of the last pause, at most 0.1 s).
    assert 1.8 <= time.monotonic() - started < 10.0
    holder.abort_transaction(TIMEOUT)
    assert sink.settled("comp", 0, CommitTag(7, 1), TIMEOUT)


def test_a_keyspaces_markers_are_deleted_with_it_and_no_other(
    config: MillstreamConfig,
    namespace: str,
    sinks: Callable[[], KafkaTransactionalSink],
    unique: Callable[[str], str],
    kafka_topic: Callable[..., str],
) -> None:
    topic = kafka_topic()
    other_keyspace = unique("other")
    other_namespace = f"{other_keyspace}.table"
    other = KafkaTransactionalSink(config, other_namespace)
    try:
        ours = sinks()
        delivered = [(ours, 0), (ours, 5), (other, 0)]
        for sink, interval in delivered:
            assert sink.open("comp", interval, TIMEOUT) is None
            outcome = sink.deliver(
                "comp", interval, productions(topic, b"a"), CommitTag(1, 1), TIMEOUT
            )
            assert outcome is DeliveryOutcome.COMMITTED
        assert delete_transaction_markers(config, namespace.split(".")[0]) == [
            transactional_id(namespace, "comp", 0),
            transactional_id(namespace, "comp", 5),
        ]
        assert sinks().open("comp", 0, TIMEOUT) is None
        assert other.open("comp", 0, TIMEOUT) == CommitTag(1, 1)
    finally:
        other.close()
        delete_transaction_markers(config, other_keyspace)


def test_a_new_owners_open_fences_the_old_producer(
    config: MillstreamConfig,
    sinks: Callable[[], KafkaTransactionalSink],
    kafka_topic: Callable[..., str],
) -> None:
    topic = kafka_topic()
    old, new = sinks(), sinks()
    old.open("comp", 0, TIMEOUT)
    new.open("comp", 0, TIMEOUT)

    outcome = old.deliver("comp", 0, productions(topic, b"zombie"), CommitTag(1, 1), TIMEOUT)
    assert outcome is DeliveryOutcome.FENCED
    assert new.deliver("comp", 0, productions(topic, b"new"), CommitTag(2, 1), TIMEOUT) is (
        DeliveryOutcome.COMMITTED
    )
    assert [decode_record(v).value for v in read_committed(config, topic)] == [b"new"]


def test_a_prepared_open_fences_as_it_runs_and_the_open_takes_it(
    config: MillstreamConfig,
    sinks: Callable[[], KafkaTransactionalSink],
    kafka_topic: Callable[..., str],
) -> None:
    """prepare opens in the background: the old producer is fenced before open is called,
    and open returns the marker the background open read."""
    topic = kafka_topic()
    old, new = sinks(), sinks()
    old.open("comp", 0, TIMEOUT)
    assert old.deliver("comp", 0, productions(topic, b"old"), CommitTag(1, 1), TIMEOUT) is (
        DeliveryOutcome.COMMITTED
    )
    new.prepare("comp", 0, TIMEOUT, 5)
    new.prepare("comp", 0, TIMEOUT, 5)  # one under way for this lease: nothing more
    # The old producer's (empty) transactions commit until the background open fences it.
    deadline = time.monotonic() + TIMEOUT
    outcome = DeliveryOutcome.COMMITTED
    while outcome is DeliveryOutcome.COMMITTED and time.monotonic() < deadline:
        time.sleep(0.05)
        outcome = old.deliver("comp", 0, [], CommitTag(1, 1), TIMEOUT)
    # Fenced; or, when its EndTxn met the new producer's InitProducerId at the coordinator,
    # "Unknown broker error": an unknown outcome, resolved by a reopen like any other.
    assert outcome in (DeliveryOutcome.FENCED, DeliveryOutcome.UNKNOWN)

    # Ready once the background open has read the marker too; never for another lease.
    while not new.ready("comp", 0, 5) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert new.ready("comp", 0, 5)
    assert not new.ready("comp", 0, 6)
    assert not new.ready("comp", 1, 5)
    assert new.open("comp", 0, TIMEOUT, 5) == CommitTag(1, 1)
    assert not new.ready("comp", 0, 5)  # taken
    assert new.deliver("comp", 0, productions(topic, b"new"), CommitTag(2, 1), TIMEOUT) is (
        DeliveryOutcome.COMMITTED
    )
    assert [decode_record(v).value for v in read_committed(config, topic)] == [b"old", b"new"]


def test_an_open_prepared_for_an_earlier_lease_is_not_taken(
    config: MillstreamConfig,
    sinks: Callable[[], KafkaTransactionalSink],
    kafka_topic: Callable[..., str],
) -> None:
    """A worker prepared an open in a batch that delivered nothing; another worker opened
    the producer since (fencing it). Its next lease prepares and opens afresh."""
    topic = kafka_topic()
    first, other = sinks(), sinks()
    first.prepare("comp", 0, TIMEOUT, 1)
    # The background open finishes (before the other worker's), and is never taken.
    first._opening["comp", 0].future.result(TIMEOUT)
    other.open("comp", 0, TIMEOUT)
    assert other.deliver("comp", 0, productions(topic, b"other"), CommitTag(2, 1), TIMEOUT) is (
        DeliveryOutcome.COMMITTED
    )

    first.prepare("comp", 0, TIMEOUT, 3)
    assert first.open("comp", 0, TIMEOUT, 3) == CommitTag(2, 1)
    assert first.deliver("comp", 0, productions(topic, b"first"), CommitTag(3, 1), TIMEOUT) is (
        DeliveryOutcome.COMMITTED
    )
    assert [decode_record(v).value for v in read_committed(config, topic)] == [b"other", b"first"]


def test_a_staged_transaction_is_read_once_committed_and_never_once_aborted(
    config: MillstreamConfig,
    sinks: Callable[[], KafkaTransactionalSink],
    kafka_topic: Callable[..., str],
) -> None:
    topic = kafka_topic()
    sink = sinks()
    sink.open("comp", 0, TIMEOUT)
    aborted = sink.stage("comp", 0, productions(topic, b"aborted"), CommitTag(1, 1), TIMEOUT)
    assert aborted is not None
    aborted.abort()  # the store commit it waited for failed
    # The producer stays usable: the next staging commits, marker and all.
    staged = sink.stage("comp", 0, productions(topic, b"staged"), CommitTag(1, 2), TIMEOUT)
    assert staged is not None
    assert staged.commit() is DeliveryOutcome.COMMITTED

    assert [decode_record(v).value for v in read_committed(config, topic)] == [b"staged"]
    assert sinks().open("comp", 0, TIMEOUT) == CommitTag(1, 2)
    assert sinks().stage("comp", 1, [], CommitTag(1, 1), TIMEOUT) is None  # not open there


def test_a_staged_transaction_fenced_before_its_commit_delivers_nothing(
    config: MillstreamConfig,
    sinks: Callable[[], KafkaTransactionalSink],
    kafka_topic: Callable[..., str],
) -> None:
    topic = kafka_topic()
    old, new = sinks(), sinks()
    old.open("comp", 0, TIMEOUT)
    staged = old.stage("comp", 0, productions(topic, b"zombie"), CommitTag(1, 1), TIMEOUT)
    assert staged is not None
    # A new owner opens while the old one's store commit runs: it aborts the staged
    # transaction (or waits for its staging to end and then aborts it).
    assert new.open("comp", 0, TIMEOUT) is None
    assert staged.commit() in (DeliveryOutcome.FENCED, DeliveryOutcome.UNKNOWN)
    assert new.deliver("comp", 0, productions(topic, b"new"), CommitTag(2, 1), TIMEOUT) is (
        DeliveryOutcome.COMMITTED
    )
    assert [decode_record(v).value for v in read_committed(config, topic)] == [b"new"]


def test_an_open_transaction_of_a_dead_owner_is_aborted_by_the_next_open(
    config: MillstreamConfig,
    namespace: str,
    sinks: Callable[[], KafkaTransactionalSink],
    kafka_topic: Callable[..., str],
) -> None:
    topic = kafka_topic()
    first = sinks()
    first.open("comp", 0, TIMEOUT)
    first.deliver("comp", 0, productions(topic, b"delivered"), CommitTag(1, 1), TIMEOUT)

    # A dead owner: its transaction was left open with productions and a newer marker.
    dead = producer(config, **{"transactional.id": transactional_id(namespace, "comp", 0)})
    dead.init_transactions(TIMEOUT)
    dead.begin_transaction()
    dead.produce(topic, key=b"k", value=b"never-visible")
    dead.flush(TIMEOUT)

    started = time.monotonic()
    assert sinks().open("comp", 0, TIMEOUT) == CommitTag(1, 1)
    assert time.monotonic() - started < config.kafka_transaction_timeout
    values = read_committed(config, topic)
    assert b"never-visible" not in values
    assert len(values) == 1
    del dead


class Counting(Computation):
    def __init__(self, stream: str) -> None:
        self.stream = stream

    def process_record(self, ctx: Context, record: Record) -> None:
        count = int(ctx.get_state() or b"0") + 1
        ctx.set_state(str(count).encode())
        ctx.produce(self.stream, f"{ctx.key}={count}".encode(), record.timestamp)


def counting_spec(output: str) -> ComputationSpec:
    """A computation of one interval counting each key's records onto ``output``."""
    return ComputationSpec(
        "counter",
        Counting(output),
        (InputStream("in"),),
        (output,),
        ComputationOptions(key_intervals=1),
    )


def numbered(keys: Sequence[str]) -> list[Delivery]:
    """A delivery per key, each record with an ID of its own."""
    return [
        Delivery(k, Record(k, b"", 1, injector_record_id("t", 0, n))) for n, k in enumerate(keys)
    ]


class UnstagedSink:
    """A Kafka sink that never stages: the worker opens and delivers after its store commit,
    through :meth:`deliver`, which subclasses make go wrong."""

    def __init__(self, inner: KafkaTransactionalSink) -> None:
        self.inner = inner

    def prepare(self, computation: str, interval: int, timeout: float, token: int) -> None:
        self.inner.prepare(computation, interval, timeout, token)

    def open(
        self, computation: str, interval: int, timeout: float, token: int | None = None
    ) -> CommitTag | None:
        return self.inner.open(computation, interval, timeout, token)

    def ready(self, computation: str, interval: int, token: int) -> bool:
        return False  # so the open comes after the store commit too

    def settled(self, computation: str, interval: int, marker: CommitTag, timeout: float) -> bool:
        return self.inner.settled(computation, interval, marker, timeout)

    def deliver(
        self,
        computation: str,
        interval: int,
        productions: Sequence[Production],
        marker: CommitTag,
        timeout: float,
    ) -> DeliveryOutcome:
        return self.inner.deliver(computation, interval, productions, marker, timeout)

    def stage(
        self,
        computation: str,
        interval: int,
        productions: Sequence[Production],
        marker: CommitTag,
        timeout: float,
    ) -> None:
        return None


class DyingSink(UnstagedSink):
    """Passes the transaction through to Kafka, or not, then the process dies."""

    def __init__(self, inner: KafkaTransactionalSink, commit_first: bool) -> None:
        super().__init__(inner)
        self.commit_first = commit_first

    def deliver(
        self,
        computation: str,
        interval: int,
        productions: Sequence[Production],
        marker: CommitTag,
        timeout: float,
    ) -> DeliveryOutcome:
        if self.commit_first:
            assert self.inner.deliver(computation, interval, productions, marker, timeout) is (
                DeliveryOutcome.COMMITTED
            )
        raise RuntimeError("worker process killed around the Kafka commit")


class UndoingSink(UnstagedSink):
    """Kafka answers the first commit, then aborts the transaction after all, as the sweep of
    hanging transactions does to one whose markers a restarted broker skipped."""

    def __init__(self, inner: KafkaTransactionalSink) -> None:
        super().__init__(inner)
        self.undone = 0

    def deliver(
        self,
        computation: str,
        interval: int,
        productions: Sequence[Production],
        marker: CommitTag,
        timeout: float,
    ) -> DeliveryOutcome:
        if self.undone:
            return self.inner.deliver(computation, interval, productions, marker, timeout)
        self.undone += 1
        staged = self.inner.stage(computation, interval, productions, marker, timeout)
        assert staged is not None
        staged.abort()
        return DeliveryOutcome.COMMITTED


def test_productions_of_a_commit_kafka_answered_then_undid_are_sent_again_once(
    config: MillstreamConfig,
    namespace: str,
    cassandra: Session,
    cassandra_keyspace: Callable[[], str],
    kafka_topic: Callable[..., str],
) -> None:
    """Cassandra store, Kafka transactions: the answered commit does not settle, so its
    productions stay pending (their rows kept) and the next batch sends them again."""
    keyspace = cassandra_keyspace()
    create_schema(cassandra, keyspace)
    output = kafka_topic()
    spec = counting_spec(output)
    keys = ["a", "b", "a"]
    deliveries = numbered(keys)
    clock = ManualClock(2_000_000)
    sink = UndoingSink(KafkaTransactionalSink(config, namespace))
    store = CassandraIntervalStore(cassandra, keyspace, clock)
    worker = IntervalWorker(
        spec, 0, store=store, sink=KafkaProductionSink(config), clock=clock, transactions=sink
    )
    first = worker.process(deliveries, 0)
    assert (first.unsettled_commits, first.pending, first.transactions) == (1, 3, 0)
    assert read_committed(config, output) == []

    after = worker.process([], 0)
    sink.inner.close()
    assert (after.resent, after.marker_resolved, after.pending) == (3, 0, 0)
    values = read_committed(config, output)
    assert sorted(decode_record(v).value for v in values) == [b"a=1", b"a=2", b"b=1"]


@pytest.mark.parametrize(
    "commit_first", [False, True], ids=["killed-before-kafka-commit", "killed-after-kafka-commit"]
)
def test_a_plain_reader_reads_each_production_once_across_a_crash_around_the_kafka_commit(
    config: MillstreamConfig,
    namespace: str,
    cassandra: Session,
    cassandra_keyspace: Callable[[], str],
    kafka_topic: Callable[..., str],
    commit_first: bool,
) -> None:
    """Cassandra store, Kafka transactions, two processes: the new owner resolves the crashed
    one's pending productions by the marker (sent again only if the crash came first)."""
    keyspace = cassandra_keyspace()
    create_schema(cassandra, keyspace)
    output = kafka_topic()
    spec = counting_spec(output)
    keys = ["a", "b", "a", "c", "a", "b"]
    deliveries = numbered(keys)
    clock = ManualClock(2_000_000)

    def worker(transactions: TransactionalSink) -> IntervalWorker:
        store = CassandraIntervalStore(cassandra, keyspace, clock)
        kafka = KafkaProductionSink(config)
        return IntervalWorker(
            spec, 0, store=store, sink=kafka, clock=clock, transactions=transactions
        )

    doomed = worker(DyingSink(KafkaTransactionalSink(config, namespace), commit_first))
    with pytest.raises(RuntimeError, match="killed"):
        doomed.process(deliveries, 0)

    successor = KafkaTransactionalSink(config, namespace)
    result = worker(successor).process(deliveries, 0)
    successor.close()
    assert (result.processed, result.duplicates, result.pending) == (0, len(keys), 0)
    assert result.marker_resolved == (len(keys) if commit_first else 0)
    assert result.transactions == (0 if commit_first else 1)

    values = read_committed(config, output)
    counts = Counter(values)
    assert set(counts.values()) == {1}, "a plain read_committed reader read a copy"
    assert sorted(decode_record(v).value for v in values) == sorted(
        [b"a=1", b"a=2", b"a=3", b"b=1", b"b=2", b"c=1"]
    )


def test_a_table_dropped_and_created_again_gets_markers_of_its_own(
    config: MillstreamConfig,
    cassandra: Session,
    cassandra_keyspace: Callable[[], str],
    kafka_topic: Callable[..., str],
) -> None:
    """State reset by hand: the new table's sequencers start over, so the old marker (kept
    by Kafka for days) would cover its first commits' tags; the table ID keeps them apart."""
    keyspace = cassandra_keyspace()
    create_schema(cassandra, keyspace)
    store = CassandraIntervalStore(cassandra, keyspace, ManualClock(0))
    old = store_namespace(keyspace, DEFAULT_TABLE, store.table_id)
    sink = KafkaTransactionalSink(config, old)
    try:
        assert sink.open("comp", 0, TIMEOUT) is None
        outcome = sink.deliver(
            "comp", 0, productions(kafka_topic(), b"a"), CommitTag(57, 3), TIMEOUT
        )
        assert outcome is DeliveryOutcome.COMMITTED
        assert KafkaTransactionalSink(config, old).open("comp", 0, TIMEOUT) == CommitTag(57, 3)
    finally:
        sink.close()

    cassandra.execute(f"DROP TABLE {keyspace}.{DEFAULT_TABLE}")
    create_schema(cassandra, keyspace)
    again = CassandraIntervalStore(cassandra, keyspace, ManualClock(0))
    new = store_namespace(keyspace, DEFAULT_TABLE, again.table_id)
    assert new != old
    assert new.startswith(f"{keyspace}.{DEFAULT_TABLE}.")
    fresh = KafkaTransactionalSink(config, new)
    try:
        assert fresh.open("comp", 0, TIMEOUT) is None  # the new commit (1, 1) is not covered
    finally:
        fresh.close()
