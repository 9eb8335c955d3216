"""What each key interval of a computation has left to do after its latest batch, and the
load it carried: the index a driver keeps, so that applying an interval's report costs
O(log n) and the watermark, the intervals with due work and a percentile cost little more
than what they return."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from sortedcontainers import SortedList

from millstream.engine.watermarks.load import IntervalLoad, IntervalLoads

__all__ = ["IntervalMap", "IntervalProgress"]


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


_ANY_INTERVAL = 2**63  # above every interval ID: an index range bound on the time alone


class IntervalMap:
    """What each key interval of one computation has left after its latest batch, and the
    load it carried (:class:`~millstream.engine.watermarks.load.IntervalLoads`).

    ``intervals`` is how many there are (IDs ``0 .. intervals-1``), or their IDs; until each
    reported once, the map is not :attr:`complete` (their pending work is unknown, so no
    watermark can be said). :meth:`replace` follows a split or merge.
    """

    def __init__(self, intervals: int | Iterable[int]) -> None:
        self._live = set(range(intervals) if isinstance(intervals, int) else intervals)
        self._progress: dict[int, IntervalProgress] = {}
        self._loads = IntervalLoads()
        self._work: SortedList[tuple[int, int]] = SortedList()  # (oldest_work, interval)
        self._event: SortedList[tuple[int, int]] = SortedList()  # (next_event_timer, interval)
        self._wall: SortedList[tuple[int, int]] = SortedList()  # (next_wall_timer, interval)
        self._pending: set[int] = set()

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
        self._loads.replace(sources, targets, carry=carry_load)
        for interval in sources:
            self._forget(interval)
            self._live.discard(interval)
        self._live.update(targets)

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
            self._loads.measure(interval, records, seconds, cpu_seconds)

    def idle_except(self, ran: Iterable[int]) -> None:
        """A batch with input ran only the intervals ``ran``: every other one carried no
        records in it (see :meth:`IntervalLoads.idle_except
        <millstream.engine.watermarks.load.IntervalLoads.idle_except>`); their weight in
        :meth:`percentile_work` stays."""
        self._loads.idle_except(ran)

    @property
    def measured(self) -> bool:
        """Whether every load is one a batch with input measured, none carried over from a
        split or merge: a plan on estimates would split halves a hot key leaves cold."""
        return self._loads.measured

    def oldest_work(self) -> tuple[int, int] | None:
        """The earliest pending work of any interval, and that interval."""
        return self._work[0] if self._work else None

    def behind(self, watermark: int, limit: int) -> list[tuple[int, int]]:
        """The ``limit`` intervals whose pending work is earliest among those below
        ``watermark``, as ``(interval, oldest work)``: each one's own watermark, where the
        others' is ``watermark`` itself."""
        below = self._work.irange(maximum=(watermark - 1, _ANY_INTERVAL))
        return [(interval, work) for work, interval in itertools.islice(below, limit)]

    @property
    def undelivered(self) -> bool:
        """Whether an interval holds productions not acknowledged yet (a send that timed
        out, a transaction fenced or of unknown outcome, Kafka unreachable)."""
        return bool(self._pending)

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
        total = self._loads.total_records + len(self._progress)
        allowance = total * (100.0 - percentile) / 100.0
        skipped = 0.0
        for work, interval in self._work:
            skipped += self._loads.weight(interval) + 1
            if skipped > allowance:
                return int(work)
        return None

    def records(self) -> dict[int, int]:
        """Each interval's records in the latest batch with input (for rebalancing)."""
        return self._loads.records()

    def cpu_seconds(self) -> dict[int, float]:
        """Each interval's CPU seconds in the latest batch with input (for rebalancing)."""
        return self._loads.cpu_seconds()

    def hottest(self, limit: int = 5) -> list[IntervalLoad]:
        """The intervals that carried the most records in the latest batch with input (then
        seconds)."""
        return self._loads.hottest(limit, self._oldest_work)

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
