"""One computation's watermark bookkeeping on its driver, batch by batch: its input's
watermark, its intervals' pending work, and the report it publishes (see
:mod:`millstream.engine.watermarks`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from millstream.engine.records import MIN_EVENT_TIME
from millstream.engine.watermarks.input import InputWatermark
from millstream.engine.watermarks.intervals import IntervalMap, IntervalProgress
from millstream.engine.watermarks.report import (
    BEHIND,
    ExpectedSet,
    Offsets,
    WatermarkMessage,
    WatermarkReport,
    computation_source,
)

if TYPE_CHECKING:
    from millstream.engine.topology import ComputationSpec, Topology

__all__ = ["ComputationWatermarks", "ReportReader", "computation_watermark"]


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
    """Where a driver reads reports from: the reading half of the watermark topic
    (:class:`~millstream.engine.watermark_topic.WatermarkTopic`), such as a watermark
    authority's subscription."""

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
        self.workers: dict[int, str] = {}  # interval -> the worker that last ran it
        # How far the input topics were read (reported for the live view's Kafka lag).
        self.consumed: dict[str, dict[int, int]] = {}
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
            key_intervals=spec.options.starting_intervals(),
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
        for topic in self.input.streams.values():
            if topic in consumed:
                self.consumed[topic] = {**self.consumed.get(topic, {}), **consumed[topic]}
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
        worker: str = "",
    ) -> None:
        """An interval's report after a batch: what it has left, the load it carried
        (``None``: a batch without input; see :meth:`IntervalMap.record`), and the worker
        that ran it (its owner; "": not known)."""
        self.intervals.record(interval, progress, records, seconds, cpu_seconds)
        self.records += records or 0
        if worker:
            self.workers[interval] = worker

    def report(
        self,
        sequence: int,
        offsets: Offsets,
        *,
        stats: Mapping[str, int] | None = None,
        driver: str = "",
    ) -> WatermarkReport | None:
        """The report to publish after a batch, or ``None`` if nothing changed (or unknown);
        ``stats`` and ``driver`` go in it as they are, with the worker that last ran each
        interval (for the live view)."""
        for gone in set(self.workers) - self.intervals.ids:  # split or merged away
            del self.workers[gone]
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
        # Never below the reported watermark either (a late production's interval is at it).
        behind = (
            tuple(
                (interval, max(work, self.watermark))
                for interval, work in self.intervals.behind(self.input.current, BEHIND)
            )
            if self.watermark < self.input.current
            else ()
        )
        said = (
            self.watermark,
            self.input.current,
            behind,
            tuple(self.percentile_watermarks.items()),
            timers,
            tuple((t, tuple(sorted(p.items()))) for t, p in sorted(self.consumed.items())),
            tuple(sorted((stats or {}).items())),
            driver,
            tuple(sorted(self.workers.items())),
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
            behind=behind,
            consumed={t: dict(p) for t, p in self.consumed.items()},
            stats=dict(stats or {}),
            driver=driver,
            workers=_by_worker(self.workers),
        )


def _by_worker(workers: Mapping[int, str]) -> dict[str, tuple[int, ...]]:
    """Each worker's intervals, ascending: one name per worker, however many intervals."""
    grouped: dict[str, list[int]] = {}
    for interval, worker in sorted(workers.items()):
        grouped.setdefault(worker, []).append(interval)
    return {worker: tuple(intervals) for worker, intervals in sorted(grouped.items())}
