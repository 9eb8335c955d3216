"""A computation's input low watermark, from the reports of its inputs' sources, each
applied once the input it covers was consumed (see :mod:`millstream.engine.watermarks`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from millstream.engine.records import MIN_EVENT_TIME
from millstream.engine.watermarks.report import (
    ExpectedSet,
    Offsets,
    WatermarkReport,
    _percentile,
)

__all__ = ["Hold", "InputWatermark", "offsets_reached"]


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
