"""One computation's batch cycle (the driver's part), as both runtimes run it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace
from typing import TypeVar

import pytest

from millstream.engine.authority import WatermarkAuthority
from millstream.engine.clock import ManualClock
from millstream.engine.computation import Computation
from millstream.engine.context import Context
from millstream.engine.driver import ComputationDriver, IntervalOutcome
from millstream.engine.errors import FencedError
from millstream.engine.layout import IntervalLayout
from millstream.engine.rebalance import RebalancePolicy
from millstream.engine.records import MIN_EVENT_TIME, Record
from millstream.engine.stores.memory.store import MemoryIntervalStore
from millstream.engine.topology import DEFAULT_KEY_INTERVALS, ComputationOptions, Topology
from millstream.engine.watermarks import (
    ComputationWatermarks,
    IntervalProgress,
    WatermarkMessage,
    WatermarkReport,
    injector_source,
)

pytestmark = pytest.mark.unit

_T = TypeVar("_T")


class Count(Computation):
    def process_record(self, ctx: Context, record: Record) -> None:
        pass


class Topic:
    """A watermark topic holding what a test puts on it."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, WatermarkMessage | None]] = []
        self._read = 0

    @property
    def taken(self) -> int:
        """How many of the messages were read."""
        return self._read

    def read(self, timeout: float = 0.0) -> list[tuple[str, WatermarkMessage | None]]:
        new, self._read = self.messages[self._read :], len(self.messages)
        return new


def driver_of(
    options: ComputationOptions | None = None,
    *,
    tasks: int = 1,
    cores: int | None = None,
    store: MemoryIntervalStore | None = None,
) -> tuple[ComputationDriver, Topic, MemoryIntervalStore]:
    topology = Topology("t", streams=["in"])
    spec = topology.add_computation(
        "count", Count(), inputs=["in"], outputs=["out"], options=options
    )
    clock = ManualClock(1_000)
    store = store or MemoryIntervalStore(clock)
    topic = Topic()
    reader = WatermarkAuthority(topic).subscribe("count")
    watermarks = ComputationWatermarks.of(topology, spec)
    driver = ComputationDriver(
        spec, watermarks, reader, layout_store=lambda: store, clock=clock, tasks=tasks, cores=cores
    )
    return driver, topic, store


def idle(interval: int, records: int = 0, cpu: float = 0.0) -> IntervalOutcome:
    return IntervalOutcome(interval, IntervalProgress(), records=records, cpu_seconds=cpu)


def test_a_batch_runs_under_the_watermark_its_input_reached_and_ticks_unknown_intervals() -> None:
    driver, topic, _ = driver_of(ComputationOptions(key_intervals=3))
    feed = injector_source("feed")
    topic.messages.append((feed, WatermarkReport(feed, ("in",), 50, 1, {"in": {0: 4}})))
    early = driver.begin({"in": {0: 3}}, had_input=True)
    assert (early.watermark, early.timer_watermark) == (MIN_EVENT_TIME, MIN_EVENT_TIME)
    assert early.ticks == [0, 1, 2]  # none reported yet: every interval runs
    assert early.layout == IntervalLayout.initial(3)
    driver.absorb([idle(0, 3), idle(1), idle(2)])
    assert driver.finish() is None
    assert driver.report(1, {}) is not None  # every interval known: a first report

    reached = driver.begin({"in": {0: 4}}, had_input=True)
    # The report's offsets reached: applied. Records run under the watermark before it.
    assert (reached.watermark, reached.timer_watermark) == (MIN_EVENT_TIME, 50)
    assert reached.ticks == []


def test_a_warm_up_reads_the_reports_before_the_first_batch_and_none_once_a_batch_began() -> None:
    driver, topic, _ = driver_of(ComputationOptions(key_intervals=1))
    feed = injector_source("feed")
    topic.messages.append((feed, WatermarkReport(feed, ("in",), 50, 1, {"in": {0: 4}})))
    driver.read_ahead()
    assert topic.taken == 1
    topic.messages.append((feed, WatermarkReport(feed, ("in",), 60, 2, {"in": {0: 9}})))
    plan = driver.begin({"in": {0: 4}}, had_input=True)
    assert topic.taken == 2  # the batch reads what came since
    assert plan.timer_watermark == 50  # the report read ahead applies: its offsets reached
    driver.absorb([idle(0, 4)])
    driver.finish()
    topic.messages.append((feed, WatermarkReport(feed, ("in",), 70, 3, {"in": {0: 12}})))
    driver.read_ahead()  # a batch began: the batches read, not the warm-up
    assert topic.taken == 2


def test_a_batch_that_begins_during_the_warm_ups_read_waits_for_it() -> None:
    # The topic read straight, not through an authority (whose subscriptions lock their
    # reads): the driver's own lock is what keeps the two reads apart.
    made, topic, store = driver_of(ComputationOptions(key_intervals=1))
    driver = ComputationDriver(
        made.spec, made.watermarks, topic, layout_store=lambda: store, clock=made.clock
    )
    release = threading.Event()
    first = threading.Event()
    read = topic.read

    def slow_first_read(timeout: float = 0.0) -> list[tuple[str, WatermarkMessage | None]]:
        if not first.is_set():
            first.set()
            release.wait(10)
        return read(timeout)

    topic.read = slow_first_read  # type: ignore[method-assign]
    warm = threading.Thread(target=driver.read_ahead)
    warm.start()
    assert first.wait(10)
    begun = threading.Event()

    def first_batch() -> None:
        driver.begin({"in": {0: 1}}, had_input=True)
        begun.set()

    batch = threading.Thread(target=first_batch)
    batch.start()
    assert not begun.wait(0.2)  # the reader is the warm-up's until its read ends
    release.set()
    assert begun.wait(10)
    warm.join(10)
    batch.join(10)


def test_a_batch_without_input_keeps_the_loads_and_one_with_input_idles_the_rest() -> None:
    driver, _, _ = driver_of(ComputationOptions(key_intervals=2))
    intervals = driver.watermarks.intervals
    driver.begin({}, had_input=True)
    driver.absorb([idle(0, 7), idle(1, 5)])
    driver.finish()
    assert intervals.records() == {0: 7, 1: 5}

    driver.begin({}, had_input=False)
    driver.absorb([idle(0, 0)])  # a tick: says nothing of the load
    driver.finish()
    assert intervals.records() == {0: 7, 1: 5}

    driver.begin({}, had_input=True)
    driver.absorb([idle(1, 2)])  # interval 0 had no input in this batch
    driver.finish()
    assert intervals.records() == {0: 0, 1: 2}


def test_each_step_needs_its_batch() -> None:
    driver, _, _ = driver_of()
    with pytest.raises(RuntimeError, match="begin"):
        driver.absorb([])
    driver.begin({}, had_input=True)
    driver.absorb([idle(0)])
    with pytest.raises(RuntimeError, match="once"):
        driver.absorb([idle(1)])
    driver.finish()
    with pytest.raises(RuntimeError, match="begin"):
        driver.finish()


def test_a_hot_interval_splits_between_batches_and_its_halves_carry_its_load() -> None:
    policy = RebalancePolicy(split_records=10, max_intervals=4)
    driver, _, store = driver_of(ComputationOptions(key_intervals=2, rebalance=policy), tasks=2)
    driver.begin({}, had_input=True)
    driver.absorb([idle(0, 30), idle(1, 1)])
    change = driver.finish()
    assert change is not None
    assert (change.kind, change.sources) == ("split", (0,))
    assert driver.rebalances == 1
    layout = driver.layout
    assert layout is not None
    assert layout.change is None
    assert store.read_layout("count") == layout  # journaled and finished
    # By the driver's clock: when it journaled the split and when it finished it.
    assert (layout.history[-1].begun_at, layout.history[-1].finished_at) == (1_000, 1_000)
    halves = [target[0] for target in change.targets]
    assert set(layout.ids) == {1, *halves}
    assert driver.watermarks.intervals.records() == {1: 1, halves[0]: 15, halves[1]: 15}
    assert not driver.watermarks.intervals.measured  # no change on estimates

    # The next batch runs the new intervals (unknown) and measures; only then a change.
    plan = driver.begin({}, had_input=False)
    assert set(halves) <= set(plan.ticks)
    assert plan.layout == layout
    driver.absorb([idle(i) for i in plan.ticks])
    assert driver.finish() is None


def test_a_report_names_the_worker_that_last_ran_each_live_interval() -> None:
    policy = RebalancePolicy(split_records=10, max_intervals=4)
    driver, _, _ = driver_of(ComputationOptions(key_intervals=2, rebalance=policy), tasks=2)
    driver.begin({}, had_input=True)
    driver.absorb(
        [replace(idle(0, 30), worker="h:7"), replace(idle(1, 1), worker="h:8")]
    )  # interval 0 is hot: it splits at the batch's end
    change = driver.finish()
    assert change is not None
    assert driver.report(1, {}) is None  # the halves have not run yet: nothing known
    driver.begin({}, had_input=False)
    driver.absorb([replace(idle(t[0]), worker="h:7") for t in change.targets])
    driver.finish()
    report = driver.report(2, {})
    assert report is not None
    # Interval 0, split away, is no one's any more.
    assert report.workers == {"h:7": tuple(t[0] for t in change.targets), "h:8": (1,)}


def test_a_journaled_change_a_killed_driver_left_is_finished_at_the_first_batch() -> None:
    policy = RebalancePolicy(split_records=10)
    clock = ManualClock(1_000)
    store = MemoryIntervalStore(clock)
    initial = store.layout("count", 2)
    begun = initial.begin_split(0)
    assert store.write_layout("count", begun, initial)  # journaled, then the driver died
    driver, _, _ = driver_of(ComputationOptions(key_intervals=2, rebalance=policy), store=store)
    plan = driver.begin({}, had_input=False)
    finished = begun.finish(at=1_000)  # by the new driver's clock
    # Then claimed by the new driver: the same layout, one version on.
    assert plan.layout == replace(finished, version=finished.version + 1)
    assert store.read_layout("count") == plan.layout
    assert driver.watermarks.intervals.ids == frozenset(plan.layout.ids)


def test_a_driver_that_starts_claims_the_layout_so_a_stopped_one_journals_no_change() -> None:
    policy = RebalancePolicy(split_records=10, max_intervals=4)
    options = ComputationOptions(key_intervals=2, rebalance=policy)
    stopped, _, store = driver_of(options, tasks=2)
    stopped.begin({}, had_input=True)
    stopped.absorb([idle(0, 30), idle(1, 1)])  # interval 0 is hot: its finish would split it
    assert stopped.layout is not None
    # Stopped here (a long pause) while another driver of the computation starts.
    successor, _, _ = driver_of(options, tasks=2, store=store)
    plan = successor.begin({}, had_input=False)
    assert plan.layout.version == stopped.layout.version + 1
    with pytest.raises(FencedError, match="changed under this driver"):
        stopped.finish()  # continued: the split it planned on the old layout is refused
    assert store.read_layout("count") == plan.layout
    store.acquire("count", 0)  # not retired under the successor's tasks


def test_a_driver_without_a_rebalance_policy_leaves_the_layout_as_it_is() -> None:
    driver, _, store = driver_of(ComputationOptions(key_intervals=2))
    plan = driver.begin({}, had_input=False)
    assert plan.layout == IntervalLayout.initial(2)
    assert store.read_layout("count") == plan.layout


def test_the_layout_a_computation_first_ran_with_stays_and_a_new_count_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = MemoryIntervalStore(ManualClock(1_000))
    first, _, _ = driver_of(ComputationOptions(key_intervals=16), store=store)
    assert first.load_layout() == IntervalLayout.initial(16)
    assert not caplog.records
    # The same computation under a new key_intervals (or a new default): its keys stay where
    # its state is, and the driver says so.
    again, _, _ = driver_of(ComputationOptions(key_intervals=4), store=store)
    assert again.load_layout() == IntervalLayout.initial(16)
    assert again.watermarks.intervals.ids == frozenset(range(16))
    assert [r.getMessage() for r in caplog.records] == [
        "computation 'count' keeps the 16 key intervals it was first run with (its options "
        "say 4): key intervals change only by a rebalance policy"
    ]


def test_a_computation_without_a_count_starts_with_an_interval_per_core() -> None:
    driver, _, store = driver_of(cores=3, tasks=3)
    plan = driver.begin({}, had_input=False)
    assert plan.layout == IntervalLayout.initial(3)
    assert store.read_layout("count") == plan.layout
    assert driver.watermarks.intervals.ids == frozenset(range(3))
    # No job's cores known (the test harness): the default count.
    harnessed, _, _ = driver_of()
    assert harnessed.load_layout() == IntervalLayout.initial(DEFAULT_KEY_INTERVALS)


def test_a_stored_layout_outlives_a_new_core_count_without_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = MemoryIntervalStore(ManualClock(1_000))
    first, _, _ = driver_of(cores=4, tasks=4, store=store)
    assert first.load_layout() == IntervalLayout.initial(4)
    # Run again on a job of 2 cores: its keys stay where its state is; the options named
    # no count, so there is nothing to warn about.
    again, _, _ = driver_of(cores=2, tasks=2, store=store)
    assert again.load_layout() == IntervalLayout.initial(4)
    assert again.watermarks.intervals.ids == frozenset(range(4))
    assert not caplog.records


def test_intervals_move_between_tasks_only_for_a_clear_gain() -> None:
    policy = RebalancePolicy(split_records=100, max_intervals=8)
    driver, _, _ = driver_of(ComputationOptions(key_intervals=4, rebalance=policy), tasks=2)
    driver.begin({}, had_input=True)
    driver.absorb([idle(0, 50), idle(1, 1), idle(2, 50), idle(3, 1)])
    driver.finish()
    first = driver.assignment
    assert first is not None  # by ID, both hot intervals were on task 0
    assert first[0] != first[2]

    driver.begin({}, had_input=True)
    driver.absorb([idle(0, 50), idle(1, 2), idle(2, 48), idle(3, 1)])  # about as balanced
    driver.finish()
    assert driver.assignment is first  # nothing moves for a small gain

    driver.begin({}, had_input=True)
    driver.absorb([idle(0, 150), idle(1, 2), idle(2, 48), idle(3, 1)])
    assert driver.finish() is not None  # 0 split: its halves get a task each
    layout = driver.layout
    assert layout is not None
    assert driver.assignment is not None
    assert set(driver.assignment) == set(layout.ids)


def test_steps_that_reach_the_store_go_through_the_retry() -> None:
    policy = RebalancePolicy(split_records=10)
    driver, _, _ = driver_of(ComputationOptions(key_intervals=2, rebalance=policy))
    tried: list[str] = []

    def retry(action: Callable[[], _T]) -> _T:
        tried.append(getattr(action, "__qualname__", "?"))
        return action()

    driver.begin({}, had_input=True, retry=retry)
    assert len(tried) == 2  # the layout, the reports
    driver.absorb([idle(0, 30), idle(1)])
    assert driver.finish(retry) is not None
    assert len(tried) == 4  # the journal, the roll forward


def test_a_batch_that_failed_part_way_keeps_what_its_committed_intervals_said() -> None:
    driver, _, _ = driver_of(ComputationOptions(key_intervals=2))
    driver.begin({}, had_input=True)
    driver.absorb([idle(0, 4), idle(1, 6)])
    driver.finish()
    driver.begin({}, had_input=True)
    pending = IntervalProgress(oldest_work=5, next_event_timer=5)
    driver.absorb([IntervalOutcome(0, pending, records=1)], complete=False)
    assert driver.watermarks.intervals.get(0) == pending
    assert driver.watermarks.intervals.records() == {0: 1, 1: 6}  # nothing idled
    with pytest.raises(RuntimeError, match="begin"):
        driver.finish()  # the batch ended with its failure
