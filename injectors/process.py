"""One injector process: the loop around a :class:`~millstream.injectors.source.Source`.

Per poll, in this order (each step's crash is harmless to the next run):

1. **Read** what the source has, and turn it into records whose IDs derive from their source
   position (:func:`~millstream.engine.records.injector_record_id`); input the source
   rejected, or a record with an oversized value or an absurd time, becomes a dead letter on
   the injector's dead-letter stream, with its origin, and is counted.
2. **Send** them and wait until Kafka acknowledged every one (resending the others).
3. **Checkpoint** the source's new position under the process's sequencer
   (:mod:`~millstream.injectors.checkpoint`): a crash before this re-reads and re-sends the
   same records with the same IDs, which consumers drop; a zombie copy stops here.
4. **Report** the source's low watermark on the watermark topic, covering the streams' end
   offsets, so no consumer applies it before it read the records it speaks for.

Steps 3 and 4 run at most once per ``checkpoint_interval`` (and at once when the source is
exhausted, on :meth:`InjectorProcess.flush` and when :meth:`InjectorProcess.run` stops): a
source that trickles, one record a poll, would otherwise cost a Cassandra LWT, a Kafka offsets
request and a report per record (at 200 records a second, about a core of a 2-core machine
between Cassandra, Kafka and the process; ``bench/injector_cost.py``). Records still leave
at their poll. A crash re-sends what was sent since the last checkpoint, which consumers drop
by ID; the reported watermark is always the checkpointed one, so a restarted process, which
resumes from its checkpoint, never reports less than its predecessor did.

While the source is idle, the process re-reports its watermark every ``heartbeat`` µs: that
gives downstream computations a batch in which to fire wall-time timers and lets an
advancing idle watermark reach event-time timers.

A process belongs to the **expected set** of its injector (paper 5.2), published on the
watermark topic when it starts: every expected process holds the injector's streams until it
reported, so consumers never run ahead of a process that has not started or went silent.
:func:`retire_process` removes one for good. With a **skew limit**, the process waits before
sending while its watermark is more than the limit ahead of the slowest of its
``downstream`` computations' watermarks (one that has not reported yet does not hold it).
"""

from __future__ import annotations

import logging
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from millstream.engine.clock import Clock
from millstream.engine.deadletters import (
    MAX_ERROR_MESSAGE_CHARS,
    MAX_RAW_BYTES,
    DeadLetter,
    Origin,
    default_dead_letter_stream,
)
from millstream.engine.errors import (
    InjectorError,
    InjectorRetiredError,
    RecordError,
)
from millstream.engine.outages import DEFAULT_OUTAGE_TIMEOUT, Outage
from millstream.engine.pause_points import pause_point
from millstream.engine.productions import Production, ProductionSink
from millstream.engine.records import (
    MAX_EVENT_TIME,
    MIN_EVENT_TIME,
    Record,
    check_event_time,
    check_record_size,
    encode_record,
    injector_record_id,
)
from millstream.engine.store import IntervalStore
from millstream.engine.watermark_topic import WatermarkTopic
from millstream.engine.watermarks import (
    ExpectedSet,
    WatermarkMessage,
    WatermarkReport,
    injector_source,
    latest_expected_set,
)
from millstream.injectors.checkpoint import Checkpoint, CheckpointStore
from millstream.injectors.source import Poll, Position, RejectedInput, Source

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

__all__ = [
    "DEFAULT_CHECKPOINT_INTERVAL",
    "InjectorOptions",
    "InjectorProcess",
    "InjectorStats",
    "injector_streams",
    "retire_process",
]

_log = logging.getLogger(__name__)

# Reports of one process are ordered by (sequencer, count): a restarted process's reports
# always supersede those of any earlier copy, whatever that copy still sends.
_SEQUENCE_SHIFT = 32
DEFAULT_CHECKPOINT_INTERVAL = 100_000
"""µs between an injector process's checkpoints while its source makes progress: ten LWTs
and reports a second at most, and a restarted process re-sends at most 0.1 s of records."""


def __getattr__(name: str) -> Any:
    if name == "WatermarkChannel":
        warnings.warn(
            "millstream.injectors.process.WatermarkChannel is deprecated: use "
            "millstream.engine.watermark_topic.WatermarkTopic",
            DeprecationWarning,
            stacklevel=2,
        )
        return WatermarkTopic
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True, slots=True)
class InjectorOptions:
    """How an injector process runs.

    ``process`` names it within its injector and ``expected`` names all the processes the
    injector runs as (default: this one alone). ``heartbeat``: µs between reports while idle.
    ``poll_timeout``: seconds a poll waits for input. ``send_timeout``: seconds Kafka may take
    to acknowledge a poll's records before the process warns and sends the rest again.
    ``outage_timeout``: seconds the process waits out Kafka or Cassandra being unreachable
    (:mod:`millstream.engine.outages`) before it gives up (it stops with an error and resumes
    from its checkpoint when restarted). ``skew_limit`` (µs) and ``downstream``
    (source names, :func:`~millstream.engine.watermarks.computation_source`): see the module
    docstring. ``max_future``: records timestamped more than this many µs after the clock are
    dead letters (a unit mistake), off by default. ``dead_letter_stream``: default
    ``<injector>.dead-letters``.
    """

    process: str = "0"
    expected: tuple[str, ...] = ()
    heartbeat: int = 1_000_000
    poll_timeout: float = 0.2
    send_timeout: float = 30.0
    skew_limit: int | None = None
    downstream: tuple[str, ...] = ()
    max_future: int | None = None
    dead_letter_stream: str | None = None
    outage_timeout: float = DEFAULT_OUTAGE_TIMEOUT
    checkpoint_interval: int = DEFAULT_CHECKPOINT_INTERVAL

    def __post_init__(self) -> None:
        if (
            self.heartbeat <= 0
            or self.poll_timeout < 0
            or self.send_timeout <= 0
            or self.outage_timeout <= 0
        ):
            raise InjectorError(
                "heartbeat, send_timeout and outage_timeout must be positive and poll_timeout "
                "non-negative"
            )
        if self.skew_limit is not None and self.skew_limit < 0:
            raise InjectorError(f"skew_limit must be non-negative µs, got {self.skew_limit}")
        if self.max_future is not None and self.max_future < 0:
            raise InjectorError(f"max_future must be non-negative µs, got {self.max_future}")
        if self.checkpoint_interval < 0:
            raise InjectorError(
                f"checkpoint_interval must be non-negative µs, got {self.checkpoint_interval}"
            )


@dataclass
class InjectorStats:
    """Counters of one process since it started."""

    polls: int = 0
    emitted: int = 0
    dead_letters: int = 0
    checkpoints: int = 0
    reports: int = 0
    heartbeats: int = 0
    skew_waits: int = 0
    dead_letter_errors: dict[str, int] = field(default_factory=dict)


def injector_streams(name: str, source: Source, options: InjectorOptions) -> tuple[str, ...]:
    """The streams injector ``name`` writes: its source's, then its dead-letter stream."""
    dead_letters = options.dead_letter_stream or default_dead_letter_stream(name)
    return (*dict.fromkeys(source.streams), dead_letters)


class InjectorProcess:
    """Runs ``source`` as process ``options.process`` of injector ``name``; see the module
    docstring. ``store`` holds the checkpoint, ``sink`` takes the records (Kafka:
    ``connectors.kafka.KafkaProductionSink``), ``watermarks`` is the watermark topic
    (:class:`~millstream.engine.watermark_topic.WatermarkTopic`; on Kafka
    ``connectors.kafka.KafkaWatermarkTopic``);
    ``wait(seconds)`` pauses while the skew limit holds the process back. With ``metrics``,
    a ``prometheus_client.CollectorRegistry``, the process's stats and watermark are
    collected into it (:mod:`millstream.injectors.prometheus`; one process per registry)."""

    def __init__(
        self,
        name: str,
        source: Source,
        *,
        store: IntervalStore,
        sink: ProductionSink,
        watermarks: WatermarkTopic,
        clock: Clock,
        options: InjectorOptions | None = None,
        wait: Callable[[float], object] | None = None,
        metrics: CollectorRegistry | None = None,
    ) -> None:
        options = options or InjectorOptions()
        if not name or "/" in name:
            raise InjectorError(f"injector name {name!r} must be non-empty and contain no '/'")
        if not source.streams:
            raise InjectorError(f"the source of injector {name!r} names no stream it writes")
        self.name = name
        self.source = source
        self.sink = sink
        self.watermarks = watermarks
        self.clock = clock
        self.options = options
        self.process = options.process
        self.report_source = injector_source(name, options.process)
        self.streams = injector_streams(name, source, options)
        self.source_streams, self.dead_letter_stream = self.streams[:-1], self.streams[-1]
        self.checkpoints = CheckpointStore(store, name, options.process)
        self.stats = InjectorStats()
        self.watermark = MIN_EVENT_TIME
        self.exhausted = False
        self._position: Position | None = None
        # Progress past the checkpoint: sent and read, not yet checkpointed nor reported.
        self._next_position: Position | None = None
        self._next_watermark = MIN_EVENT_TIME
        self._next_exhausted = False
        self._sent_unreported = False
        self._last_checkpoint: int | None = None
        self._started = False
        self._reports = 0
        self._last_report: int | None = None
        self._downstream: dict[str, int] = {}
        self._stop = threading.Event()
        # How the skew limit waits: until stop() or the timeout (tests inject their own).
        self._wait = wait or self._stop.wait
        self._outage = Outage(
            f"injector {name!r} process {options.process!r}",
            options.outage_timeout,
            sleep=self._wait,
            monotonic=lambda: self.clock.now() / 1e6,
            # A consumer wedged by an outage outlives it; the driver replaces its own too.
            reconnect=getattr(watermarks, "reconnect", None),
        )
        self.metrics = metrics
        if metrics is not None:
            # prometheus_client is only imported by a process that exports metrics.
            from millstream.injectors.prometheus import InjectorCollector

            metrics.register(InjectorCollector(self))

    # -- the loop ----------------------------------------------------------------------------

    def start(self) -> None:
        """Take over the checkpoint (fencing any earlier copy), join the expected set, and
        open the source where the checkpoint left it."""
        checkpoint = self._outage.retry(self.checkpoints.acquire)
        self._position = self._next_position = checkpoint.position
        self.watermark = self._next_watermark = checkpoint.watermark
        self._outage.retry(self._join_expected_set)
        self.source.open(checkpoint.position)
        self._started = True
        # Say at once where this process stands: a restarted one un-silences its streams.
        self._outage.retry(lambda: self._report(heartbeat=False))

    def step(self) -> None:
        """One poll: read and send; then checkpoint and report if the checkpoint interval
        has passed (or heartbeat if idle)."""
        if not self._started:
            raise InjectorError("start() the injector process before stepping it")
        poll = self.source.poll(self._poll_timeout())
        self.stats.polls += 1
        productions = self._productions(poll)
        if productions:
            # Read and not sent: where the proving ground freezes a service under the injector.
            pause_point("injector.send", self.name)
            self._outage.retry(self._wait_for_downstream)
            self._send(productions)
            self._sent_unreported = True
        if poll.exhausted:
            self._next_watermark = MAX_EVENT_TIME
        elif poll.watermark is not None:
            self._next_watermark = max(self._next_watermark, min(poll.watermark, MAX_EVENT_TIME))
        if poll.position is not None:
            self._next_position = poll.position
        self._next_exhausted = poll.exhausted
        if self._progress() and self._checkpoint_due():
            self.flush()
        elif not self._progress() and self._heartbeat_due():
            self._outage.retry(lambda: self._report(heartbeat=True))

    def flush(self) -> None:
        """Checkpoint what was sent and report the watermark now, whatever the checkpoint
        interval (a process that stops between polls calls it to leave nothing to re-send)."""
        if not self._started:
            raise InjectorError("start() the injector process before flushing it")
        position, watermark = self._next_position, self._next_watermark
        if position != self._position or watermark != self.watermark:
            checkpoint = Checkpoint(position, watermark)
            self._outage.retry(lambda: self.checkpoints.save(checkpoint))
            self.stats.checkpoints += 1
            self._position = position
        self._last_checkpoint = self.clock.now()
        changed = watermark != self.watermark or self._sent_unreported
        self.watermark = watermark
        self.exhausted = self._next_exhausted
        if changed:
            self._outage.retry(lambda: self._report(heartbeat=False))
            self._sent_unreported = False

    def run(self, *, until_exhausted: bool = False) -> InjectorStats:
        """Start, then step until :meth:`stop` (or, with ``until_exhausted``, until the
        source says its input is complete), then checkpoint what was sent; always closes
        the source."""
        try:
            self.start()
            while not self._stop.is_set():
                self.step()
                if until_exhausted and self.exhausted:
                    break
            if self._progress():
                self.flush()
            return self.stats
        finally:
            self.source.close()

    def stop(self) -> None:
        """Make :meth:`run` return after the current poll (from any thread)."""
        self._stop.set()

    # -- internals ---------------------------------------------------------------------------

    def _join_expected_set(self) -> None:
        messages = self.watermarks.read()
        for _key, message in messages:
            self._note_downstream(message)
        current = latest_expected_set(messages, self.name)
        if current is not None and self.process in current.retired:
            raise InjectorRetiredError(
                f"process {self.process!r} of injector {self.name!r} was retired and may not "
                "run again; start it under a new process name"
            )
        processes = dict.fromkeys(
            (*(current.processes if current else ()), *self.options.expected, self.process)
        )
        streams = dict.fromkeys((*(current.streams if current else ()), *self.streams))
        wanted = ExpectedSet(
            self.name, tuple(streams), tuple(processes), current.retired if current else ()
        )
        if wanted != current:
            self.watermarks.declare(wanted)

    def _productions(self, poll: Poll) -> list[Production]:
        productions: list[Production] = []
        limit = (
            None if self.options.max_future is None else self.clock.now() + self.options.max_future
        )
        for item in poll.records:
            if item.stream not in self.source_streams:
                raise InjectorError(
                    f"the source of injector {self.name!r} read a record for stream "
                    f"{item.stream!r}, which it does not declare in Source.streams "
                    f"{list(self.source_streams)}"
                )
            record_id = injector_record_id(self.name, item.origin, item.offset)
            try:
                check_event_time(item.timestamp)
                if limit is not None and item.timestamp > limit:
                    raise RecordError(
                        f"event time {item.timestamp} µs is more than max_future "
                        f"({self.options.max_future} µs) after now ({self.clock.now()} µs); "
                        "timestamps are integer microseconds since the Unix epoch"
                    )
                record = Record(item.key, item.value, item.timestamp, record_id)
                envelope = encode_record(record)
                check_record_size(envelope)
            except (RecordError, ValueError, TypeError) as exc:
                rejected = RejectedInput.of(item.origin, item.offset, item.value, exc)
                productions.append(self._dead_letter(rejected))
                continue
            productions.append(Production(item.stream, record, envelope))
        productions.extend(self._dead_letter(rejected) for rejected in poll.rejected)
        return productions

    def _dead_letter(self, rejected: RejectedInput) -> Production:
        record_id = injector_record_id(self.name, rejected.origin, rejected.offset)
        letter = DeadLetter(
            computation=self.report_source,
            origin=Origin(stream=rejected.origin, offset=rejected.offset, record_id=record_id),
            error_type=rejected.error_type,
            error_message=rejected.error_message[:MAX_ERROR_MESSAGE_CHARS],
            raw=rejected.raw[:MAX_RAW_BYTES],
            raw_size=len(rejected.raw),
        )
        self.stats.dead_letters += 1
        errors = self.stats.dead_letter_errors
        errors[rejected.error_type] = errors.get(rejected.error_type, 0) + 1
        _log.warning(
            "injector %s: dead letter from %s@%d: %s: %s",
            self.name,
            rejected.origin,
            rejected.offset,
            rejected.error_type,
            rejected.error_message[:200],
        )
        # Stamped with the watermark reported so far: never late, never holding anything.
        return Production(self.dead_letter_stream, letter.to_record(record_id, self.watermark))

    def _send(self, productions: list[Production]) -> None:
        timeout = self.options.send_timeout
        waiting = productions

        def send_waiting() -> None:
            nonlocal waiting
            acknowledged = self.sink.send(waiting, timeout)
            waiting = [p for p in waiting if p.record_id not in acknowledged]
            if waiting:
                # Sending them again is harmless: consumers drop repeats by record ID. The
                # code is librdkafka's for an undelivered message: the outage names Kafka.
                raise TimeoutError(
                    f"Kafka did not acknowledge {len(waiting)} of {len(productions)} "
                    f"records within {timeout} s (_MSG_TIMED_OUT)"
                )

        # An unreachable broker either leaves records unacknowledged or makes the sink
        # raise: both are waited out, and only what Kafka took is ever checkpointed.
        self._outage.retry(send_waiting)
        self.stats.emitted += sum(1 for p in productions if p.stream != self.dead_letter_stream)

    def _report(self, *, heartbeat: bool) -> None:
        self._reports += 1
        sequence = (self.checkpoints.token << _SEQUENCE_SHIFT) + self._reports
        report = WatermarkReport(
            self.report_source,
            self.streams,
            self.watermark,
            sequence,
            self.watermarks.end_offsets(self.streams),
            held_by="heartbeat" if heartbeat else "",
            # Its weight against the other sources of its streams in percentile watermarks.
            records=self.stats.emitted,
        )
        self.watermarks.publish(report)
        self._last_report = self.clock.now()
        self.stats.reports += 1
        self.stats.heartbeats += heartbeat

    def _progress(self) -> bool:
        """Whether anything was sent or read since the last checkpoint and report."""
        return (
            self._sent_unreported
            or self._next_position != self._position
            or self._next_watermark != self.watermark
            or self._next_exhausted != self.exhausted
        )

    def _checkpoint_due(self) -> bool:
        interval = self.options.checkpoint_interval
        return (
            self._next_exhausted
            or self._last_checkpoint is None
            or self.clock.now() - self._last_checkpoint >= interval
        )

    def _poll_timeout(self) -> float:
        """A poll waits no longer than the checkpoint that progress made since is due."""
        timeout = self.options.poll_timeout
        if self._last_checkpoint is None or not self._progress():
            return timeout
        due = self._last_checkpoint + self.options.checkpoint_interval - self.clock.now()
        return max(0.0, min(timeout, due / 1e6))

    def _heartbeat_due(self) -> bool:
        return (
            self._last_report is None
            or self.clock.now() - self._last_report >= self.options.heartbeat
        )

    def _note_downstream(self, message: WatermarkMessage | None) -> None:
        if isinstance(message, WatermarkReport) and message.source in self.options.downstream:
            self._downstream[message.source] = max(
                self._downstream.get(message.source, MIN_EVENT_TIME), message.watermark
            )

    def _wait_for_downstream(self) -> None:
        limit = self.options.skew_limit
        if limit is None or not self.options.downstream:
            return
        while True:
            for _key, message in self.watermarks.read():
                self._note_downstream(message)
            slowest = min(self._downstream.values(), default=None)
            if slowest is None or self.watermark <= slowest + limit or self._stop.is_set():
                return
            self.stats.skew_waits += 1
            if self._heartbeat_due():
                self._report(heartbeat=True)
            self._wait(max(self.options.poll_timeout, 0.01))


def retire_process(channel: WatermarkTopic, injector: str, process: str) -> ExpectedSet:
    """Remove ``process`` from ``injector``'s expected set for good, and delete its report;
    returns the new set. Stop the process first: a retired process refuses to start."""
    current = latest_expected_set(channel.read(), injector)
    if current is None:
        raise InjectorError(
            f"injector {injector!r} has no expected set on the watermark topic; it never ran"
        )
    retired = current.retire(process)
    channel.declare(retired)
    channel.retire(injector_source(injector, process))
    return retired
