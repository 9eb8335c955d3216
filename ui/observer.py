"""Reading the services for the live view: the watermark topic (every source's latest
report and each injector's expected processes) and the end offsets of every stream topic.

The view reads Kafka itself, never a driver's memory: it shows the same for a local run and
a cluster deployment, and survives a driver's restart. A service that does not answer makes
the observation partial, never the view's end: what could not be read is what was read
before, and the observation says why.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from millstream.connectors.kafka import KafkaWatermarkTopic, admin_client, consumer
from millstream.engine.clock import Clock
from millstream.engine.config import MillstreamConfig
from millstream.engine.watermarks import WatermarkMessage, WatermarkReport
from millstream.engine.watermarks.report import Offsets
from millstream.ui.snapshot import Observation

__all__ = ["KafkaObserver", "stream_topics"]

_log = logging.getLogger(__name__)
# A partition's end offset, as list_offsets asks for it (confluent-kafka leaves it unannotated).
_LATEST = OffsetSpec.latest()  # type: ignore[no-untyped-call]
_GONE = frozenset({KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC})


def stream_topics(config: MillstreamConfig, topics: list[str]) -> list[str]:
    """The topics of ``topics`` that carry streams: not Kafka's own (``__``) nor the
    watermark topic and its wake-up and alarm topics."""
    internal = config.kafka_watermark_topic
    return sorted(
        t
        for t in topics
        if not t.startswith("__") and t != internal and not t.startswith(internal + ".")
    )


class KafkaObserver:
    """:meth:`observe` reads what changed on the watermark topic since the last call, and
    every stream's end offsets now. Not thread-safe: one caller at a time."""

    def __init__(self, config: MillstreamConfig, clock: Clock, *, timeout: float = 5.0) -> None:
        self.config = config
        self.clock = clock
        self.timeout = timeout
        self._watermarks = KafkaWatermarkTopic(config, create=False)
        self._messages: dict[str, WatermarkMessage] = {}
        self._ends: Offsets = {}
        self._reader: Consumer | None = None
        self._admin: AdminClient | None = None
        self._partitions: dict[str, list[int]] = {}

    def observe(self) -> Observation:
        errors: list[str] = []
        try:
            topics = self._metadata()
        except (KafkaException, TimeoutError) as exc:
            errors.append(f"Kafka at {self.config.kafka_bootstrap} did not answer ({exc})")
            self._renew()
            topics = None
        if topics is not None:
            # The watermark topic's end with the streams', in the one request.
            internal = self.config.kafka_watermark_topic
            asked = stream_topics(self.config, topics) + ([internal] if internal in topics else [])
            try:
                ends = self._end_offsets(asked)
            except (KafkaException, TimeoutError) as exc:
                errors.append(
                    f"could not read the end offsets of the streams and the watermark topic ({exc})"
                )
                self._renew()
            else:
                reported = ends.pop(internal, None)
                self._ends = ends
                if reported is not None:
                    try:
                        self._read_watermarks(reported)
                    except (KafkaException, TimeoutError) as exc:
                        errors.append(f"could not read the watermark topic ({exc})")
                        self._watermarks.reconnect()
        return Observation(
            now=self.clock.now(),
            messages=dict(self._messages),
            ends=self._ends,
            error="; ".join(errors) or None,
        )

    def close(self) -> None:
        self._watermarks.close()
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def _metadata(self) -> list[str]:
        if self._reader is None:
            self._reader = consumer(self.config, "millstream-ui")
        # A metadata request for every topic creates none.
        self._partitions = {
            name: sorted(topic.partitions)
            for name, topic in self._reader.list_topics(timeout=self.timeout).topics.items()
            if topic.error is None
        }
        return list(self._partitions)

    def _end_offsets(self, topics: list[str]) -> dict[str, dict[int, int]]:
        """Every partition's end offset in one request per broker (a consumer would make one
        per partition: a second for a thousand of them; and a metadata request per topic)."""
        if self._admin is None:
            self._admin = admin_client(self.config)
        asked = {
            TopicPartition(topic, partition): _LATEST
            for topic in topics
            for partition in self._partitions.get(topic, [])
        }
        if not asked:
            return {}
        futures = self._admin.list_offsets(asked, request_timeout=self.timeout)
        ends: dict[str, dict[int, int]] = {}
        for place, future in futures.items():
            try:
                answer = future.result(timeout=self.timeout)
            except KafkaException as exc:
                if exc.args[0].code() in _GONE:
                    continue  # deleted since the metadata listed it
                raise
            ends.setdefault(place.topic, {})[place.partition] = answer.offset
        return ends

    def _read_watermarks(self, ends: Mapping[int, int]) -> None:
        for key, message in self._watermarks.read(self.timeout, ends):
            old = self._messages.get(key)
            if message is None:
                self._messages.pop(key, None)
            elif not (
                isinstance(old, WatermarkReport)
                and isinstance(message, WatermarkReport)
                and old.sequence > message.sequence  # a zombie's late report
            ):
                self._messages[key] = message

    def _renew(self) -> None:
        """A client that failed may be wedged: the next observation makes a new one."""
        self._admin = None
        if self._reader is not None:
            try:
                self._reader.close()
            except (KafkaException, RuntimeError) as exc:
                _log.debug("closing the failed Kafka reader: %s", exc)
            self._reader = None
