"""Low watermarks (paper 4.5, 7.2): what bounds the timestamps of a stream's future records.

A *source* is anything that writes to streams and promises something about the timestamps of
what it will still write: a computation (one per topology) or an injector process. It
publishes :class:`WatermarkReport` messages to the compacted watermark topic, keyed by its
name, so the topic keeps each source's latest report. A report says: *after the Kafka offsets
in* ``offsets`` *I will write no record to* ``streams`` *older than* ``watermark`` (whatever
I write older is late).

A consumer (:class:`InputWatermark`) applies a report only once it has consumed its input
topics up to the report's offsets, so a report never overtakes the records it speaks for:
everything the source wrote before the report has been delivered by then. Its input low
watermark is then::

    input(C) = max(previous input(C),
                   min over C's input streams S of min over the sources of S of applied(source, S))

where ``applied(source, S)`` is the highest watermark of the source's applied reports, for the
streams its latest applied report names. A stream that no source reported holds its consumers
at ``MIN_EVENT_TIME``, as does a source the topology expects (a producing computation) that
has not reported it yet. Watermarks never move backwards: per source and stream the applied
value only grows, and a consumer's input watermark is floored by the value it reported before
a restart.

A computation's own low watermark, which it reports for its output streams, is::

    watermark(C) = min(input(C), oldest pending work of any of C's key intervals)

where pending work is an event-time timer or a production not yet acknowledged by Kafka
(:class:`IntervalProgress`). Intervals that did not run in a batch hold their last value.

Cycles: a computation ignores its own reports on its input (a self-loop would otherwise pin
its watermark where it started); a longer cycle holds the watermark of its members.

Injectors run as several processes (paper 5.2). An :class:`ExpectedSet`, keyed by
:func:`injector_group` on the same topic, names the processes of one injector and its
streams: every expected process holds those streams until it reported (a silent one holds
them at its last report), and a retired process holds nothing and is ignored for good.
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol

from sortedcontainers import SortedList

from millstream.engine.errors import WatermarkReportError
from millstream.engine.records import MAX_EVENT_TIME, MIN_EVENT_TIME

if TYPE_CHECKING:
    from millstream.engine.topology import ComputationSpec, Topology

__all__ = [
    "REPORT_VERSION",
    "ComputationWatermarks",
    "ExpectedSet",
    "Hold",
    "InputWatermark",
    "IntervalLoad",
    "IntervalMap",
    "IntervalProgress",
    "Offsets",
    "ReportReader",
    "SourceState",
    "SourceStatus",
    "WatermarkMessage",
    "WatermarkReport",
    "computation_source",
    "computation_watermark",
    "decode_watermark_message",
    "injector_group",
    "injector_source",
    "latest_expected_set",
    "offsets_reached",
    "parse_injector_source",
    "watermark_overview",
]

REPORT_VERSION = 1

Offsets = Mapping[str, Mapping[int, int]]
"""Kafka offsets by topic and partition; an offset is exclusive (the next one to write/read)."""


def computation_source(topology: str, computation: str) -> str:
    """The source name under which a computation of a topology reports."""
    return f"computation/{topology}/{computation}"


def injector_source(injector: str, process: str = "0") -> str:
    """The source name under which one process of an injector reports."""
    return f"injector/{injector}/{process}"


def parse_injector_source(source: str) -> tuple[str, str] | None:
    """The ``(injector, process)`` of an :func:`injector_source` name; ``None`` for another
    kind of source."""
    kind, _, rest = source.partition("/")
    injector, _, process = rest.partition("/")
    if kind != "injector" or not injector or not process or "/" in process:
        return None
    return injector, process


def injector_group(injector: str) -> str:
    """The key of an injector's :class:`ExpectedSet` on the watermark topic."""
    return f"injector/{injector}"


@dataclass(frozen=True, slots=True)
class WatermarkReport:
    """One source's promise about its future records on ``streams``; see the module docstring.

    ``sequence`` orders the reports of one source (a computation uses its batch id); older
    ones are ignored. ``input_watermark`` is a computation's own input low watermark, which
    restores it after a restart. ``held_by`` says what holds ``watermark`` back.

    Heuristic watermarks (paper 7.2), optional: ``percentiles`` maps a percentile (such as
    99.0) to the watermark that that share of the source's work has passed, stragglers set
    aside; ``records`` is how many records the source wrote (its weight against the other
    sources of a stream); ``timer_watermark`` is the percentile input watermark a computation
    fires its event-time timers under, when it opted in to one (restored after a restart).
    ``hot`` names a computation's busiest key intervals, as ``(interval, records)`` in its
    latest batches (for ``millstream watermarks``).
    """

    source: str
    streams: tuple[str, ...]
    watermark: int
    sequence: int
    offsets: Offsets = field(default_factory=dict)
    input_watermark: int | None = None
    held_by: str = ""
    percentiles: Mapping[float, int] = field(default_factory=dict)
    records: int | None = None
    timer_watermark: int | None = None
    hot: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        if not self.source:
            raise WatermarkReportError("a watermark report needs a source name")
        if not MIN_EVENT_TIME <= self.watermark <= MAX_EVENT_TIME:
            raise WatermarkReportError(
                f"watermark {self.watermark} of {self.source!r} is outside "
                f"[{MIN_EVENT_TIME}, {MAX_EVENT_TIME}] µs"
            )
        for percentile, watermark in self.percentiles.items():
            if not 0.0 < percentile < 100.0 or not MIN_EVENT_TIME <= watermark <= MAX_EVENT_TIME:
                raise WatermarkReportError(
                    f"percentile watermark {percentile}: {watermark} of {self.source!r} is "
                    f"outside (0, 100): [{MIN_EVENT_TIME}, {MAX_EVENT_TIME}] µs"
                )

    def encode(self) -> bytes:
        """The message value (JSON, so the topic can be read with any Kafka tool)."""
        document: dict[str, Any] = {
            "version": REPORT_VERSION,
            "source": self.source,
            "streams": list(self.streams),
            "watermark": self.watermark,
            "sequence": self.sequence,
            "offsets": {
                topic: {str(p): o for p, o in sorted(parts.items())}
                for topic, parts in sorted(self.offsets.items())
            },
            "held_by": self.held_by,
        }
        if self.input_watermark is not None:
            document["input_watermark"] = self.input_watermark
        if self.percentiles:
            document["percentiles"] = {f"{p:g}": v for p, v in sorted(self.percentiles.items())}
        if self.records is not None:
            document["records"] = self.records
        if self.timer_watermark is not None:
            document["timer_watermark"] = self.timer_watermark
        if self.hot:
            document["hot"] = [list(pair) for pair in self.hot]
        return json.dumps(document, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, value: bytes) -> WatermarkReport:
        """Parse a message value; raises :class:`WatermarkReportError` saying what is wrong."""
        try:
            document = json.loads(value)
            if document.get("version") != REPORT_VERSION:
                raise WatermarkReportError(
                    f"watermark report version {document.get('version')!r} is not "
                    f"{REPORT_VERSION}; upgrade millstream or fix the producer"
                )
            input_watermark = document.get("input_watermark")
            records = document.get("records")
            timer_watermark = document.get("timer_watermark")
            return cls(
                source=str(document["source"]),
                streams=_streams(document["streams"]),
                watermark=_int(document["watermark"]),
                sequence=_int(document["sequence"]),
                offsets={
                    str(topic): {int(p): _int(o) for p, o in parts.items()}
                    for topic, parts in document.get("offsets", {}).items()
                },
                input_watermark=None if input_watermark is None else _int(input_watermark),
                held_by=str(document.get("held_by", "")),
                percentiles={
                    _percentile(float(p)): _int(v)
                    for p, v in document.get("percentiles", {}).items()
                },
                records=None if records is None else _int(records),
                timer_watermark=None if timer_watermark is None else _int(timer_watermark),
                hot=tuple((_int(i), _int(n)) for i, n in document.get("hot", [])),
            )
        except WatermarkReportError:
            raise
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise WatermarkReportError(
                f"not a watermark report ({type(exc).__name__}: {exc}): {value[:200]!r}"
            ) from exc


def _streams(value: Any) -> tuple[str, ...]:
    # A bare string would otherwise pass as the streams named by its letters.
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise TypeError(f"expected a list of stream names, got {value!r}")
    return tuple(value)


def _percentile(value: float) -> float:
    if not 0.0 < value < 100.0:
        raise ValueError(f"a percentile must be in (0, 100), got {value}")
    return value


def _int(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"expected an integer, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class ExpectedSet:
    """The processes one injector runs as, and the streams they write (paper 5.2).

    Each process in ``processes`` holds ``streams`` for every consumer until it reported, so
    a process that has not started yet or went silent cannot be overtaken by its siblings.
    ``retired`` processes were removed for good: their reports are ignored from then on.
    """

    injector: str
    streams: tuple[str, ...]
    processes: tuple[str, ...]
    retired: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.injector or "/" in self.injector:
            raise WatermarkReportError(
                f"injector name {self.injector!r} must be non-empty and contain no '/'"
            )
        if not self.processes and not self.retired:
            raise WatermarkReportError(f"injector {self.injector!r} names no process")
        for process in (*self.processes, *self.retired):
            if not process or "/" in process:
                raise WatermarkReportError(
                    f"process name {process!r} of injector {self.injector!r} must be "
                    "non-empty and contain no '/'"
                )
        if both := set(self.processes) & set(self.retired):
            raise WatermarkReportError(
                f"injector {self.injector!r}: processes {sorted(both)} are both expected and "
                "retired"
            )

    @property
    def key(self) -> str:
        return injector_group(self.injector)

    @property
    def sources(self) -> frozenset[str]:
        """The report sources of the expected processes."""
        return frozenset(injector_source(self.injector, p) for p in self.processes)

    @property
    def retired_sources(self) -> frozenset[str]:
        return frozenset(injector_source(self.injector, p) for p in self.retired)

    def retire(self, process: str) -> ExpectedSet:
        """This set without ``process``, which is remembered as retired."""
        if process not in self.processes:
            raise WatermarkReportError(
                f"process {process!r} is not expected of injector {self.injector!r} "
                f"(expected: {sorted(self.processes)}, retired: {sorted(self.retired)})"
            )
        return ExpectedSet(
            self.injector,
            self.streams,
            tuple(p for p in self.processes if p != process),
            tuple(sorted({*self.retired, process})),
        )

    def encode(self) -> bytes:
        document = {
            "version": REPORT_VERSION,
            "kind": "expected",
            "injector": self.injector,
            "streams": list(self.streams),
            "processes": list(self.processes),
            "retired": list(self.retired),
        }
        return json.dumps(document, separators=(",", ":")).encode()


WatermarkMessage = WatermarkReport | ExpectedSet
"""What the watermark topic carries: reports, and injectors' expected sets."""


def decode_watermark_message(value: bytes) -> WatermarkMessage:
    """Parse a watermark topic value; raises :class:`WatermarkReportError` if it is neither."""
    try:
        document = json.loads(value)
        kind = document.get("kind", "report")
    except (ValueError, TypeError, AttributeError) as exc:
        raise WatermarkReportError(
            f"not a watermark message ({type(exc).__name__}: {exc}): {value[:200]!r}"
        ) from exc
    if kind == "report":
        return WatermarkReport.decode(value)
    if kind != "expected":
        raise WatermarkReportError(f"unknown watermark message kind {kind!r}: {value[:200]!r}")
    try:
        if document.get("version") != REPORT_VERSION:
            raise WatermarkReportError(
                f"expected-set version {document.get('version')!r} is not {REPORT_VERSION}; "
                "upgrade millstream or fix the producer"
            )
        return ExpectedSet(
            injector=str(document["injector"]),
            streams=_streams(document["streams"]),
            processes=_streams(document["processes"]),
            retired=_streams(document.get("retired", [])),
        )
    except WatermarkReportError:
        raise
    except (ValueError, TypeError, KeyError) as exc:
        raise WatermarkReportError(
            f"not an expected set ({type(exc).__name__}: {exc}): {value[:200]!r}"
        ) from exc


def latest_expected_set(
    messages: Iterable[tuple[str, WatermarkMessage | None]], injector: str
) -> ExpectedSet | None:
    """``injector``'s expected set as of the last of ``messages`` (topic order), if any."""
    found: ExpectedSet | None = None
    for key, message in messages:
        if key == injector_group(injector):
            found = message if isinstance(message, ExpectedSet) else None
    return found


def offsets_reached(consumed: Offsets, required: Offsets, topics: Iterable[str]) -> bool:
    """Whether ``consumed`` is at or past ``required`` on every partition of ``topics``."""
    for topic in topics:
        have = consumed.get(topic, {})
        for partition, offset in required.get(topic, {}).items():
            if have.get(partition, 0) < offset:
                return False
    return True


@dataclass(frozen=True, slots=True)
class Hold:
    """What holds one input stream's watermark: the lowest source, or why there is none."""

    stream: str
    watermark: int
    source: str | None
    reason: str

    def __str__(self) -> str:
        return f"{self.stream}: {self.watermark} held by {self.source or '-'} ({self.reason})"


@dataclass
class _SourceState:
    # Per stream of the latest applied report (a report speaks for all the source's streams).
    applied: dict[str, int] = field(default_factory=dict)
    sequence: int = -1
    pending: list[WatermarkReport] = field(default_factory=list)
    held_by: str = ""
    # Of the latest applied report: its percentile watermarks (each only grows), its weight.
    percentiles: dict[float, int] = field(default_factory=dict)
    records: int | None = None


class InputWatermark:
    """One computation's input low watermark, from the reports of its inputs' sources.

    ``streams`` maps each input stream to its topic; ``expected`` maps a stream to the sources
    that must have reported before it can move (its producing computations); ``own`` is the
    computation's own source, ignored on its input. ``floor`` is the last input watermark it
    reported (a restart never goes below it).

    ``percentiles`` are the heuristic input watermarks to keep besides the exact one (paper
    7.2): per stream, the sources' watermarks (their own percentile watermark when their
    report has one) weighted by the records each wrote, the lowest set aside while they
    weigh at most (100 - p) % of the stream's records; the lowest stream's value, never below
    the exact watermark, never moving back. A source the stream expects that has not
    reported holds it as it holds the exact one: nothing is known to set aside.
    """

    def __init__(
        self,
        streams: Mapping[str, str],
        *,
        expected: Mapping[str, Iterable[str]] | None = None,
        own: str | None = None,
        floor: int = MIN_EVENT_TIME,
        percentiles: Iterable[float] = (),
    ) -> None:
        self.streams = dict(streams)
        self.expected = {s: frozenset(sources) for s, sources in (expected or {}).items()}
        self.own = own
        self._sources: dict[str, _SourceState] = {}
        self._declared: dict[str, ExpectedSet] = {}
        self._current = floor
        self._percentiles = {_percentile(p): floor for p in percentiles}
        self.ignored = 0

    @property
    def current(self) -> int:
        return self._current

    def raise_floor(self, floor: int) -> None:
        self._current = max(self._current, floor)
        for p, value in self._percentiles.items():
            self._percentiles[p] = max(value, self._current)

    def percentile(self, p: float) -> int:
        """The ``p`` percentile input watermark as of the last :meth:`advance`."""
        return self._percentiles[p]

    def raise_percentile_floor(self, p: float, floor: int) -> None:
        if p in self._percentiles:
            self._percentiles[p] = max(self._percentiles[p], floor)

    def forget(self, source: str) -> None:
        """A source was retired: it holds nothing any more (unless the topology expects it).

        ``source`` may also be an :func:`injector_group`: its expected set no longer holds.
        """
        self._sources.pop(source, None)
        self._declared.pop(source, None)

    def declare(self, expected: ExpectedSet) -> None:
        """An injector's processes: each holds its streams until it reported."""
        self._declared[expected.key] = expected
        for source in expected.retired_sources:
            self._sources.pop(source, None)

    def _retired(self, source: str) -> bool:
        return any(source in declared.retired_sources for declared in self._declared.values())

    def _expected(self, stream: str) -> frozenset[str]:
        expected = self.expected.get(stream, frozenset())
        for declared in self._declared.values():
            if stream in declared.streams:
                expected |= declared.sources
        return expected - {self.own}

    def offer(self, report: WatermarkReport) -> bool:
        """Take a report read from the topic; returns whether it concerns these inputs."""
        if report.source == self.own or not set(report.streams) & self.streams.keys():
            return False
        if self._retired(report.source):
            self.ignored += 1
            return True
        state = self._sources.setdefault(report.source, _SourceState())
        if report.sequence < state.sequence:
            self.ignored += 1
            return True
        state.sequence = report.sequence
        state.pending.append(report)
        return True

    def advance(self, consumed: Offsets) -> int:
        """Apply every report ``consumed`` has caught up with; returns the input watermark."""
        topics = list(self.streams.values())
        for state in self._sources.values():
            for index in range(len(state.pending) - 1, -1, -1):
                report = state.pending[index]
                if offsets_reached(consumed, report.offsets, topics):
                    if report.watermark >= max(state.applied.values(), default=MIN_EVENT_TIME):
                        state.held_by = report.held_by
                    # A stream counts only once a reached report names it: a pending report
                    # must not speak for a stream it adds, nor an old one for a new stream.
                    state.applied = {
                        stream: max(state.applied.get(stream, report.watermark), report.watermark)
                        for stream in report.streams
                    }
                    state.percentiles = {
                        p: max(state.percentiles.get(p, value), value)
                        for p, value in report.percentiles.items()
                    }
                    state.records = report.records
                    del state.pending[: index + 1]
                    break
        holds = self.explain()
        lowest = min((hold.watermark for hold in holds), default=MIN_EVENT_TIME)
        self._current = max(self._current, lowest)
        for p, value in self._percentiles.items():
            heuristic = min(
                (self._stream_percentile(stream, p) for stream in self.streams),
                default=MIN_EVENT_TIME,
            )
            self._percentiles[p] = max(value, self._current, heuristic)
        return self._current

    def _stream_percentile(self, stream: str, p: float) -> int:
        if any(
            stream not in getattr(self._sources.get(name), "applied", {})
            for name in self._expected(stream)
        ):
            return MIN_EVENT_TIME  # an expected source not heard from: nothing to set aside
        weighted = sorted(
            (max(applied, state.percentiles.get(p, applied)), max(1, state.records or 0))
            for state in self._sources.values()
            if (applied := state.applied.get(stream)) is not None
        )
        allowance = sum(weight for _, weight in weighted) * (100.0 - p) / 100.0
        skipped = 0
        for watermark, weight in weighted:
            skipped += weight
            if skipped > allowance:
                return watermark
        return MIN_EVENT_TIME  # no source reports this stream

    def applied(self) -> dict[str, int]:
        """Per source with an applied report, the lowest watermark it holds these inputs at.

        Safe to call from another thread than the one advancing the watermark.
        """
        return {
            name: min(applied)
            for name, state in list(self._sources.items())
            if (applied := list(state.applied.values()))
        }

    def explain(self) -> list[Hold]:
        """Per input stream, its watermark and what holds it (lowest first)."""
        holds: list[Hold] = []
        for stream in sorted(self.streams):
            candidates: list[tuple[int, str, str]] = []
            for name in self._expected(stream):
                state = self._sources.get(name)
                if state is None or stream not in state.applied:
                    waiting = state is not None and any(stream in r.streams for r in state.pending)
                    reason = "report not yet reached by the input" if waiting else "no report yet"
                    candidates.append((MIN_EVENT_TIME, name, reason))
            for name, state in self._sources.items():
                if stream in state.applied:
                    candidates.append((state.applied[stream], name, state.held_by or "reported"))
            if not candidates:
                holds.append(Hold(stream, MIN_EVENT_TIME, None, "no source reports this stream"))
                continue
            watermark, source, reason = min(candidates)
            holds.append(Hold(stream, watermark, source, reason))
        return sorted(holds, key=lambda hold: (hold.watermark, hold.stream))


@dataclass(frozen=True, slots=True)
class IntervalProgress:
    """What a key interval still has to do after a batch (its soft state, summarised).

    ``oldest_work``: the earliest event-time timer or unacknowledged production timestamp;
    ``next_event_timer`` / ``next_wall_timer``: the earliest timer of each domain; ``pending``:
    unacknowledged productions. ``None``: there is none.
    """

    oldest_work: int | None = None
    next_event_timer: int | None = None
    next_wall_timer: int | None = None
    pending: int = 0

    def needs_run(self, watermark: int, now: int) -> bool:
        """Whether the interval has work without input: a due timer or a resend."""
        return (
            self.pending > 0
            or (self.next_event_timer is not None and self.next_event_timer < watermark)
            or (self.next_wall_timer is not None and self.next_wall_timer <= now)
        )


@dataclass(frozen=True, slots=True)
class IntervalLoad:
    """One interval's share of its computation's work in the latest batch with input: its
    records, the wall and CPU seconds of its task, and its pending work (oldest first)."""

    interval: int
    records: int
    seconds: float
    oldest_work: int | None
    cpu_seconds: float = 0.0


_ANY_INTERVAL = 2**63  # above every interval ID: an index range bound on the time alone
_NO_LOAD: Final = (0, 0.0, 0.0)


class IntervalMap:
    """What each key interval of one computation has left after its latest batch.

    ``intervals`` is how many there are (IDs ``0 .. intervals-1``), or their IDs; until each
    reported once, the map is not :attr:`complete` (their pending work is unknown, so no
    watermark can be said). :meth:`replace` follows a split or merge.
    """

    def __init__(self, intervals: int | Iterable[int]) -> None:
        self._live = set(range(intervals) if isinstance(intervals, int) else intervals)
        self._progress: dict[int, IntervalProgress] = {}
        # Records, seconds and CPU seconds of the latest batch with input each ran in (the
        # percentile's weights); those in _idle carried nothing in the latest one.
        self._load: dict[int, tuple[int, float, float]] = {}
        self._idle: set[int] = set()
        self._estimated: set[int] = set()  # loads carried over by replace, not measured
        self._work: SortedList[tuple[int, int]] = SortedList()  # (oldest_work, interval)
        self._event: SortedList[tuple[int, int]] = SortedList()  # (next_event_timer, interval)
        self._wall: SortedList[tuple[int, int]] = SortedList()  # (next_wall_timer, interval)
        self._pending: set[int] = set()
        self._records = 0

    def __len__(self) -> int:
        return len(self._progress)

    def __contains__(self, interval: object) -> bool:
        return interval in self._progress

    def get(self, interval: int) -> IntervalProgress | None:
        return self._progress.get(interval)

    @property
    def intervals(self) -> int:
        return len(self._live)

    @property
    def ids(self) -> frozenset[int]:
        return frozenset(self._live)

    @property
    def complete(self) -> bool:
        return len(self._progress) >= len(self._live)

    def replace(
        self, sources: Iterable[int], targets: Iterable[int], *, carry_load: bool = False
    ) -> None:
        """``sources`` were split or merged into ``targets``, whose work is unknown yet.

        With ``carry_load`` the targets share the load the sources carried in the latest
        batch with input, evenly (a split halves it, a merge sums it), until they carry their
        own: taken for idle, the halves of a hot interval would share one task and merge
        again at once, to split at the next input. Until then the map is not
        :attr:`measured`."""
        sources, targets = list(sources), list(targets)
        carried = [self._latest(interval) for interval in sources]
        for interval in sources:
            self._forget(interval)
            self._live.discard(interval)
        self._live.update(targets)
        if carry_load and targets:
            records = sum(load[0] for load in carried)
            seconds = sum(load[1] for load in carried)
            cpu = sum(load[2] for load in carried)
            whole, rest = divmod(records, len(targets))
            for index, interval in enumerate(targets):
                share = (whole + (index < rest), seconds / len(targets), cpu / len(targets))
                self._set_load(interval, share)
                self._estimated.add(interval)

    def track(self, ids: Iterable[int]) -> None:
        """Follow exactly the intervals ``ids`` (a layout read at start)."""
        wanted = set(ids)
        self.replace(self._live - wanted, wanted - self._live)

    def _forget(self, interval: int) -> None:
        old = self._progress.pop(interval, None)
        if old is not None:
            _discard(self._work, old.oldest_work, interval)
            _discard(self._event, old.next_event_timer, interval)
            _discard(self._wall, old.next_wall_timer, interval)
        self._pending.discard(interval)
        self._idle.discard(interval)
        self._estimated.discard(interval)
        records, _, _ = self._load.pop(interval, _NO_LOAD)
        self._records -= records

    def record(
        self,
        interval: int,
        progress: IntervalProgress,
        records: int | None = 0,
        seconds: float = 0.0,
        cpu_seconds: float = 0.0,
    ) -> None:
        """Apply one interval's report: its progress after a batch, and the load it carried
        (``records=None``: a batch without input, which says nothing of its load, keeps the
        load it had). A report of an interval no longer in the map (split or merged away) is
        ignored."""
        if interval not in self._live:
            return
        old = self._progress.get(interval)
        if old is not None:
            _discard(self._work, old.oldest_work, interval)
            _discard(self._event, old.next_event_timer, interval)
            _discard(self._wall, old.next_wall_timer, interval)
        self._progress[interval] = progress
        _add(self._work, progress.oldest_work, interval)
        _add(self._event, progress.next_event_timer, interval)
        _add(self._wall, progress.next_wall_timer, interval)
        if progress.pending:
            self._pending.add(interval)
        else:
            self._pending.discard(interval)
        if records is not None:
            self._set_load(interval, (records, seconds, cpu_seconds))
            self._estimated.discard(interval)

    def idle_except(self, ran: Iterable[int]) -> None:
        """A batch with input ran only the intervals ``ran``: every other one carried no
        records in it (so a load it carried long ago neither splits it nor keeps it from
        merging). Their weight in :meth:`percentile_work` stays that of the latest batch
        with input they ran in: a small batch that missed an interval says little of the
        share of the data behind it."""
        self._idle = self._load.keys() - set(ran)
        self._estimated -= self._idle

    @property
    def measured(self) -> bool:
        """Whether every load is one a batch with input measured, none carried over from a
        split or merge: a plan on estimates would split halves a hot key leaves cold."""
        return not self._estimated

    def _set_load(self, interval: int, load: tuple[int, float, float]) -> None:
        before = self._load.get(interval, _NO_LOAD)[0]
        self._load[interval] = load
        self._idle.discard(interval)
        self._records += load[0] - before

    def _latest(self, interval: int) -> tuple[int, float, float]:
        """The load ``interval`` carried in the latest batch with input."""
        return _NO_LOAD if interval in self._idle else self._load.get(interval, _NO_LOAD)

    def oldest_work(self) -> tuple[int, int] | None:
        """The earliest pending work of any interval, and that interval."""
        return self._work[0] if self._work else None

    def next_event_timer(self) -> int | None:
        return self._event[0][0] if self._event else None

    def next_wall_timer(self) -> int | None:
        return self._wall[0][0] if self._wall else None

    def due(self, watermark: int, now: int) -> list[int]:
        """Intervals with work but maybe no input (ascending): unknown ones, unacknowledged
        productions, an event-time timer under ``watermark``, a wall-time timer at ``now``."""
        due = set(self._pending)
        due.update(i for _, i in self._event.irange(maximum=(watermark - 1, _ANY_INTERVAL)))
        due.update(i for _, i in self._wall.irange(maximum=(now, _ANY_INTERVAL)))
        if not self.complete:
            due.update(i for i in self._live if i not in self._progress)
        return sorted(due)

    def percentile_work(self, percentile: float) -> int | None:
        """The pending work ``percentile`` % of the load has passed: the oldest work of the
        intervals once the oldest ones carrying at most (100 - ``percentile``) % of the
        records are set aside (paper 7.2: stragglers stripped away). Every interval weighs at
        least one record, so a quiet interval with old work is set aside only when the rest
        outweigh it. ``None`` when nothing is pending beyond that."""
        total = self._records + len(self._progress)
        allowance = total * (100.0 - percentile) / 100.0
        skipped = 0.0
        for work, interval in self._work:
            skipped += self._load.get(interval, _NO_LOAD)[0] + 1
            if skipped > allowance:
                return int(work)
        return None

    def records(self) -> dict[int, int]:
        """Each interval's records in the latest batch with input (for rebalancing)."""
        return {interval: self._latest(interval)[0] for interval in self._load}

    def cpu_seconds(self) -> dict[int, float]:
        """Each interval's CPU seconds in the latest batch with input (for rebalancing)."""
        return {interval: self._latest(interval)[2] for interval in self._load}

    def hottest(self, limit: int = 5) -> list[IntervalLoad]:
        """The intervals that carried the most records in the latest batch with input (then
        seconds)."""
        latest = ((interval, self._latest(interval)) for interval in self._load)
        ranked = heapq.nlargest(limit, latest, key=lambda item: item[1])
        return [
            IntervalLoad(interval, records, seconds, self._oldest_work(interval), cpu)
            for interval, (records, seconds, cpu) in ranked
        ]

    def _oldest_work(self, interval: int) -> int | None:
        progress = self._progress.get(interval)
        return None if progress is None else progress.oldest_work

    def values(self) -> Iterator[IntervalProgress]:
        return iter(self._progress.values())


def _add(index: SortedList[tuple[int, int]], at: int | None, interval: int) -> None:
    if at is not None:
        index.add((at, interval))


def _discard(index: SortedList[tuple[int, int]], at: int | None, interval: int) -> None:
    if at is not None:
        index.discard((at, interval))


def computation_watermark(
    input_watermark: int, intervals: Mapping[int, IntervalProgress]
) -> tuple[int, str]:
    """A computation's low watermark and what holds it: see the module docstring."""
    oldest = min(
        ((p.oldest_work, i) for i, p in intervals.items() if p.oldest_work is not None),
        default=None,
    )
    return _held(input_watermark, oldest)


def _held(input_watermark: int, oldest_work: tuple[int, int] | None) -> tuple[int, str]:
    """The lower of the input watermark and the oldest pending work (and its interval)."""
    if oldest_work is not None and oldest_work[0] < input_watermark:
        return oldest_work[0], f"interval {oldest_work[1]}"
    return input_watermark, "input"


class ReportReader(Protocol):
    """Where a driver reads reports from (``connectors.kafka.WatermarkReader``)."""

    def read(self, timeout: float = ...) -> list[tuple[str, WatermarkMessage | None]]: ...


class ComputationWatermarks:
    """The driver's watermark bookkeeping for one computation, batch by batch.

    Per batch: :meth:`read` new reports, :meth:`advance` to the offsets the batch consumes
    (records run under the watermark before, timers under the one after), run the batch's
    intervals plus :meth:`intervals_to_run`, :meth:`record` what each interval has left, and
    publish :meth:`report` if it says something new.

    Until every interval ran once under this driver, their pending work is unknown: the first
    batch runs them all, and no report is made before it.

    Percentile watermarks (paper 7.2), when asked for: ``timer_percentile`` makes the
    computation's records and event-time timers run under its input's ``timer_percentile``
    watermark instead of the exact one (:meth:`advance` returns it; records behind it count
    as late); ``percentiles`` are those its reports carry (its consumers' choices), each the
    lower of that percentile of its input and of its intervals' pending work weighted by their
    load (:meth:`IntervalMap.percentile_work`). The exact watermark is kept and reported
    either way.
    """

    def __init__(
        self,
        source: str,
        *,
        inputs: Mapping[str, str],
        outputs: Sequence[str],
        expected: Mapping[str, Iterable[str]],
        key_intervals: int,
        percentiles: Iterable[float] = (),
        timer_percentile: float | None = None,
    ) -> None:
        self.source = source
        self.outputs = tuple(outputs)
        self.key_intervals = key_intervals
        self.timer_percentile = timer_percentile
        self.percentiles = tuple(sorted(set(percentiles)))
        tracked = {*self.percentiles, *([timer_percentile] if timer_percentile else [])}
        self.input = InputWatermark(inputs, expected=expected, own=source, percentiles=tracked)
        self.intervals = IntervalMap(key_intervals)
        self.watermark = MIN_EVENT_TIME
        self.percentile_watermarks = dict.fromkeys(self.percentiles, MIN_EVENT_TIME)
        self.held_by = "not reported yet"
        self.records = 0
        self._published: tuple[object, ...] | None = None

    @classmethod
    def of(
        cls,
        topology: Topology,
        spec: ComputationSpec,
        topic: Callable[[str], str] = lambda stream: stream,
    ) -> ComputationWatermarks:
        """The bookkeeping of ``spec`` in ``topology``: its input streams (read from
        ``topic(stream)``) expect a report from each computation producing them, and its own
        report speaks for its outputs, its dead-letter stream and its late stream, with the
        percentile watermarks the consumers of those streams run under."""
        written = spec.produced_streams
        return cls(
            computation_source(topology.name, spec.name),
            inputs={i.stream: topic(i.stream) for i in spec.inputs},
            outputs=written,
            expected={
                i.stream: [
                    computation_source(topology.name, p.name) for p in topology.producers(i.stream)
                ]
                for i in spec.inputs
            },
            key_intervals=spec.options.key_intervals,
            percentiles={
                p
                for stream in written
                for consumer in topology.consumers(stream)
                if (p := consumer.options.watermark_percentile) is not None
            },
            timer_percentile=spec.options.watermark_percentile,
        )

    def read(self, reader: ReportReader) -> None:
        for source, report in reader.read():
            if report is None:
                self.input.forget(source)
            elif isinstance(report, ExpectedSet):
                self.input.declare(report)
            elif source == self.source:
                # Our own last report: where the watermarks were before a restart.
                if report.input_watermark is not None:
                    self.input.raise_floor(report.input_watermark)
                self.watermark = max(self.watermark, report.watermark)
                for p, value in report.percentiles.items():
                    if p in self.percentile_watermarks:
                        self.percentile_watermarks[p] = max(self.percentile_watermarks[p], value)
                if self.timer_percentile is not None and report.timer_watermark is not None:
                    self.input.raise_percentile_floor(self.timer_percentile, report.timer_watermark)
                self.records = max(self.records, report.records or 0)
            else:
                self.input.offer(report)

    def advance(self, consumed: Offsets) -> tuple[int, int]:
        """The input watermark before and after consuming up to ``consumed``: the one records
        and timers run under (the ``timer_percentile`` one when the computation chose it)."""
        before = self.timer_watermark
        self.input.advance(consumed)
        return before, self.timer_watermark

    @property
    def timer_watermark(self) -> int:
        """The input watermark records and event-time timers run under."""
        if self.timer_percentile is None:
            return self.input.current
        return self.input.percentile(self.timer_percentile)

    @property
    def all_known(self) -> bool:
        return self.intervals.complete

    def intervals_to_run(self, watermark: int, now: int) -> list[int]:
        """Intervals with work but maybe no input: due timers, resends, or unknown ones."""
        return self.intervals.due(watermark, now)

    def record(
        self,
        interval: int,
        progress: IntervalProgress,
        records: int | None = 0,
        seconds: float = 0.0,
        cpu_seconds: float = 0.0,
    ) -> None:
        """An interval's report after a batch: what it has left, and the load it carried
        (``None``: a batch without input; see :meth:`IntervalMap.record`)."""
        self.intervals.record(interval, progress, records, seconds, cpu_seconds)
        self.records += records or 0

    def report(self, sequence: int, offsets: Offsets) -> WatermarkReport | None:
        """The report to publish after a batch, or ``None`` if nothing changed (or unknown)."""
        if not self.all_known:
            return None
        watermark, held_by = _held(self.input.current, self.intervals.oldest_work())
        # Never backwards, also when a late production is pending below what we reported.
        self.watermark, self.held_by = max(self.watermark, watermark), held_by
        for p, before in self.percentile_watermarks.items():
            work = self.intervals.percentile_work(p)
            heuristic = (
                self.input.percentile(p) if work is None else min(self.input.percentile(p), work)
            )
            self.percentile_watermarks[p] = max(before, self.watermark, heuristic)
        timers = None if self.timer_percentile is None else self.timer_watermark
        said = (
            self.watermark,
            self.input.current,
            tuple(self.percentile_watermarks.items()),
            timers,
        )
        if said == self._published:
            return None
        self._published = said
        return WatermarkReport(
            source=self.source,
            streams=self.outputs,
            watermark=self.watermark,
            sequence=sequence,
            offsets=offsets,
            input_watermark=self.input.current,
            held_by=held_by,
            percentiles=dict(self.percentile_watermarks),
            records=self.records or None,
            timer_watermark=timers,
            hot=tuple((h.interval, h.records) for h in self.intervals.hottest(3) if h.records),
        )


SourceState = Literal["reporting", "complete", "no report yet"]
"""Where a source stands (:class:`SourceStatus`): it reported a time; it reported
``MAX_EVENT_TIME``, the end of time (its input ended: it will write nothing more); or it has
reported no time yet (an expected injector process that is silent, or a report still at
``MIN_EVENT_TIME``, such as an injector's first or a computation's whose inputs have none)."""


@dataclass(frozen=True, slots=True)
class SourceStatus:
    """One source as the watermark topic shows it (``millstream watermarks``).

    ``watermark`` is the time the source reported, ``None`` while it has reported none
    (``state`` "no report yet": it holds its streams at the beginning of time); ``lag`` is wall
    time minus the watermark (µs), never below 0 (a watermark ahead of the clock has no lag),
    and ``None`` unless ``state`` is "reporting": a complete source lags behind nothing.
    """

    source: str
    watermark: int | None
    lag: int | None
    held_by: str
    streams: tuple[str, ...]
    input_watermark: int | None = None
    percentiles: Mapping[float, int] = field(default_factory=dict)
    timer_watermark: int | None = None
    hot: tuple[tuple[int, int], ...] = ()
    state: SourceState = "reporting"


def watermark_overview(
    messages: Iterable[tuple[str, WatermarkMessage | None]], now: int
) -> list[SourceStatus]:
    """Every source's latest report, and the expected injector processes that are silent,
    from the watermark topic's messages in topic order; lowest watermark first."""
    reports: dict[str, WatermarkReport] = {}
    expected: dict[str, ExpectedSet] = {}
    for key, message in messages:
        if message is None:
            reports.pop(key, None)
            expected.pop(key, None)
        elif isinstance(message, ExpectedSet):
            expected[message.key] = message
        elif message.sequence >= getattr(reports.get(message.source), "sequence", -1):
            reports[message.source] = message
    retired = {s for declared in expected.values() for s in declared.retired_sources}
    rows = []
    for source, report in reports.items():
        if source in retired:
            continue
        state = _source_state(report.watermark)
        rows.append(
            SourceStatus(
                source,
                None if state == "no report yet" else report.watermark,
                max(0, now - report.watermark) if state == "reporting" else None,
                report.held_by or "reported",
                report.streams,
                report.input_watermark,
                report.percentiles,
                report.timer_watermark,
                report.hot,
                state,
            )
        )
    for declared in expected.values():
        for source in sorted(declared.sources - reports.keys()):
            rows.append(
                SourceStatus(
                    source,
                    None,
                    None,
                    "expected, never reported: holds",
                    declared.streams,
                    state="no report yet",
                )
            )
    return sorted(rows, key=lambda row: (row.watermark is not None, row.watermark or 0, row.source))


def _source_state(watermark: int) -> SourceState:
    if watermark >= MAX_EVENT_TIME:
        return "complete"
    if watermark <= MIN_EVENT_TIME:
        return "no report yet"
    return "reporting"
