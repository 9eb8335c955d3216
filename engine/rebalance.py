"""Key intervals that split and merge by load (paper 6.2, 7.1; 8.4 on why stability needs it).

MillWheel's master moves, splits and merges key intervals as their load changes, each new
interval with a fresh sequencer. Here the driver does it between two batches of a
computation, when none of its interval tasks runs (only zombies may, and the sequencers fence
them):

1. **plan** (:func:`plan`): from each interval's load in the latest batch with input (its
   records, and the CPU seconds its task spent on it), split the hottest one if it carried
   more than ``split_records`` or used more than ``split_cpu_seconds``, else merge the
   coldest adjacent pair if both carried fewer than ``merge_records``; one change at a time.
2. **journal** (:func:`begin`): the change goes into the computation's layout by
   compare-and-set, with new interval IDs. From here on it is rolled forward, never back;
   a driver that finds a change in the layout finishes it before it runs a batch.
3. **fence** the sources: retire each one (acquire it, then move its sequencer to a value
   no acquire passes), so no task or zombie holding a lease writes them again and none can
   take them anew. Fencing by an acquire alone would not do: a zombie's worker starting a
   batch acquires too, and whatever it then committed would miss the copy. A zombie that
   acquires between this driver's acquire and its retire makes the retire fail; the next
   attempt takes the source back.
4. **copy**: every key of the sources, whole (state, timers, unexpired dedup IDs), and their
   pending productions, committed into the target that owns the key's hash now (under the
   target's sequencer). The sources' rows are final and no one routes to the targets yet,
   so doing it again after a crash writes the same rows. A driver that finds, once it holds
   a target, that the layout no longer journals the change stops there: it was stopped
   since its export while another driver finished the change, and its rows are older than
   the live target's.
5. **purge** the sources' rows.
6. **finish**: the layout without the change, the targets in the sources' place.

A kill at any step loses and duplicates nothing: before 2 nothing happened; from 2 to 6 the
next driver repeats 3-6 from the journal, each idempotent (a source found retired stays so,
and a copy from a source purged in part writes a part of what it wrote before); after 6 the
change is done.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Final

from millstream.engine.errors import FencedError, RetiredIntervalError, UnknownOutcomeError
from millstream.engine.layout import IntervalLayout
from millstream.engine.pause_points import pause_point
from millstream.engine.productions import CommitTag, Production, delivered_by
from millstream.engine.state import KeyChanges
from millstream.engine.store import IntervalStore

__all__ = [
    "FINISHED_ELSEWHERE",
    "RebalancePolicy",
    "assign_slots",
    "begin",
    "finish_change",
    "load_shares",
    "plan",
]

FINISHED_ELSEWHERE: Final = "finished by another driver"
"""What the error of a driver that found its change finished by another mid-copy says."""
_COMMIT_ATTEMPTS = 5
_RETIRE_ATTEMPTS = 5


@dataclass(frozen=True, slots=True)
class RebalancePolicy:
    """When a computation's intervals split and merge (``ComputationOptions.rebalance``).

    ``split_records``: an interval that carried more records than this in the latest batch
    with input splits in two; so does one whose task spent more than ``split_cpu_seconds`` of
    CPU on it (``None``: records alone decide), for costly records. ``merge_records``: two
    adjacent intervals that each carried fewer merge (0: never), and with
    ``split_cpu_seconds`` each also used less than a quarter of it. ``max_intervals`` bounds
    the splits; ``min_intervals`` the merges.
    """

    split_records: int = 5_000
    merge_records: int = 0
    max_intervals: int = 256
    min_intervals: int = 1
    split_cpu_seconds: float | None = None

    def __post_init__(self) -> None:
        if self.split_records < 1 or self.merge_records < 0:
            raise ValueError("split_records must be positive and merge_records non-negative")
        if self.split_cpu_seconds is not None and not self.split_cpu_seconds > 0:
            raise ValueError("split_cpu_seconds must be positive (or None)")
        if self.merge_records * 2 > self.split_records:
            raise ValueError(
                "merge_records must be at most half of split_records, or a merged interval "
                "would split again at once"
            )
        if not 1 <= self.min_intervals <= self.max_intervals:
            raise ValueError("need 1 <= min_intervals <= max_intervals")


def load_shares(
    intervals: Iterable[int],
    records: Mapping[int, int],
    policy: RebalancePolicy,
    cpu_seconds: Mapping[int, float] | None = None,
) -> dict[int, float]:
    """Each interval's load in the latest batch with input as a share of its split
    threshold (above 1 splits): its records, or its CPU seconds where the policy splits on
    them and they weigh more. The one measure splits, and spreads intervals over tasks."""
    cpu = cpu_seconds or {}
    limit = policy.split_cpu_seconds
    shares: dict[int, float] = {}
    for interval in intervals:
        share = records.get(interval, 0) / policy.split_records
        if limit is not None:
            share = max(share, cpu.get(interval, 0.0) / limit)
        shares[interval] = share
    return shares


def plan(
    layout: IntervalLayout,
    records: Mapping[int, int],
    policy: RebalancePolicy,
    cpu_seconds: Mapping[int, float] | None = None,
    now: int = 0,
) -> IntervalLayout | None:
    """The layout with the change to make journaled, or ``None`` (nothing to do).
    ``records`` and ``cpu_seconds``: each interval's load in the latest batch with input (an
    interval not named: none); ``now``: the wall clock (µs), the change's ``begun_at``."""
    if layout.change is not None:
        return None
    cpu = cpu_seconds or {}
    cpu_limit = policy.split_cpu_seconds
    load = load_shares(layout.ids, records, policy, cpu).__getitem__

    def cold(interval: int) -> bool:
        return records.get(interval, 0) < policy.merge_records and (
            cpu_limit is None or cpu.get(interval, 0.0) < cpu_limit / 4
        )

    count = len(layout.ids)
    hottest = max(layout.ids, key=lambda i: (load(i), -i))
    if count < policy.max_intervals and load(hottest) > 1:
        low, high = layout.range_of(hottest)
        if high - low >= 2:
            return layout.begin_split(hottest, now)
    if policy.merge_records and count > policy.min_intervals:
        pairs = [
            (records.get(a, 0) + records.get(b, 0), a, b)
            for a, b in zip(layout.ids, layout.ids[1:], strict=False)
            if cold(a) and cold(b)
        ]
        if pairs:
            _, first, second = min(pairs)
            return layout.begin_merge(first, second, now)
    return None


def begin(
    store: IntervalStore, computation: str, layout: IntervalLayout, begun: IntervalLayout
) -> None:
    """Journal ``begun``'s change (step 2); ``FencedError`` if another driver changed the
    layout since ``layout`` was read."""
    if not store.write_layout(computation, begun, layout):
        raise FencedError(
            f"the interval layout of {computation!r} changed under this driver (another "
            "driver runs the computation?); read it again"
        )


def finish_change(
    store: IntervalStore,
    computation: str,
    layout: IntervalLayout,
    *,
    dedup_ttl: int,
    delivered: Callable[[str, int], CommitTag | None] | None = None,
    now: int = 0,
) -> IntervalLayout:
    """Roll ``layout``'s journaled change forward (steps 3-6); returns the layout after it.

    ``delivered`` (transactional productions) opens a source interval's producer, fencing
    the last owner's, and returns its transaction marker: the pending productions it covers
    were delivered and are not copied; the rest are copied, tagged as a commit of their target
    under the lease that copies them (a source's tag means nothing to the target's marker),
    and delivered by their target. ``now`` (wall clock, µs) goes into the layout's history
    as when the change finished."""
    change = layout.change
    if change is None:
        return layout
    for source in change.sources:
        _retire(store, computation, source)
    pause_point("rebalance.fence", computation)
    moved: dict[int, dict[str, KeyChanges]] = {target[0]: {} for target in change.targets}
    # Pending productions belong to no key (a store exports them under the key ""): the
    # first target delivers them all. Routed by the hash of "" (0), they had no target
    # in a change away from the lowest hashes, and every driver failed finishing it.
    pending: list[Production] = []
    for source in change.sources:
        marker = None if delivered is None else delivered(computation, source)
        for key_changes in store.export(computation, source):
            # Untagged here: a tag names a commit of the source; _commit tags them anew.
            pending.extend(
                replace(p, tag=None)
                for p in key_changes.productions
                if not delivered_by(p.tag, marker)
            )
            key_changes.productions = []
            if not key_changes.is_empty():
                moved[change.target_of(key_changes.key)][key_changes.key] = key_changes
    if pending:
        first = moved[change.targets[0][0]]
        first.setdefault("", KeyChanges("")).productions.extend(pending)
    pause_point("rebalance.export", computation)
    for target, changes in moved.items():
        _commit(
            store,
            layout,
            computation,
            target,
            list(changes.values()),
            dedup_ttl,
            tagged=delivered is not None,
        )
    pause_point("rebalance.copy", computation)
    for source in change.sources:
        store.purge(computation, source)
    pause_point("rebalance.purge", computation)
    finished = layout.finish(now)
    if not store.write_layout(computation, finished, layout):
        raise FencedError(
            f"the interval layout of {computation!r} changed while this driver finished its "
            f"{change.kind}; read it again"
        )
    return finished


def _retire(store: IntervalStore, computation: str, source: int) -> None:
    """Retire ``source`` (step 3), unless an earlier attempt at the change did."""
    for attempt in range(_RETIRE_ATTEMPTS):
        try:
            lease = store.acquire(computation, source)
        except RetiredIntervalError:
            return
        try:
            store.retire(lease)
            return
        except FencedError:
            # A zombie's worker acquired it in between (or another driver finishing the
            # same change retired it): the next acquire fences the one, or says the other.
            if attempt == _RETIRE_ATTEMPTS - 1:
                raise


def _commit(
    store: IntervalStore,
    layout: IntervalLayout,
    computation: str,
    interval: int,
    changes: list[KeyChanges],
    dedup_ttl: int,
    *,
    tagged: bool = False,
) -> None:
    """Copy ``changes`` into target ``interval`` of ``layout``'s change (step 4)."""
    # Every row is a put into an interval no one else writes yet: an uncertain commit is
    # simply made again under a new lease.
    for attempt in range(_COMMIT_ATTEMPTS):
        lease = store.acquire(computation, interval)
        # Unless another driver finished the change meanwhile (this one a zombie, stopped
        # since its export): the target is live then, and these rows are older than its
        # own. Read after the acquire, the layout is current: a worker that acquired the
        # target after it, as the finished layout lets it, fences this lease.
        if store.read_layout(computation) != layout:
            raise FencedError(
                f"the {layout.change.kind if layout.change else 'change'} of "
                f"{computation!r} was {FINISHED_ELSEWHERE} while this one copied its keys "
                "(this driver was stopped or cut off for long); read the layout again"
            )
        if not changes:
            return
        # Copied pending productions are tagged as a commit of the target, below every
        # commit its owners will make: once the target delivers them, its marker covers
        # them, so an owner that finds them still pending after a crash drops them.
        if tagged:
            tag = CommitTag(lease.token, 0)
            for change in changes:
                change.productions = [replace(p, tag=tag) for p in change.productions]
        try:
            store.commit(lease, changes, dedup_ttl=dedup_ttl)
            return
        except UnknownOutcomeError:
            if attempt == _COMMIT_ATTEMPTS - 1:
                raise


def assign_slots(
    intervals: Iterable[int], loads: Mapping[int, float], slots: int
) -> dict[int, int]:
    """Intervals to ``slots`` (a batch's interval tasks) so that no slot is hot: the
    heaviest interval first (by ``loads``: records, or :func:`load_shares`), each to the
    slot with the least load so far (then the fewest intervals): the
    longest-processing-time rule, within 4/3 of the best."""
    totals: list[tuple[float, int, int]] = [(0.0, 0, slot) for slot in range(slots)]
    heapq.heapify(totals)
    assigned: dict[int, int] = {}
    for interval in sorted(intervals, key=lambda i: (-loads.get(i, 0), i)):
        load, count, slot = heapq.heappop(totals)
        assigned[interval] = slot
        heapq.heappush(totals, (load + loads.get(interval, 0), count + 1, slot))
    return assigned
