"""One computation's batch cycle, as its driver runs it (paper 4.5, 6.2, 7.1).

A runtime runs a computation batch after batch; what happens between the batches is the
same whichever runtime it is (Spark, :class:`~millstream.engine.testing.TopologyHarness`),
and is written here once. Per batch, in this order:

1. :meth:`ComputationDriver.begin`: read the new watermark reports, apply those that the
   batch's consumed offsets have caught up with, and say the watermarks the batch runs
   under (records under the one before its input, event-time timers under the one after)
   and the intervals to run without input (*ticks*: due timers, unacknowledged
   productions, or all of them before each reported once).
2. The runtime runs the batch: each interval with input or a tick, on its
   :class:`~millstream.engine.protocol.IntervalWorker`.
3. :meth:`~ComputationDriver.absorb`: what each interval has left to do, and the load it
   carried (a batch without input says nothing of the load: only ticks ran).
4. :meth:`~ComputationDriver.finish`: with ``ComputationOptions.rebalance``, split or merge
   one interval if the loads measured ask for it (:mod:`~millstream.engine.rebalance`:
   plan, journal, roll forward), then spread the intervals over the runtime's tasks by load.
5. :meth:`~ComputationDriver.report`: the computation's watermark report, if it says
   something new, for the runtime to publish.

The runtime keeps what is its own: where the consumed offsets come from, how a batch is run
and retried, fencing a zombie driver, publishing and waking. Steps that reach the store take
a ``retry`` (for instance :meth:`Outage.retry <millstream.engine.outages.Outage.retry>`):
each of them may be run again after a failure.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Final, Protocol, TypeVar

from millstream.engine.clock import Clock
from millstream.engine.errors import FencedError
from millstream.engine.layout import IntervalLayout, LayoutChange
from millstream.engine.productions import CommitTag
from millstream.engine.rebalance import assign_slots, begin, finish_change, load_shares, plan
from millstream.engine.store import IntervalStore
from millstream.engine.topology import ComputationSpec
from millstream.engine.watermarks import (
    ComputationWatermarks,
    IntervalProgress,
    Offsets,
    ReportReader,
    WatermarkReport,
)

__all__ = [
    "SPREAD_GAIN",
    "BatchPlan",
    "ComputationDriver",
    "IntervalOutcome",
    "Retry",
    "at_once",
]

_log = logging.getLogger(__name__)

_T = TypeVar("_T")

# A driver claims a rebalanced computation's layout once as it starts; each lost
# compare-and-set means another driver changed the layout just then.
_CLAIM_ATTEMPTS: Final = 5

SPREAD_GAIN = 0.8
"""Intervals move between tasks only if that brings the busiest task's load under this share
of what it is: moving an interval costs its task's cached state."""


class Retry(Protocol):
    """How a step that reaches the store is tried: once, or until an outage is over."""

    def __call__(self, action: Callable[[], _T], /) -> _T: ...


def at_once(action: Callable[[], _T], /) -> _T:
    """Try ``action`` once (the :class:`Retry` of a runtime without outages)."""
    return action()


@dataclass(frozen=True, slots=True)
class BatchPlan:
    """What a batch runs under: records under ``watermark`` (the input low watermark before
    the batch's input), event-time timers under ``timer_watermark`` (after it); the
    intervals of ``layout``; and ``ticks``, the intervals to run even without input."""

    watermark: int
    timer_watermark: int
    ticks: list[int]
    layout: IntervalLayout


@dataclass(frozen=True, slots=True)
class IntervalOutcome:
    """What one interval's run in a batch tells the driver: what it has left to do, the
    load it carried (its input ``records``, the wall and CPU ``seconds`` of its work), and
    the ``worker`` that ran it (its owner in this batch, such as ``host:pid``; "": unknown)."""

    interval: int
    progress: IntervalProgress
    records: int = 0
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    worker: str = ""


@dataclass(slots=True)
class _Batch:
    had_input: bool
    ran: list[int] | None = None  # None: not absorbed yet


class ComputationDriver:
    """One computation's batch cycle; see the module docstring.

    ``watermarks`` is the computation's bookkeeping (it outlives a driver: a runtime may
    restart the computation's batches with a new one), ``reader`` its view of the watermark
    topic. ``layout_store`` gives the store that keeps the computation's interval layout
    (read at the first batch; a change a killed driver left journaled is finished then).
    ``tasks``: how many tasks a batch's intervals are spread over; ``cores``: how many the
    job running it has (a computation without ``key_intervals`` starts with one interval
    each, :meth:`~millstream.engine.topology.ComputationOptions.starting_intervals`).
    ``delivered``: the transaction marker of an interval a split or merge retires (see
    :func:`~millstream.engine.rebalance.finish_change`), for transactional productions.
    """

    def __init__(
        self,
        spec: ComputationSpec,
        watermarks: ComputationWatermarks,
        reader: ReportReader,
        *,
        layout_store: Callable[[], IntervalStore],
        clock: Clock,
        tasks: int = 1,
        cores: int | None = None,
        delivered: Callable[[str, int], CommitTag | None] | None = None,
    ) -> None:
        if tasks < 1:
            raise ValueError(f"tasks must be at least 1, got {tasks}")
        self.spec = spec
        self.watermarks = watermarks
        self.reader = reader
        self.layout_store = layout_store
        self.clock = clock
        self.tasks = tasks
        self.cores = cores
        self.delivered = delivered
        self.layout: IntervalLayout | None = None
        # A query's warm-up (on a thread of its own) may load the layout as its first batch
        # begins: one loads it, the other finds it (loading finishes a journaled change).
        self._loading = threading.Lock()
        """The computation's key intervals (``None``: not read yet)."""
        self.assignment: Mapping[int, int] | None = None
        """Each interval's task once the intervals were spread by load (``None``: the
        interval's ID modulo ``tasks``). A new mapping whenever it changes."""
        self.rebalances = 0
        self._batch: _Batch | None = None
        # The watermark reports are read by the batches, and once before the first by a
        # query's warm-up (read_ahead): never at once, and the warm-up's never after a batch.
        self._reading = threading.Lock()
        self._began = False

    def load_layout(self, retry: Retry = at_once) -> IntervalLayout:
        """Read the computation's layout (writing the initial one if there is none), and
        finish a change a killed driver left journaled."""
        with self._loading:
            self.layout = retry(self._current_layout)
            return self.layout

    def current_layout(self, retry: Retry = at_once) -> IntervalLayout:
        """The layout this driver holds, loaded first (:meth:`load_layout`) if it has none;
        safe to call from another thread than the batches'."""
        with self._loading:
            if self.layout is None:
                self.layout = retry(self._current_layout)
            return self.layout

    def begin(self, consumed: Offsets, *, had_input: bool, retry: Retry = at_once) -> BatchPlan:
        """Start a batch that consumes up to ``consumed``; ``had_input``: whether it has
        records (else it runs for ticks and reports only)."""
        layout = self.current_layout(retry)
        watermarks = self.watermarks
        with self._reading:
            self._began = True
            retry(lambda: watermarks.read(self.reader))
        watermark, timer_watermark = watermarks.advance(consumed)
        ticks = watermarks.intervals_to_run(timer_watermark, self.clock.now())
        self._batch = _Batch(had_input)
        return BatchPlan(watermark, timer_watermark, ticks, layout)

    def read_ahead(self, retry: Retry = at_once) -> None:
        """Read the watermark reports so far, unless a batch began: the first read of the
        topic (its consumer's connection, the topic's metadata, the reports from its start)
        is the slow one, some 60 ms, and a query's warm-up makes it here instead of its first
        batch, whose :meth:`begin` then reads only what came since. Safe to call from another
        thread than the batches'."""
        with self._reading:
            if not self._began:
                retry(lambda: self.watermarks.read(self.reader))

    def absorb(self, outcomes: Iterable[IntervalOutcome], *, complete: bool = True) -> None:
        """Take every interval that ran in the batch, once the batch committed.

        ``complete=False``: the batch failed part way and will not run again (a runtime
        without retries, such as the testing harness); the intervals in ``outcomes``
        committed, so what they have left is known. The batch ends there: no :meth:`finish`.
        """
        batch = self._current("absorb")
        if batch.ran is not None:
            raise RuntimeError("absorb takes every interval of a batch at once, and once")
        batch.ran = []
        if not complete:
            self._batch = None
        for outcome in outcomes:
            self.watermarks.record(
                outcome.interval,
                outcome.progress,
                # A batch of ticks alone says nothing of the intervals' load.
                records=outcome.records if batch.had_input else None,
                seconds=outcome.seconds,
                cpu_seconds=outcome.cpu_seconds,
                worker=outcome.worker,
            )
            batch.ran.append(outcome.interval)
        if complete and batch.had_input and batch.ran:
            self.watermarks.intervals.idle_except(batch.ran)

    def finish(self, retry: Retry = at_once) -> LayoutChange | None:
        """Between this batch and the next (no task of the computation runs): split or merge
        one interval if the latest loads ask for it, and spread the intervals over the
        tasks by load. Returns the change made, if any: its new intervals have run no batch
        yet, and one without input finds their work."""
        batch = self._current("finish")
        self._batch = None
        policy = self.spec.options.rebalance
        if policy is None or not batch.ran:
            return None
        layout = self.layout
        assert layout is not None  # read by begin
        intervals = self.watermarks.intervals
        records = intervals.records()
        # One change per measurement: the next waits for a batch with input under this one.
        begun = (
            plan(layout, records, policy, intervals.cpu_seconds(), self.clock.now())
            if intervals.measured
            else None
        )
        change = None if begun is None else begun.change
        if begun is not None and change is not None:
            layout = self._change(layout, begun, retry)
            targets = [target[0] for target in change.targets]
            intervals.replace(change.sources, targets, carry_load=True)
            self.rebalances += 1
            _log.info(
                "computation %r: %s of intervals %s into %s (records per batch: %s)",
                self.spec.name,
                change.kind,
                list(change.sources),
                targets,
                [records.get(s, 0) for s in change.sources],
            )
        self._spread(load_shares(layout.ids, intervals.records(), policy, intervals.cpu_seconds()))
        return change

    def report(
        self,
        sequence: int,
        offsets: Offsets,
        *,
        stats: Mapping[str, int] | None = None,
        driver: str = "",
    ) -> WatermarkReport | None:
        """The computation's report after the batch, covering ``offsets`` (its output
        topics' end offsets), or ``None`` if it says nothing new (or nothing is known yet);
        ``stats``, its counters since ``driver`` (this driver's start) began, and the worker
        that last ran each interval (kept by ``watermarks``: it outlives a driver) go in it."""
        return self.watermarks.report(sequence, offsets, stats=stats, driver=driver)

    def _current(self, step: str) -> _Batch:
        if self._batch is None:
            raise RuntimeError(f"{step} needs a batch: call begin first")
        return self._batch

    def _change(
        self, layout: IntervalLayout, begun: IntervalLayout, retry: Retry
    ) -> IntervalLayout:
        """Journal ``begun``'s change to ``layout`` and roll it forward; the layout after."""
        store = self.layout_store()
        name, ttl = self.spec.name, self.spec.options.dedup_ttl
        retry(lambda: _journal(store, name, layout, begun))
        self.layout = begun
        now = self.clock.now()
        self.layout = retry(
            lambda: finish_change(
                store, name, begun, dedup_ttl=ttl, delivered=self.delivered, now=now
            )
        )
        return self.layout

    def _current_layout(self) -> IntervalLayout:
        """The computation's layout, a change a killed driver left journaled finished, and
        claimed by this driver if its intervals split and merge.

        The claim is a compare-and-set that moves the layout's version on. An earlier
        driver of the computation, stopped rather than killed, planned on the layout it read
        before: whatever change it journals from now on expects that layout and is refused,
        so it cannot retire intervals this driver's tasks work on."""
        store = self.layout_store()
        for _ in range(_CLAIM_ATTEMPTS):
            layout = self._finished_layout(store)
            if self.spec.options.rebalance is None:
                break
            claimed = replace(layout, version=layout.version + 1)
            if store.write_layout(self.spec.name, claimed, layout):
                layout = claimed
                break
        else:
            raise FencedError(
                f"the interval layout of {self.spec.name!r} changed {_CLAIM_ATTEMPTS} times "
                "while this driver started: is another driver of the computation running?"
            )
        self.watermarks.intervals.track(layout.ids)
        return layout

    def _finished_layout(self, store: IntervalStore) -> IntervalLayout:
        """The stored layout (the initial one written if none is), its journaled change
        finished."""
        chosen = self.spec.options.key_intervals
        wanted = self.spec.options.starting_intervals(self.cores)
        layout = store.layout(self.spec.name, wanted)
        # Only a number the options name is worth a warning: the default follows the cores.
        if layout.is_initial and chosen is not None and len(layout.ids) != chosen:
            # Keys live where the stored layout puts them: a new count (or a changed default)
            # would strand their state. Only a rebalance policy moves them.
            _log.warning(
                "computation %r keeps the %d key intervals it was first run with (its "
                "options say %d): key intervals change only by a rebalance policy",
                self.spec.name,
                len(layout.ids),
                chosen,
            )
        if layout.change is not None:
            _log.info("computation %r: finishing a %s", self.spec.name, layout.change.kind)
            layout = finish_change(
                store,
                self.spec.name,
                layout,
                dedup_ttl=self.spec.options.dedup_ttl,
                delivered=self.delivered,
                now=self.clock.now(),
            )
        return layout

    def _spread(self, shares: Mapping[int, float]) -> None:
        layout = self.layout
        assert layout is not None
        tasks = self.tasks
        current = self.assignment or {i: i % tasks for i in layout.ids}
        loads = [0.0] * tasks
        for interval in layout.ids:
            loads[current.get(interval, interval % tasks)] += shares.get(interval, 0.0)
        balanced = assign_slots(layout.ids, shares, tasks)
        best = [0.0] * tasks
        for interval, slot in balanced.items():
            best[slot] += shares.get(interval, 0.0)
        # Moving intervals costs their tasks' cached state: only for a clear gain.
        if set(current) != set(layout.ids) or max(best) < SPREAD_GAIN * max(loads):
            self.assignment = balanced


def _journal(
    store: IntervalStore, computation: str, layout: IntervalLayout, begun: IntervalLayout
) -> None:
    """Journal ``begun``'s change; an earlier attempt whose outcome was unknown may have."""
    if not store.write_layout(computation, begun, layout) and (
        store.read_layout(computation) != begun
    ):
        begin(store, computation, layout, begun)  # raises: another driver changed it
