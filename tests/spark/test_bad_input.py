"""No message stops a stream: every kind of message Kafka can carry, on the real stack.

A keyed count with the defaults (exactly-once, strong productions) reads a shuffled mix of
good records and bad messages of every kind, written by producers of every compression type,
with and without keys and headers, beside a committed and an aborted transaction of other
producers. Every good record is counted and answered once, every bad message becomes one
dead letter naming its error and its position, the aborted transaction is neither processed
nor dead-lettered, no batch fails, and the watermark stays sane. A second test runs a
computation that takes tombstones as deletions.
"""

from __future__ import annotations

import random
import struct
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from confluent_kafka import KafkaError, TopicPartition
from confluent_kafka import Message as KafkaMessage

from millstream.connectors import kafka as kafka_connector
from millstream.engine.codecs import JsonCodec
from millstream.engine.computation import Computation
from millstream.engine.config import MillstreamConfig
from millstream.engine.context import Context
from millstream.engine.deadletters import DeadLetter, decode_dead_letter
from millstream.engine.records import (
    MAX_EVENT_TIME,
    MAX_RECORD_BYTES,
    SINGLE_OBJECT_MARKER,
    Deletion,
    Record,
    decode_record,
    encode_record,
    injector_record_id,
)
from millstream.engine.topology import ComputationOptions, Topology
from millstream.engine.watermarks import injector_source
from millstream.spark.runner import AvailableNow, RunningTopology, run_topology

if TYPE_CHECKING:
    from cassandra.cluster import Session
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.integration

JSON = JsonCodec()
INTERVALS = 4
BASE_TIME = 1_700_000_000_000_000
COMPRESSIONS = ("none", "gzip", "snappy", "lz4", "zstd")
# Over the engine's limit, within the topic's (max.message.bytes below) and the producers'.
TOPIC_MAX_BYTES = 2_000_000


class CountAndAnswer(Computation):
    """Counts records per key, answers each with its record ID on ``answers``, and refuses
    (raises on) values starting with ``fail``."""

    def __init__(self, answers: str) -> None:
        self.answers = answers

    def process_record(self, ctx: Context, record: Record) -> None:
        if record.value.startswith(b"fail"):
            raise ValueError(f"refusing {record.value!r}")
        count = ctx.state(JSON)
        count.set(count.get(0) + 1)
        ctx.produce(self.answers, record.record_id, record.timestamp)


class Registry(CountAndAnswer):
    """A count per key that a tombstone of the key deletes, answering ``deleted``."""

    def process_deletion(self, ctx: Context, deletion: Deletion) -> None:
        ctx.clear_state()
        ctx.produce(self.answers, b"deleted " + deletion.record_id, deletion.timestamp)


@dataclass
class Names:
    """One test's stream, computation, keyspace and checkpoint root."""

    suffix: str
    keyspace: str
    checkpoints: Path

    @property
    def stream(self) -> str:
        return f"mixed_{self.suffix}"

    @property
    def computation(self) -> str:
        return f"count_{self.suffix}"

    @property
    def answers(self) -> str:
        return f"answers_{self.suffix}"

    @property
    def dead_letters(self) -> str:
        return f"{self.computation}.dead-letters"


@pytest.fixture
def names(
    services: MillstreamConfig,
    unique: Callable[[str], str],
    cassandra_keyspace: Callable[[], str],
    tmp_path: Path,
    spark: SparkSession,
) -> Iterator[Names]:
    made = Names(unique("b").removeprefix("b_"), cassandra_keyspace(), tmp_path / "checkpoints")
    kafka_connector.create_topics(
        services,
        [made.stream],
        partitions=2,
        topic_config={"max.message.bytes": str(TOPIC_MAX_BYTES)},
    )
    yield made
    kafka_connector.delete_topics(services, [made.stream, made.answers, made.dead_letters])


@dataclass
class Message:
    """A message to produce, and what should become of it: ``good`` (counted and answered),
    an error type (one dead letter), or ``aborted`` (nothing)."""

    value: bytes | None
    key: bytes | None
    expect: str
    record: Record | None = None
    headers: list[tuple[str, bytes | None]] | None = None
    compression: str = "none"
    position: tuple[int, int] | None = None  # (partition, offset), once delivered


@dataclass
class Producers:
    """A producer per compression type, and the positions their messages landed at."""

    config: MillstreamConfig
    topic: str
    by_compression: dict[str, Any] = field(default_factory=dict)

    def produce(self, messages: list[Message], transactional: str | None = None) -> None:
        """Produce ``messages``; in one transaction of ``transactional`` (``"commit"`` or
        ``"abort"``) if given."""
        pending = len(messages)

        def delivered(message: Message, error: KafkaError | None, sent: KafkaMessage) -> None:
            nonlocal pending
            assert error is None, error
            message.position = (sent.partition() or 0, sent.offset() or 0)
            pending -= 1

        if transactional is not None:
            producer = kafka_connector.producer(
                self.config,
                **{"transactional.id": f"test-{self.topic}-{transactional}"},
            )
            producer.init_transactions(30)
            producer.begin_transaction()
        for message in messages:
            if transactional is None:
                producer = self._producer(message.compression)
            kwargs: dict[str, Any] = {"key": message.key, "value": message.value}
            if message.headers is not None:
                kwargs["headers"] = message.headers
            producer.produce(
                self.topic,
                on_delivery=partial(delivered, message),
                **kwargs,
            )
            producer.poll(0)
        if transactional is None:
            for each in self.by_compression.values():
                assert each.flush(30) == 0
        else:
            assert producer.flush(30) == 0
            if transactional == "commit":
                producer.commit_transaction(30)
            else:
                producer.abort_transaction(30)
        assert pending == 0

    def _producer(self, compression: str) -> Any:
        if compression not in self.by_compression:
            settings: dict[str, str | int | bool] = {
                "compression.type": compression,
                "message.max.bytes": TOPIC_MAX_BYTES,
            }
            self.by_compression[compression] = kafka_connector.producer(self.config, **settings)
        return self.by_compression[compression]


def good_records(count: int, users: int = 23) -> list[Record]:
    return [
        Record(
            f"user-{n % users}",
            f"good-{n}".encode(),
            BASE_TIME + n,
            injector_record_id("mixed", 0, n),
        )
        for n in range(count)
    ]


def bad_messages(rng: random.Random) -> list[Message]:
    """Every kind of bad message, each with the error its dead letter must name."""
    sample = Record("user-1", b"sample", BASE_TIME, injector_record_id("bad", 0, 0))
    envelope = encode_record(sample)
    bad: list[Message] = []
    for n in range(5):
        bad.append(Message(None, f"user-{n}".encode(), "TombstoneError"))
    for _ in range(3):
        bad.append(Message(None, None, "TombstoneError"))
    bad.append(Message(b"", b"user-2", "MalformedRecordError"))  # empty, not a tombstone
    for _ in range(4):
        garbage = rng.randbytes(rng.randrange(1, 80))
        bad.append(Message(garbage, rng.choice([None, b"user-3"]), "MalformedRecordError"))
    for length in (1, 5, 10, 20, len(envelope) - 1):
        bad.append(Message(envelope[:length], b"user-4", "MalformedRecordError"))
    for index in (0, 1):  # the marker
        mutated = bytearray(envelope)
        mutated[index] ^= 0xFF
        bad.append(Message(bytes(mutated), b"user-5", "MalformedRecordError"))
    bad.append(Message(envelope + b"\0", b"user-5", "MalformedRecordError"))  # trailing
    for index in (2, 9):  # the writer schema's fingerprint
        mutated = bytearray(envelope)
        mutated[index] ^= 0x01
        bad.append(Message(bytes(mutated), b"user-6", "UnknownSchemaError"))
    for _ in range(3):
        unknown = SINGLE_OBJECT_MARKER + struct.pack("<Q", rng.getrandbits(64)) + b"\2body"
        bad.append(Message(unknown, b"user-6", "UnknownSchemaError"))
    for n in range(2):
        big = Record("user-7", b"x" * MAX_RECORD_BYTES, BASE_TIME, injector_record_id("big", 0, n))
        bad.append(Message(encode_record(big), b"user-7", "OversizedRecordError"))
    for n, timestamp in enumerate((2**62, -1, MAX_EVENT_TIME + 1)):
        absurd = Record("user-8", b"absurd", timestamp, injector_record_id("absurd", 0, n))
        bad.append(Message(encode_record(absurd), b"user-8", "AbsurdTimestampError", absurd))
    for n in range(5):
        failing = Record(f"user-{n}", b"fail", BASE_TIME + n, injector_record_id("fail", 0, n))
        bad.append(Message(encode_record(failing), b"user-9", "ValueError", failing))
    return bad


def shuffled_mix(good: list[Record], rng: random.Random) -> list[Message]:
    """The good records (some without a Kafka key, some with headers, one a None-valued one)
    and the bad messages, shuffled, each given a producer's compression type."""
    messages = [
        Message(
            encode_record(record),
            None if n % 7 == 0 else record.key.encode(),
            "good",
            record,
            headers=[("trace", b"t-%d" % n), ("empty", None)] if n % 5 == 0 else None,
        )
        for n, record in enumerate(good)
    ]
    messages += bad_messages(rng)
    rng.shuffle(messages)
    for message in messages:
        message.compression = rng.choice(COMPRESSIONS)
    return messages


def read_topic(config: MillstreamConfig, topic: str) -> list[Record]:
    """Every message of ``topic`` decoded, read committed, to the end of each partition."""
    consumer = kafka_connector.consumer(config, "test-reader", **{"enable.partition.eof": True})
    try:
        partitions = kafka_connector.end_offsets(consumer, [topic])[topic]
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        found: list[Record] = []
        ended: set[int] = set()
        deadline = time.monotonic() + 30
        while len(ended) < len(partitions):
            assert time.monotonic() < deadline, f"{topic} not read to its end in 30 s"
            message = consumer.poll(1.0)
            if message is None:
                continue
            error = message.error()
            if error is not None and error.code() == KafkaError._PARTITION_EOF:
                ended.add(message.partition() or 0)
                continue
            assert error is None, error
            value = message.value()
            assert value is not None
            found.append(decode_record(value))
        return found
    finally:
        consumer.close()


def by_record_id(records: list[Record]) -> dict[bytes, Record]:
    """What a consumer deduplicating by record ID sees (resends are copies)."""
    return {record.record_id: record for record in records}


def states(session: Session, keyspace: str, computation: str) -> dict[str, Any]:
    """Committed state per key of ``computation``, from every interval."""
    found: dict[str, Any] = {}
    for interval in range(INTERVALS):
        rows = session.execute(
            f"SELECT key, value FROM {keyspace}.intervals "
            "WHERE computation = %s AND interval = %s AND kind = 'state'",
            (computation, interval),
        )
        found.update((row.key, JSON.decode(row.value)) for row in rows)
    return found


def start(
    names: Names, config: MillstreamConfig, spark: SparkSession, topology: Topology
) -> RunningTopology:
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # type: ignore[no-untyped-call]
    run = replace(
        config.run,
        keyspace=names.keyspace,
        checkpoint_root=names.checkpoints,
        create_keyspace=False,
    )
    return run_topology(topology, config, run, trigger=AvailableNow(), spark=spark)


def report_watermark(config: MillstreamConfig, names: Names, watermark: int) -> None:
    """Report the stream's low watermark as its injector would, covering all it holds."""
    publisher = kafka_connector.KafkaWatermarkTopic(config)
    reader = kafka_connector.consumer(config, "test-offsets")
    try:
        publisher.report_streams(
            reader, injector_source(f"test-{names.suffix}"), [names.stream], watermark, 1
        )
    finally:
        reader.close()
        publisher.close()


def assert_sane_watermarks(running: RunningTopology, computation: str, reported: int) -> None:
    """The watermark never went back, nor past what the input's source reported."""
    batches = running.batches(computation)
    assert batches
    marks = [batch.watermark for batch in batches]
    assert marks == sorted(marks)
    assert marks[-1] == reported  # nothing pending: the watermark is the input's
    assert running.input_watermark(computation) == reported
    assert all(batch.failed_attempts == () for batch in batches)


def test_every_message_is_processed_or_dead_lettered_and_none_stops_the_stream(
    services: MillstreamConfig, spark: SparkSession, cassandra: Session, names: Names
) -> None:
    rng = random.Random(27)
    good = good_records(1_000)
    in_transaction = good[-20:]  # a committed transaction of another producer
    messages = shuffled_mix(good[:-20], rng)
    half = len(messages) // 2
    aborted = [
        Message(encode_record(r), r.key.encode(), "aborted", r)
        for r in (
            Record(f"aborted-{n}", b"aborted", BASE_TIME + n, injector_record_id("abort", 0, n))
            for n in range(10)
        )
    ]
    committed = [Message(encode_record(r), r.key.encode(), "good", r) for r in in_transaction]
    producers = Producers(services, names.stream)
    # Transaction markers take offsets in the middle of the partitions and at their ends,
    # where a batch read committed ends (SPARK-25005).
    producers.produce(messages[:half])
    producers.produce(aborted, transactional="abort")
    producers.produce(messages[half:])
    producers.produce(committed, transactional="commit")
    report_watermark(services, names, BASE_TIME + len(good))

    topology = Topology(f"bad_{names.suffix}", streams=[names.stream])
    topology.add_computation(
        names.computation,
        CountAndAnswer(names.answers),
        inputs=[names.stream],
        outputs=[names.answers],
        options=ComputationOptions(key_intervals=INTERVALS),
    )
    with start(names, services, spark, topology) as running:
        running.process_available(timeout=120)
        totals = running.metrics()[names.computation]
        assert totals.failed_attempts == 0
        assert_sane_watermarks(running, names.computation, BASE_TIME + len(good))

    # Every good record counted once, answered once (by its own record ID).
    assert states(cassandra, names.keyspace, names.computation) == dict(
        Counter(record.key for record in good)
    )
    answers = by_record_id(read_topic(services, names.answers))
    assert Counter(answer.value for answer in answers.values()) == Counter(
        record.record_id for record in good
    )
    # Every bad message one dead letter, naming its error and its position.
    letters: list[DeadLetter] = [
        decode_dead_letter(envelope.value)
        for envelope in by_record_id(read_topic(services, names.dead_letters)).values()
    ]
    found = Counter(
        ((letter.origin.partition, letter.origin.offset), letter.error_type) for letter in letters
    )
    expected = Counter(
        (message.position, message.expect)
        for message in messages
        if message.expect not in ("good", "aborted")
    )
    assert found == expected
    for letter in letters:
        assert letter.origin.stream == names.stream
        assert letter.computation == names.computation
        assert letter.error_message
        if letter.error_type == "TombstoneError":
            assert (letter.raw, letter.raw_size) == (b"", 0)
            assert "tombstones='deliver'" in letter.error_message
    # The aborted transaction: nothing of it processed, nothing dead-lettered.
    aborted_ids = {message.record.record_id for message in aborted if message.record}
    assert not aborted_ids & {answer.value for answer in answers.values()}
    assert not {m.position for m in aborted} & {m for m, _ in found}
    assert totals.dead_letters == len(letters)


def test_a_computation_taking_tombstones_deletes_its_keys_once(
    services: MillstreamConfig, spark: SparkSession, cassandra: Session, names: Names
) -> None:
    good = good_records(60, users=6)
    first = [Message(encode_record(r), r.key.encode(), "good", r) for r in good[:40]]
    tombstones = [
        Message(None, b"user-1", "deleted"),
        Message(None, b"user-2", "deleted"),
        Message(None, None, "TombstoneError"),
        Message(None, b"\xff\xfe", "TombstoneError"),
    ]
    later = [Message(encode_record(r), r.key.encode(), "good", r) for r in good[40:]]
    producers = Producers(services, names.stream)
    producers.produce(first)
    producers.produce(tombstones)
    producers.produce(later)

    topology = Topology(f"deletions_{names.suffix}", streams=[names.stream])
    topology.add_computation(
        names.computation,
        Registry(names.answers),
        inputs=[names.stream],
        outputs=[names.answers],
        options=ComputationOptions(key_intervals=INTERVALS, tombstones="deliver"),
    )
    with start(names, services, spark, topology) as running:
        running.process_available(timeout=120)

    # user-1 and user-2 count only what came after their tombstones (in their partition's
    # order, which the tombstone shares with the key's records: same key, same partition).
    expected = Counter(record.key for record in good)
    for key in ("user-1", "user-2"):
        expected[key] = sum(1 for r in good[40:] if r.key == key)
    counted = states(cassandra, names.keyspace, names.computation)
    assert counted == {key: n for key, n in expected.items() if n}
    answers = by_record_id(read_topic(services, names.answers))
    deleted = [a for a in answers.values() if a.value.startswith(b"deleted ")]
    assert sorted(a.key for a in deleted) == ["user-1", "user-2"]
    letters = [
        decode_dead_letter(envelope.value)
        for envelope in by_record_id(read_topic(services, names.dead_letters)).values()
    ]
    assert sorted(
        ((letter.origin.partition, letter.origin.offset), letter.error_type) for letter in letters
    ) == sorted((m.position, m.expect) for m in tombstones if m.expect == "TombstoneError")

    # A second run of the same topology from a fresh checkpoint replays every message: the
    # deletions are duplicates by their positions, so nothing is deleted or answered again.
    replaying = replace(names, checkpoints=names.checkpoints.with_name("replay"))
    with start(replaying, services, spark, topology) as replay:
        replay.process_available(timeout=120)
    assert states(cassandra, names.keyspace, names.computation) == counted
    again = by_record_id(read_topic(services, names.answers))
    assert again.keys() == answers.keys()
    replayed = replay.metrics()[names.computation]
    assert replayed.duplicates == len(first + tombstones + later)
    assert (replayed.processed, replayed.dead_letters) == (0, 0)
