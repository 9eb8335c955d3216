"""Reading a stream from Python: its records, typed, in offset order per partition.

::

    from millstream.connectors import load_config, read_stream

    for record in read_stream(load_config(), "anomalies", dedup=True):
        print(record.key, json.loads(record.value))

:func:`read_stream` is how a job reads what its topology produced: it decodes each message
(:class:`~millstream.engine.records.Record`), and with ``dedup`` drops the repeats a
millstream reader is meant to drop (a re-sent production carries the same record ID).
:func:`read_messages` is the raw layer under it and under ``millstream tail``
(:mod:`millstream.connectors.streams`). Like every millstream reader they read committed
data only (librdkafka's ``isolation.level`` default, ``read_committed``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator, Iterator, Sequence, Set
from typing import Literal, NamedTuple, NoReturn, Protocol

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from millstream.connectors import kafka
from millstream.engine.config import MillstreamConfig
from millstream.engine.errors import MillstreamError, RecordDecodeError, ServiceOutageError
from millstream.engine.records import Record, decode_record

__all__ = [
    "InputMessage",
    "StreamMessage",
    "kafka_down",
    "learn_topics",
    "range_reader",
    "read_messages",
    "read_ranges",
    "read_stream",
]

_NO_TOPIC = frozenset({KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC})


class StreamMessage(NamedTuple):
    """One message of a stream's topic, undecoded (``value`` is ``None`` for a message
    without one, which is no record)."""

    partition: int
    offset: int
    value: bytes | None


class InputMessage(NamedTuple):
    """One message of a range :func:`read_ranges` read: where it is, its Kafka timestamp
    (µs), its Kafka key and its value (each ``None`` if the message has none)."""

    topic: str
    partition: int
    offset: int
    kafka_ts: int
    key: bytes | None
    value: bytes | None


class _Range(Protocol):
    """Offsets ``start`` (inclusive) to ``end`` (exclusive) of a topic partition."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def start(self) -> int: ...
    @property
    def end(self) -> int: ...


def range_reader(config: MillstreamConfig, **settings: str | int | bool) -> Consumer:
    """A consumer for :func:`read_ranges`: it reads committed data only, waits at most 10 ms
    for a fetch to fill (a range's messages exist already; Kafka's default wait, 500 ms,
    would land in every read of a partition's tail), and fails on an offset that is gone
    (retention removed it) rather than jump to another."""
    return kafka.consumer(
        config,
        "millstream-ranges",
        **{"fetch.wait.max.ms": 10, "auto.offset.reset": "error", **settings},
    )


def read_ranges(
    reader: Consumer,
    ranges: Sequence[_Range],
    timeout: float = 30.0,
    *,
    skip: Callable[[str, bytes | None], bool] | None = None,
    known_topics: set[str] | None = None,
) -> Generator[InputMessage, None, None]:
    """The messages of ``ranges``, in offset order within each partition (partitions
    interleave), read with ``reader`` (:func:`range_reader`), which this assigns to them.
    ``skip``, if given, is asked with each message's topic and value, and a message it
    answers true for is not yielded (a Spark task passes over another task's records so,
    without the cost of making them messages).

    ``known_topics``: the topics whose metadata ``reader`` asked for before, which this adds
    to; with ``None`` it asks for every topic of ``ranges``. A consumer learns of a topic
    assigned to it only at its next scan of its topics, once a second, unless it asked for
    the topic's metadata first: a reader that had read other topics waited up to a second
    to begin a read of 20,000 messages that then took 0.03 s (``bench/range_reads.py``).

    An offset a transaction marker or an aborted transaction takes, or compaction emptied,
    yields nothing: a partition is done once the consumer's position reaches its range's
    end. Raises :class:`~millstream.engine.errors.ServiceOutageError` if no partition moves
    for ``timeout`` seconds (Kafka down), :class:`~millstream.engine.errors.MillstreamError`
    if a range's messages are gone, and Kafka's own errors as ``KafkaException``.
    """
    # A partition may have several ranges (a batch without some of its messages): it is
    # read from the first one's start to the last one's end, keeping what is in a range.
    spans: dict[tuple[str, int], list[tuple[int, int]]] = {}
    for r in ranges:
        if r.end > r.start:
            spans.setdefault((r.topic, r.partition), []).append((r.start, r.end))
    if not spans:
        return
    left = {place: max(end for _, end in parts) for place, parts in spans.items()}
    gaps = {place: parts for place, parts in spans.items() if len(parts) > 1}
    learn_topics(reader, {topic for topic, _ in spans}, known_topics, timeout)
    reader.assign(
        [TopicPartition(t, p, min(start for start, _ in parts)) for (t, p), parts in spans.items()]
    )
    deadline = time.monotonic() + timeout
    try:
        while left:
            # What the consumer holds already, at once; else wait for the next message. A
            # consume of up to 10,000 with a timeout waits the timeout out unless all 10,000
            # come: 50 ms on the read of every small batch.
            messages = reader.consume(10_000, 0) or reader.consume(1, 0.05)
            for message in messages:
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        continue
                    where = f"{message.topic()} partition {message.partition()}"
                    if error.code() == KafkaError._AUTO_OFFSET_RESET:
                        raise MillstreamError(
                            f"the input of a batch is gone from {where} ({error}): Kafka "
                            "deleted it (retention) before it was processed"
                        )
                    raise KafkaException(error)
                # Set on every consumed message (the stubs allow None); no cast(), which is a
                # call per message at run time.
                topic: str = message.topic()  # type: ignore[assignment]
                value = message.value()
                if skip is not None and skip(topic, value):
                    continue  # wherever it is: a skipped message is never yielded
                partition: int = message.partition()  # type: ignore[assignment]
                offset: int = message.offset()  # type: ignore[assignment]
                place = (topic, partition)
                end = left.get(place)
                if end is None or offset >= end:
                    continue  # past its range: the next batch's
                if gaps and place in gaps and not any(a <= offset < b for a, b in gaps[place]):
                    continue  # between two of its ranges
                yield InputMessage(
                    topic,
                    partition,
                    offset,
                    message.timestamp()[1] * 1000,
                    message.key(),
                    value,
                )
            if messages:
                deadline = time.monotonic() + timeout
            # Offsets have gaps (transaction markers, aborted transactions, compaction):
            # the consumer's position passes them, the messages do not.
            for at in reader.position([TopicPartition(t, p) for t, p in left]):
                if at.offset >= left[(at.topic, at.partition)]:
                    del left[(at.topic, at.partition)]
                    deadline = time.monotonic() + timeout
            if left and time.monotonic() > deadline:
                raise ServiceOutageError(
                    f"Kafka: reading {sorted(left)} up to offsets {sorted(left.values())} made "
                    f"no progress for {timeout} s"
                )
    finally:
        reader.unassign()


def learn_topics(
    reader: Consumer | AdminClient, topics: Set[str], known: set[str] | None, timeout: float
) -> None:
    """Ask ``reader`` (:func:`range_reader`, or an admin client) for the metadata of those of
    ``topics`` not in ``known`` (all with ``None``), adding each the broker knows to ``known``;
    see :func:`read_ranges`. Raises :class:`~millstream.engine.errors.ServiceOutageError` if
    Kafka does not answer within ``timeout`` seconds."""
    for topic in sorted(topics - known if known is not None else topics):
        try:
            metadata = reader.list_topics(topic, timeout=timeout).topics.get(topic)
        except KafkaException as exc:
            raise ServiceOutageError(
                f"Kafka: asking for the metadata of {topic!r} failed within {timeout} s: {exc}"
            ) from exc
        if known is not None and metadata is not None and metadata.error is None:
            known.add(topic)


def read_stream(
    config: MillstreamConfig,
    stream: str,
    *,
    from_beginning: bool = True,
    follow: bool = False,
    dedup: bool = False,
    stop: threading.Event | None = None,
    errors: Literal["raise", "skip"] = "raise",
    timeout: float = 30.0,
) -> Iterator[Record]:
    """The records of ``stream``, in offset order within each partition (partitions
    interleave); see :func:`read_messages` for where it starts and when it ends.

    ``dedup`` yields each record ID once (keeping every ID seen in memory). A message that is
    not a record (written by a foreign producer) raises
    :class:`~millstream.engine.errors.RecordDecodeError` naming its position, or with
    ``errors="skip"`` is passed over (``millstream tail`` shows it).
    """
    seen: set[bytes] = set()
    for message in read_messages(
        config,
        stream,
        from_beginning=from_beginning,
        follow=follow,
        stop=stop,
        timeout=timeout,
    ):
        try:
            if message.value is None:
                raise RecordDecodeError("a message without a value is not a record")
            record = decode_record(message.value)
        except RecordDecodeError as exc:
            if errors == "skip":
                continue
            raise RecordDecodeError(
                f"stream {stream!r} partition {message.partition} offset {message.offset} is "
                f"not a record ({exc}); `millstream tail {stream} --from-beginning` shows it, "
                "or read with errors='skip'"
            ) from exc
        if dedup:
            if record.record_id in seen:
                continue
            seen.add(record.record_id)
        yield record


def read_messages(
    config: MillstreamConfig,
    stream: str,
    *,
    from_beginning: bool = True,
    follow: bool = False,
    stop: threading.Event | None = None,
    timeout: float = 30.0,
) -> Generator[StreamMessage, None, None]:
    """The messages of ``stream``'s topic, in offset order within each partition.

    It starts at each partition's beginning (``from_beginning``) or at its end at the call.
    Without ``follow`` it ends once it reached the end offsets it found at the call; with
    ``follow`` it waits for more until ``stop`` is set (checked every 0.2 s), the caller
    stops iterating, or an interrupt. Partitions added to the topic after the call are not
    read. The Kafka consumer closes when the iteration ends (or the iterator is closed).

    Raises :class:`~millstream.engine.errors.MillstreamError` if the stream has no topic, or
    Kafka does not answer (or, without ``follow``, delivers nothing) for ``timeout`` seconds.
    """
    topic = kafka.stream_topic(stream)
    reader = kafka.consumer(config, "millstream-read")
    try:
        starts, ends = _bounds(reader, stream, topic, from_beginning, timeout)
        reader.assign([TopicPartition(topic, p, offset) for p, offset in sorted(starts.items())])
        position = dict(starts)  # the next offset to yield, per partition
        deadline = time.monotonic() + timeout
        while stop is None or not stop.is_set():
            if not follow and all(position[p] >= end for p, end in ends.items()):
                return
            message = reader.poll(0.2)
            if message is None:
                if not follow:
                    if time.monotonic() > deadline:
                        kafka_down(config, f"could not read {topic!r} up to its end", timeout)
                    # Offsets have gaps (transaction markers, compaction): follow the fetcher.
                    for at in reader.position([TopicPartition(topic, p) for p in position]):
                        if at.offset >= 0:
                            position[at.partition] = max(position[at.partition], at.offset)
                continue
            error = message.error()
            if error is not None:
                raise MillstreamError(f"reading stream {stream!r} failed: {error}")
            partition, offset = message.partition(), message.offset()
            assert partition is not None  # both are set on a consumed message
            assert offset is not None
            position[partition] = offset + 1
            deadline = time.monotonic() + timeout
            if not follow and offset >= ends[partition]:
                continue  # written after the call
            yield StreamMessage(partition, offset, message.value())
    except KafkaException as exc:
        kafka_down(config, f"reading stream {stream!r} failed: {exc}", timeout)
    finally:
        reader.close()


def kafka_down(config: MillstreamConfig, what: str, timeout: float) -> NoReturn:
    """Raise :class:`~millstream.engine.errors.MillstreamError` saying ``what`` failed and
    asking whether Kafka is up (unless ``what`` asks already)."""
    message = what.rstrip(".")
    if "is Kafka up?" not in message:
        message += f" (within {timeout} s); is Kafka up at {config.kafka_bootstrap}?"
    raise MillstreamError(message)


def _bounds(
    reader: Consumer, stream: str, topic: str, from_beginning: bool, timeout: float
) -> tuple[dict[int, int], dict[int, int]]:
    """Per partition of ``topic``: where reading starts (its first offset still kept, or its
    end) and its end, now."""
    # A consumer's metadata request does not auto-create the topic.
    metadata = reader.list_topics(topic, timeout=timeout).topics.get(topic)
    if metadata is None or (metadata.error is not None and metadata.error.code() in _NO_TOPIC):
        raise MillstreamError(f"stream {stream!r} has no topic; nothing was produced to it yet")
    # Retried while a topic just created has no leader yet.
    ends = dict(kafka.end_offsets(reader, [topic], timeout)[topic])
    if not from_beginning:
        return dict(ends), ends
    return dict(kafka.start_offsets(reader, [topic], timeout)[topic]), ends
