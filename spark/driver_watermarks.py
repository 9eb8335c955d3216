"""One computation's low-watermark bookkeeping on the driver (paper 4.5, 5.2).

Every batch, the driver reads the new reports of the watermark topic (through the run's
:class:`~millstream.engine.authority.WatermarkAuthority`, which reads it once for every
computation), applies those that the
batch's consumed offsets have caught up with
(:class:`~millstream.engine.watermarks.ComputationWatermarks`), and afterwards publishes the
computation's own report, covering its output topics' end offsets, if it changed, which also
wakes the consumers of its output streams (:func:`~millstream.connectors.kafka.wake_topic`). When
a wall-time timer is due later, an alarm writes a wake-up message to the computation's alarm
topic at that time, which starts the batch that fires it; when a batch left productions
pending (a transaction fenced or of unknown outcome, Kafka unreachable), one does after
:data:`UNDELIVERED_RETRY_SECONDS`, so that they leave also once the input has ended.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from millstream.connectors import kafka as kafka_connector
from millstream.engine.authority import WatermarkAuthority
from millstream.engine.clock import Clock
from millstream.engine.config import MillstreamConfig
from millstream.engine.errors import TopologyError
from millstream.engine.pause_points import pause_point
from millstream.engine.topology import ComputationSpec, Topology
from millstream.engine.watermark_topic import WatermarkTopic
from millstream.engine.watermarks import ComputationWatermarks, Offsets, WatermarkReport

__all__ = [
    "UNDELIVERED_RETRY_SECONDS",
    "DriverWatermarks",
    "TopologyWatermarks",
    "WatermarkSnapshot",
    "offsets_consumer",
]

_log = logging.getLogger(__name__)

_ALARM_RETRY_SECONDS = 1.0
UNDELIVERED_RETRY_SECONDS: Final = 1.0
"""How soon after a batch that left productions pending another batch runs to deliver them."""


def offsets_consumer(config: MillstreamConfig) -> Any:
    """A Kafka consumer for reading end offsets (it never subscribes)."""
    return kafka_connector.consumer(config, "millstream-offsets")


@dataclass(frozen=True, slots=True)
class WatermarkSnapshot:
    """A computation's watermarks as of its latest batch (µs): its input low watermark, its
    own, and per source of its input streams the watermark applied from its reports."""

    input_watermark: int
    watermark: int
    sources: Mapping[str, int]


class DriverWatermarks:
    """One computation's watermark state on the driver, with its reader (a subscription to
    the run's ``authority``), the ``topic`` it publishes its reports on, and the alarm that
    wakes its query for wall-time timers."""

    def __init__(
        self,
        config: MillstreamConfig,
        topology: Topology,
        spec: ComputationSpec,
        topic: WatermarkTopic,
        clock: Clock,
        authority: WatermarkAuthority,
    ) -> None:
        self.spec = spec
        self.topic = topic
        self.clock = clock
        self._alarm_source = f"alarm/{topology.name}/{spec.name}"
        self.alarm_topic = kafka_connector.alarm_topic(config, topology.name, spec.name)
        self.state = ComputationWatermarks.of(topology, spec, kafka_connector.stream_topic)
        self.output_topics = sorted({kafka_connector.stream_topic(s) for s in self.state.outputs})
        self._config = config
        self.authority = authority
        self.reader = authority.subscribe(self.state.source)
        self._offsets = offsets_consumer(config)
        self._alarm: threading.Timer | None = None
        self._alarm_at: int | None = None
        self._unpublished: WatermarkReport | None = None

    def after_batch(
        self, batch_id: int, report: Callable[[int, Offsets], WatermarkReport | None]
    ) -> None:
        """Publish the computation's report, as ``report(batch_id, end offsets of its output
        topics)`` makes it (:meth:`ComputationDriver.report
        <millstream.engine.driver.ComputationDriver.report>`: ``None`` if it did not change);
        set the wall-time alarm.

        Safe to call again after it failed (Kafka down): a report made but not published is
        published first, since the bookkeeping would not make it again.
        """
        if self._unpublished is not None:
            self.topic.publish(self._unpublished)
            self._unpublished = None
        self._unpublished = report(
            batch_id, kafka_connector.end_offsets(self._offsets, self.output_topics)
        )
        if self._unpublished is not None:
            pause_point("driver.report", self.spec.name)
            self.topic.publish(self._unpublished)
            self._unpublished = None
        next_event_timer = self.state.intervals.next_event_timer()
        if next_event_timer is not None and next_event_timer < self.state.timer_watermark:
            # Event-time timers still due: a batch fires at most max_timer_firings_per_key
            # per key, and once the input has ended nothing else would start the batch that
            # fires the rest.
            self._wake(self.clock.now())
        alarm = self.state.intervals.next_wall_timer()
        if self.state.intervals.undelivered:
            # Productions left pending: a batch delivers them, which once the input has ended
            # nothing else would start.
            retry = self.clock.now() + int(UNDELIVERED_RETRY_SECONDS * 1_000_000)
            alarm = retry if alarm is None else min(alarm, retry)
        self._set_alarm(alarm)

    def wake_now(self) -> None:
        """Start a batch of the computation's query soon, even without new input."""
        self._wake(self.clock.now())

    def reconnect(self) -> None:
        """New Kafka consumers for reports and end offsets (an outage can wedge the old ones);
        the reader goes on from the last report it returned."""
        self.authority.reconnect()
        old, self._offsets = self._offsets, offsets_consumer(self._config)
        old.close()

    def snapshot(self) -> WatermarkSnapshot:
        """The watermarks now (any thread: a batch may be advancing them meanwhile)."""
        return WatermarkSnapshot(
            self.state.input.current, self.state.watermark, self.state.input.applied()
        )

    def _set_alarm(self, at: int | None) -> None:
        pending = self._alarm is not None and self._alarm.is_alive()
        if at == self._alarm_at and pending:
            return
        if self._alarm is not None:
            self._alarm.cancel()
            self._alarm = None
        if at is None:
            self._alarm_at = None
            return
        delay = max(0.0, (at - self.clock.now()) / 1e6)
        if at == self._alarm_at:
            # Woken for it already, yet it did not fire (an executor's clock lagging ours):
            # try again shortly rather than never.
            delay = max(delay, _ALARM_RETRY_SECONDS)
        self._alarm_at = at
        self._alarm = threading.Timer(delay, self._wake, args=(at,))
        self._alarm.daemon = True
        self._alarm.start()

    def _wake(self, at: int) -> None:
        try:
            self.topic.wake([self.alarm_topic], self._alarm_source)
        except Exception:
            _log.exception("could not wake %r for its due timers", self.spec.name)

    def close(self) -> None:
        if self._alarm is not None:
            self._alarm.cancel()
        self.reader.close()
        self._offsets.close()


class TopologyWatermarks:
    """The :class:`DriverWatermarks` of every computation of one running topology, made as
    each first runs and kept across its query's restarts. They share one publisher and one
    :class:`~millstream.engine.authority.WatermarkAuthority` (one reader of the watermark
    topic for the whole run, not one per query), closed with them by :meth:`close`; the
    next computation to run after that opens new ones."""

    def __init__(self, config: MillstreamConfig, topology: Topology, clock: Clock) -> None:
        self._config = config
        self._topology = topology
        self._clock = clock
        self._lock = threading.Lock()
        self._trackers: dict[str, DriverWatermarks] = {}
        self._publisher: kafka_connector.KafkaWatermarkTopic | None = None
        self._authority: WatermarkAuthority | None = None

    def of(self, spec: ComputationSpec) -> DriverWatermarks:
        """The computation's tracker, made at its first run."""
        with self._lock:
            tracker = self._trackers.get(spec.name)
            if tracker is None:
                if self._publisher is None:
                    self._publisher = kafka_connector.KafkaWatermarkTopic(self._config)
                if self._authority is None:
                    self._authority = WatermarkAuthority(
                        kafka_connector.KafkaWatermarkTopic(self._config, create=False)
                    )
                tracker = DriverWatermarks(
                    self._config,
                    self._topology,
                    spec,
                    self._publisher,
                    self._clock,
                    self._authority,
                )
                self._trackers[spec.name] = tracker
            return tracker

    def get(self, computation: str) -> DriverWatermarks:
        """The tracker of a computation that has run."""
        with self._lock:
            tracker = self._trackers.get(computation)
        if tracker is None:
            raise TopologyError(f"computation {computation!r} has not run under this handle")
        return tracker

    def snapshots(self) -> dict[str, WatermarkSnapshot]:
        """The watermarks of every computation that has run, as of their latest batches
        (from any thread)."""
        with self._lock:
            trackers = dict(self._trackers)
        return {name: tracker.snapshot() for name, tracker in trackers.items()}

    def pop(self, computation: str) -> DriverWatermarks | None:
        """Take a computation's tracker out (removed from the topology); the caller closes
        it once its query stopped."""
        with self._lock:
            return self._trackers.pop(computation, None)

    def close(self) -> None:
        """Close every tracker, then the shared reader and publisher."""
        with self._lock:
            trackers, self._trackers = dict(self._trackers), {}
            authority, self._authority = self._authority, None
            publisher, self._publisher = self._publisher, None
        for tracker in trackers.values():
            tracker.close()
        if authority is not None:
            authority.close()
        if publisher is not None:
            publisher.close()
