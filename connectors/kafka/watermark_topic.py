"""The watermark topic on Kafka: publishing reports and expected sets, and reading them back
(:class:`KafkaWatermarkTopic`, the Kafka backend of :mod:`millstream.engine.watermark_topic`).

Low-watermark reports (:mod:`millstream.engine.watermarks`) travel on one compacted topic,
``config.kafka_watermark_topic`` (default ``millstream.watermarks``), keyed by source name,
so Kafka keeps each source's latest report.
"""

from __future__ import annotations

import logging
import threading
import time
import warnings
from collections.abc import Mapping, Sequence

from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

from millstream.connectors.kafka.clients import consumer, producer
from millstream.connectors.kafka.topics import (
    create_wake_topics,
    create_watermark_topic,
    end_offsets,
    stream_topic,
    wake_topic,
)
from millstream.engine.config import MillstreamConfig
from millstream.engine.errors import WatermarkReportError
from millstream.engine.watermarks import (
    ExpectedSet,
    Offsets,
    WatermarkMessage,
    WatermarkReport,
    decode_watermark_message,
)

__all__ = [
    "KafkaWatermarkChannel",
    "KafkaWatermarkTopic",
    "WatermarkPublisher",
    "WatermarkReader",
]

_log = logging.getLogger(__name__)


class KafkaWatermarkTopic:
    """The watermark topic on Kafka (a :class:`~millstream.engine.watermark_topic.
    WatermarkTopic`): ``config.kafka_watermark_topic``, compacted, keyed by source.

    One object is one client of the topic: a producer for reports, expected sets,
    tombstones and wake-ups; a consumer that reads the topic from its beginning, a call at a
    time up to its end (:meth:`read`, at this object's own position); and one for the end
    offsets a report covers. Each is made at first use. With ``create`` (default) the topic
    is created, or checked to be compacted, at once (a reader alone may do without); else
    before the first write, which would otherwise auto-create it uncompacted.

    For an injector or any producer of a stream: after writing records, call
    :meth:`report_streams` with the watermark those writes reached; it covers them with the
    streams' current end offsets, so no consumer applies it before reading them.

    Messages of the topic that are neither reports nor expected sets are logged and counted
    in ``skipped`` (one bad producer must not stop every consumer's watermark).
    """

    def __init__(self, config: MillstreamConfig, *, create: bool = True) -> None:
        self.config = config
        self.topic = config.kafka_watermark_topic
        self._lock = threading.Lock()  # the clients are made once, whichever thread is first
        self._created = False
        if create:
            self._create()
        self._producer: Producer | None = None
        self._wake_topics: set[str] = set()  # known to exist
        self._errors: list[KafkaError] = []
        self._reader: Consumer | None = None
        self._next: dict[int, int] = {}
        self._assigned = False
        self.skipped = 0
        self._offsets: Consumer | None = None
        self._closed = False

    # -- writing -----------------------------------------------------------------------------

    def publish(self, report: WatermarkReport, timeout: float = 30.0) -> None:
        """Write one report, wait for Kafka to acknowledge it, then wake the consumers of the
        streams it names (after: a woken batch must find the report)."""
        self._write(self.topic, report.source, report.encode(), timeout)
        if report.streams:
            self.wake([wake_topic(self.config, s) for s in report.streams], report.source, timeout)

    def wake(self, topics: Sequence[str], source: str, timeout: float = 30.0) -> None:
        """Write an empty message to each wake or alarm topic (created if missing)."""
        missing = [t for t in topics if t not in self._wake_topics]
        if missing:
            create_wake_topics(self.config, missing)
            self._wake_topics.update(missing)
        for topic in topics:
            self._write(topic, source, b"", timeout, flush=False)
        self._flush(source, timeout)

    def report_streams(
        self,
        reader: Consumer | None,
        source: str,
        streams: Sequence[str],
        watermark: int,
        sequence: int,
        timeout: float = 30.0,
        *,
        records: int | None = None,
    ) -> WatermarkReport:
        """Report that ``source`` writes nothing older than ``watermark`` to ``streams`` any
        more; ``sequence`` must grow with every report of the source (e.g. wall-clock µs).
        ``records``: how many records it wrote, its weight in percentile watermarks.
        ``reader`` reads the streams' end offsets (``None``: this object's own consumer)."""
        topics = [stream_topic(s) for s in streams]
        offsets = end_offsets(reader or self._offsets_consumer(), topics, timeout)
        report = WatermarkReport(
            source, tuple(streams), watermark, sequence, offsets, records=records
        )
        self.publish(report, timeout)
        return report

    def retire(self, source: str, timeout: float = 30.0) -> None:
        """Forget a source for good (a tombstone): it no longer holds any watermark."""
        self._write(self.topic, source, None, timeout)

    def declare(self, expected: ExpectedSet, timeout: float = 30.0) -> None:
        """Publish an injector's expected set (then wake its streams' consumers)."""
        self._write(self.topic, expected.key, expected.encode(), timeout)
        if expected.streams:
            self.wake([wake_topic(self.config, s) for s in expected.streams], expected.key, timeout)

    def end_offsets(self, streams: Sequence[str]) -> Offsets:
        """The current end offsets of the streams' topics."""
        return end_offsets(self._offsets_consumer(), [stream_topic(s) for s in streams])

    def _create(self) -> None:
        with self._lock:
            if not self._created:
                create_watermark_topic(self.config)
                self._created = True

    def _writer(self) -> Producer:
        if not self._created:
            self._create()
        with self._lock:
            if self._producer is None:
                self._producer = producer(self.config)
            return self._producer

    def _write(
        self, topic: str, source: str, value: bytes | None, timeout: float, flush: bool = True
    ) -> None:
        def delivered(error: KafkaError | None, _message: Message) -> None:
            if error is not None:
                self._errors.append(error)

        self._writer().produce(topic, key=source.encode(), value=value, on_delivery=delivered)
        if flush:
            self._flush(source, timeout)

    def _flush(self, source: str, timeout: float) -> None:
        unflushed = self._writer().flush(timeout)  # runs the delivery callbacks
        errors, self._errors = self._errors, []
        if unflushed or errors:
            raise KafkaException(
                errors[0] if errors else KafkaError(KafkaError._MSG_TIMED_OUT),
                f"watermark report or wake-up of {source!r} was not acknowledged by Kafka "
                f"within {timeout} s; is Kafka up?",
            )

    # -- reading -----------------------------------------------------------------------------

    def read(
        self, timeout: float = 30.0, ends: Mapping[int, int] | None = None
    ) -> list[tuple[str, WatermarkMessage | None]]:
        """The messages after those read before, up to the topic's end now, as ``(key,
        message)`` in topic order (``None``: a retired key). ``ends``: the topic's end offset
        per partition, if the caller asked for them already (with other topics', in one
        request: the live view's readings); else this read asks.

        A read that fails (Kafka down, a timeout) returns nothing and moves nothing: the next
        read starts where this one did, so no report is ever skipped.
        """
        reader = self._read_consumer()
        if ends is None:
            # Asked by a consumer that fetches nothing: a broker answers a connection's
            # requests in turn, and the reader's fetch, held up to its fetch.wait.max.ms when
            # no report is new, held each of these two requests behind it (12 to 21 ms of
            # every batch's start at 2,000 events/s; about 2 ms this way).
            ends = end_offsets(self._offsets_consumer(), [self.topic], timeout)[self.topic]
        if not self._assigned or ends.keys() - self._next.keys():
            # Assigned once (again only if partitions are added, or after a failed read):
            # re-assigning resets the fetcher, which then takes a second or more to deliver.
            for partition in ends:
                self._next.setdefault(partition, 0)
            # A consumer learns of a topic assigned to it at its next scan of its topics, once
            # a second, unless it asked for the topic's metadata first: without, a batch's
            # first read of the topic waited about 0.95 s in one run of two (the ends, asked
            # by the other consumer, teach this one nothing).
            reader.list_topics(self.topic, timeout=timeout)
            reader.assign([TopicPartition(self.topic, p, self._next[p]) for p in sorted(ends)])
            self._assigned = True
        position = dict(self._next)
        wanted = {p: end for p, end in ends.items() if position[p] < end}
        found: list[tuple[str, WatermarkMessage | None]] = []
        deadline = time.monotonic() + timeout
        try:
            while any(position[p] < end for p, end in wanted.items()):
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"could not read {self.topic!r} up to its end within {timeout} s"
                    )
                message = reader.poll(0.1)
                if message is None:
                    # Compaction leaves gaps in the offsets; the fetch position skips them.
                    for fetched in reader.position([TopicPartition(self.topic, p) for p in wanted]):
                        if fetched.offset >= 0:
                            position[fetched.partition] = max(
                                position[fetched.partition], fetched.offset
                            )
                    continue
                if message.error() is not None:
                    raise KafkaException(message.error())
                at, offset = message.partition(), message.offset()
                # Both are set on a consumed message.
                assert at is not None
                assert offset is not None
                position[at] = offset + 1
                found.extend(self._parse(message))
        except BaseException:
            self._assigned = False  # the consumer's position is past ours: seek back
            raise
        self._next = position
        return found

    def _new_consumer(self) -> Consumer:
        # Fetches return at once: a driver reads before every batch and must not wait.
        return consumer(self.config, "millstream-watermarks", **{"fetch.wait.max.ms": 10})

    def _read_consumer(self) -> Consumer:
        with self._lock:
            if self._reader is None:
                self._reader = self._new_consumer()
            return self._reader

    def _offsets_consumer(self) -> Consumer:
        with self._lock:
            if self._offsets is None:
                self._offsets = consumer(self.config, "millstream-offsets")
            return self._offsets

    def reconnect(self) -> None:
        """Replace the Kafka consumers (after an outage left them failing); the next read
        goes on from the last message a read returned."""
        with self._lock:
            old = [c for c in (self._reader, self._offsets) if c is not None]
            self._reader = self._new_consumer() if self._reader is not None else None
            self._offsets = None
            self._assigned = False
        for stale in old:
            stale.close()

    def _parse(self, message: Message) -> list[tuple[str, WatermarkMessage | None]]:
        source = (message.key() or b"").decode(errors="replace")
        value = message.value()
        if value is None:
            return [(source, None)]
        try:
            decoded = decode_watermark_message(value)
        except WatermarkReportError as exc:
            self.skipped += 1
            _log.warning("skipping %s@%d: %s", self.topic, message.offset(), exc)
            return []
        if isinstance(decoded, ExpectedSet):
            return [(decoded.key, decoded)]
        return [(decoded.source, decoded)]

    def close(self, timeout: float = 30.0) -> None:
        """Deliver what is written, and close the consumers (once)."""
        with self._lock:
            closing, self._closed = not self._closed, True
        if not closing:
            return
        for client in (self._offsets, self._reader):
            if client is not None:
                client.close()
        if self._producer is not None:
            self._producer.flush(timeout)


def _deprecated(name: str) -> None:
    warnings.warn(
        f"millstream.connectors.kafka.{name} is deprecated: use KafkaWatermarkTopic, which "
        "writes and reads the watermark topic",
        DeprecationWarning,
        stacklevel=3,
    )


class WatermarkPublisher(KafkaWatermarkTopic):
    """Deprecated: :class:`KafkaWatermarkTopic`; this alias goes in 0.3."""

    def __init__(self, config: MillstreamConfig) -> None:
        _deprecated("WatermarkPublisher")
        super().__init__(config)


class WatermarkReader(KafkaWatermarkTopic):
    """Deprecated: :class:`KafkaWatermarkTopic` (``create=False``); this alias goes in 0.3."""

    def __init__(self, config: MillstreamConfig) -> None:
        _deprecated("WatermarkReader")
        super().__init__(config, create=False)


class KafkaWatermarkChannel(KafkaWatermarkTopic):
    """Deprecated: :class:`KafkaWatermarkTopic`; this alias goes in 0.3."""

    def __init__(self, config: MillstreamConfig) -> None:
        _deprecated("KafkaWatermarkChannel")
        super().__init__(config)
