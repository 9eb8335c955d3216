"""Reading the services for the live view: the watermark topic (every source's latest
report and each injector's expected processes) and the end offsets of every stream topic.

The view reads Kafka itself, never a driver's memory: it shows the same for a local run and
a cluster deployment, and survives a driver's restart. A service that does not answer makes
the observation partial, never the view's end: what could not be read is what was read
before, and the observation says why.
"""

from __future__ import annotations

import logging

from confluent_kafka import Consumer, KafkaException

from millstream.connectors.kafka import KafkaWatermarkTopic, consumer, end_offsets
from millstream.engine.clock import Clock
from millstream.engine.config import MillstreamConfig
from millstream.engine.watermarks import WatermarkMessage, WatermarkReport
from millstream.engine.watermarks.report import Offsets
from millstream.ui.snapshot import Observation

__all__ = ["KafkaObserver", "stream_topics"]

_log = logging.getLogger(__name__)


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

    def observe(self) -> Observation:
        errors: list[str] = []
        try:
            topics = self._metadata()
        except (KafkaException, TimeoutError) as exc:
            errors.append(f"Kafka at {self.config.kafka_bootstrap} did not answer ({exc})")
            self._renew()
            topics = None
        if topics is not None:
            if self.config.kafka_watermark_topic in topics:
                try:
                    self._read_watermarks()
                except (KafkaException, TimeoutError) as exc:
                    errors.append(f"could not read the watermark topic ({exc})")
                    self._watermarks.reconnect()
            try:
                assert self._reader is not None
                self._ends = end_offsets(
                    self._reader, stream_topics(self.config, topics), self.timeout
                )
            except (KafkaException, TimeoutError) as exc:
                errors.append(f"could not read the streams' end offsets ({exc})")
                self._renew()
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
        return list(self._reader.list_topics(timeout=self.timeout).topics)

    def _read_watermarks(self) -> None:
        for key, message in self._watermarks.read(self.timeout):
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
        if self._reader is not None:
            try:
                self._reader.close()
            except (KafkaException, RuntimeError) as exc:
                _log.debug("closing the failed Kafka reader: %s", exc)
            self._reader = None
