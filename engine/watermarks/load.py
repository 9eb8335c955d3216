"""The load each key interval of a computation carried: its records, and the wall and CPU
seconds of its task, in the latest batch with input it ran in.

Rebalancing splits, merges and spreads the intervals by it
(:mod:`millstream.engine.rebalance`); percentile watermarks weigh each interval's pending work
by its records (:meth:`IntervalMap.percentile_work
<millstream.engine.watermarks.IntervalMap.percentile_work>`).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final

__all__ = ["IntervalLoad", "IntervalLoads"]

_Load = tuple[int, float, float]  # records, seconds, CPU seconds
_NO_LOAD: Final = (0, 0.0, 0.0)


@dataclass(frozen=True, slots=True)
class IntervalLoad:
    """One interval's share of its computation's work in the latest batch with input: its
    records, the wall and CPU seconds of its task, and its pending work (oldest first)."""

    interval: int
    records: int
    seconds: float
    oldest_work: int | None
    cpu_seconds: float = 0.0


class IntervalLoads:
    """Each interval's load in the latest batch with input it ran in (:meth:`measure`).

    A batch with input that did not run an interval says it carried nothing in it
    (:meth:`idle_except`). After a split or merge the new intervals share their sources'
    load (:meth:`replace`): estimates, until a batch with input measures them
    (:attr:`measured`).
    """

    def __init__(self) -> None:
        # Of the latest batch with input each ran in (the percentile's weights); those in
        # _idle carried nothing in the latest one.
        self._load: dict[int, _Load] = {}
        self._idle: set[int] = set()
        self._estimated: set[int] = set()  # loads carried over by replace, not measured
        self.total_records = 0
        """The records of every interval's :meth:`weight`, summed."""

    def measure(self, interval: int, records: int, seconds: float, cpu_seconds: float) -> None:
        """The load ``interval`` carried in a batch with input."""
        self._set(interval, (records, seconds, cpu_seconds))
        self._estimated.discard(interval)

    def replace(self, sources: Iterable[int], targets: Iterable[int], *, carry: bool) -> None:
        """``sources`` were split or merged into ``targets``: forget the sources; with
        ``carry`` the targets share the load the sources carried in the latest batch with
        input, evenly (a split halves it, a merge sums it), as estimates."""
        sources, targets = list(sources), list(targets)
        carried = [self.latest(interval) for interval in sources]
        for interval in sources:
            self.forget(interval)
        if carry and targets:
            records = sum(load[0] for load in carried)
            seconds = sum(load[1] for load in carried)
            cpu = sum(load[2] for load in carried)
            whole, rest = divmod(records, len(targets))
            for index, interval in enumerate(targets):
                share = (whole + (index < rest), seconds / len(targets), cpu / len(targets))
                self._set(interval, share)
                self._estimated.add(interval)

    def forget(self, interval: int) -> None:
        self._idle.discard(interval)
        self._estimated.discard(interval)
        records, _, _ = self._load.pop(interval, _NO_LOAD)
        self.total_records -= records

    def idle_except(self, ran: Iterable[int]) -> None:
        """A batch with input ran only the intervals ``ran``: every other one carried no
        records in it (so a load it carried long ago neither splits it nor keeps it from
        merging). Their :meth:`weight` stays that of the latest batch with input they ran
        in: a small batch that missed an interval says little of the share of the data
        behind it."""
        self._idle = self._load.keys() - set(ran)
        self._estimated -= self._idle

    @property
    def measured(self) -> bool:
        """Whether every load is one a batch with input measured, none carried over from a
        split or merge: a plan on estimates would split halves a hot key leaves cold."""
        return not self._estimated

    def latest(self, interval: int) -> _Load:
        """The load ``interval`` carried in the latest batch with input."""
        return _NO_LOAD if interval in self._idle else self._load.get(interval, _NO_LOAD)

    def weight(self, interval: int) -> int:
        """The records ``interval`` carried in the latest batch with input it ran in."""
        return self._load.get(interval, _NO_LOAD)[0]

    def records(self) -> dict[int, int]:
        """Each interval's records in the latest batch with input (for rebalancing)."""
        return {interval: self.latest(interval)[0] for interval in self._load}

    def cpu_seconds(self) -> dict[int, float]:
        """Each interval's CPU seconds in the latest batch with input (for rebalancing)."""
        return {interval: self.latest(interval)[2] for interval in self._load}

    def hottest(self, limit: int, oldest_work: Callable[[int], int | None]) -> list[IntervalLoad]:
        """The intervals that carried the most records in the latest batch with input (then
        seconds), with their ``oldest_work``."""
        latest = ((interval, self.latest(interval)) for interval in self._load)
        ranked = heapq.nlargest(limit, latest, key=lambda item: item[1])
        return [
            IntervalLoad(interval, records, seconds, oldest_work(interval), cpu)
            for interval, (records, seconds, cpu) in ranked
        ]

    def _set(self, interval: int, load: _Load) -> None:
        before = self._load.get(interval, _NO_LOAD)[0]
        self._load[interval] = load
        self._idle.discard(interval)
        self.total_records += load[0] - before
