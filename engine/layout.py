"""A computation's key intervals as they are now: hash ranges that split, merge and move
(paper 6.2, 7.1).

A computation starts with ``key_intervals`` equal ranges of the 32-bit key hash, numbered
``0 .. N-1`` exactly as :func:`~millstream.engine.keys.key_interval` numbers them. By load,
an interval may then be *split* into two halves, or two adjacent intervals *merged* into
one. Either change gives the new intervals IDs never used before (each is a store partition
with a fresh sequencer), so nothing written under an old ID can land in a new interval.

The layout is versioned and kept in the store (:class:`LayoutStore`), written only by
compare-and-set. A change is journaled in the layout as a :class:`LayoutChange` before any
state moves (:meth:`IntervalLayout.begin`), and whoever finds it there rolls it forward
(:mod:`millstream.engine.rebalance`); :meth:`IntervalLayout.finish` then makes the new
intervals the layout. While a change is pending, no batch runs on the computation.
"""

from __future__ import annotations

import bisect
import json
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from millstream.engine.errors import TopologyError
from millstream.engine.keys import HASH_SPACE, interval_hash_range, key_hash

__all__ = ["HISTORY", "IntervalLayout", "LayoutChange", "LayoutStore"]

HISTORY = 20
"""Finished changes a layout remembers (its ``history``)."""


@dataclass(frozen=True, slots=True)
class LayoutChange:
    """A split or merge in progress: ``sources`` (adjacent, in hash order) become
    ``targets``, each owning ``[low, high)`` of the key hash. ``begun_at`` and
    ``finished_at``: when a driver journaled it and finished it (wall clock, µs; 0: not
    known, or not finished yet), for people looking at the layout's history."""

    kind: str  # "split" | "merge"
    sources: tuple[int, ...]
    targets: tuple[tuple[int, int, int], ...]  # (interval, low, high)
    begun_at: int = 0
    finished_at: int = 0

    def target_of(self, key: str) -> int:
        h = key_hash(key)
        for interval, low, high in self.targets:
            if low <= h < high:
                return interval
        raise ValueError(f"key {key!r} (hash {h}) is outside the change's ranges")


@dataclass(frozen=True, slots=True)
class IntervalLayout:
    """Intervals ``ids[i]`` owning the hashes ``[bounds[i], bounds[i + 1])`` (the last up to
    ``2**32``); ``next_id`` is the first ID never used; ``change`` a change in progress;
    ``history`` the latest finished changes, oldest first (:data:`HISTORY` at most: for
    people looking at the layout, ``millstream ui``)."""

    version: int
    bounds: tuple[int, ...]
    ids: tuple[int, ...]
    next_id: int
    change: LayoutChange | None = None
    history: tuple[LayoutChange, ...] = ()

    def __post_init__(self) -> None:
        if not self.ids or len(self.bounds) != len(self.ids) or self.bounds[0] != 0:
            raise TopologyError(f"an interval layout needs ranges from hash 0: {self}")
        if list(self.bounds) != sorted(set(self.bounds)) or self.bounds[-1] >= HASH_SPACE:
            raise TopologyError(f"interval layout bounds must rise within 2**32: {self}")
        if len(set(self.ids)) != len(self.ids) or max(self.ids) >= self.next_id:
            raise TopologyError(f"interval layout IDs must be distinct and below next_id: {self}")

    @classmethod
    def initial(cls, intervals: int) -> IntervalLayout:
        """``intervals`` equal ranges, as :func:`~millstream.engine.keys.key_interval` has them."""
        return cls(
            version=1,
            bounds=tuple(interval_hash_range(i, intervals)[0] for i in range(intervals)),
            ids=tuple(range(intervals)),
            next_id=intervals,
        )

    @property
    def is_initial(self) -> bool:
        """Whether these are still the intervals the computation started with (no split or
        merge finished: new intervals get IDs never used before)."""
        return self.ids == tuple(range(len(self.ids)))

    def interval_of(self, key: str) -> int:
        """The interval whose range holds ``key``'s hash."""
        return self.ids[bisect.bisect_right(self.bounds, key_hash(key)) - 1]

    def interval_lookup(self, remember: int = 1 << 16) -> Callable[[str], int]:
        """:meth:`interval_of` remembering the answers for up to ``remember`` keys (then it
        starts afresh): a batch routes each key's records one by one, and a dictionary hit
        costs an eighth of hashing the key again."""
        known: dict[str, int] = {}

        def lookup(key: str) -> int:
            interval = known.get(key)
            if interval is None:
                if len(known) >= remember:
                    known.clear()
                interval = known[key] = self.interval_of(key)
            return interval

        return lookup

    def range_of(self, interval: int) -> tuple[int, int]:
        at = self.ids.index(interval)
        high = self.bounds[at + 1] if at + 1 < len(self.bounds) else HASH_SPACE
        return self.bounds[at], high

    def owns(self, interval: int, key: str) -> bool:
        return interval in self.ids and self.interval_of(key) == interval

    def neighbour(self, interval: int) -> int | None:
        """The interval right after ``interval`` in hash order, if any (merge partner)."""
        at = self.ids.index(interval)
        return self.ids[at + 1] if at + 1 < len(self.ids) else None

    def begin_split(self, interval: int, at: int = 0) -> IntervalLayout:
        """This layout with a split of ``interval`` into its two halves journaled (``at``:
        now, wall clock µs)."""
        low, high = self.range_of(interval)
        if high - low < 2:
            raise TopologyError(f"interval {interval} holds one hash; it cannot be split")
        middle = (low + high) // 2
        first, second = self.next_id, self.next_id + 1
        halves = ((first, low, middle), (second, middle, high))
        change = LayoutChange("split", (interval,), halves, begun_at=at)
        return self._begin(change, self.next_id + 2)

    def begin_merge(self, first: int, second: int, at: int = 0) -> IntervalLayout:
        """This layout with a merge of two adjacent intervals journaled (``at``: now)."""
        if self.neighbour(first) != second:
            raise TopologyError(f"intervals {first} and {second} are not adjacent")
        low, high = self.range_of(first)[0], self.range_of(second)[1]
        change = LayoutChange("merge", (first, second), ((self.next_id, low, high),), at)
        return self._begin(change, self.next_id + 1)

    def _begin(self, change: LayoutChange, next_id: int) -> IntervalLayout:
        if self.change is not None:
            raise TopologyError(f"a {self.change.kind} is already in progress: {self.change}")
        return replace(self, version=self.version + 1, next_id=next_id, change=change)

    def finish(self, at: int = 0) -> IntervalLayout:
        """The layout once its pending change is done: the targets replace the sources; the
        change goes into the history as finished ``at`` (now, wall clock µs)."""
        change = self.change
        if change is None:
            raise TopologyError("no change in progress to finish")
        first = self.ids.index(change.sources[0])
        end = first + len(change.sources)
        ids = (*self.ids[:first], *(t[0] for t in change.targets), *self.ids[end:])
        bounds = (*self.bounds[:first], *(t[1] for t in change.targets), *self.bounds[end:])
        return replace(
            self,
            version=self.version + 1,
            ids=ids,
            bounds=bounds,
            change=None,
            history=(*self.history, replace(change, finished_at=at))[-HISTORY:],
        )

    def encode(self) -> str:
        document: dict[str, Any] = {
            "version": self.version,
            "bounds": list(self.bounds),
            "ids": list(self.ids),
            "next_id": self.next_id,
        }
        if self.change is not None:
            document["change"] = _change_document(self.change)
        if self.history:
            document["history"] = [_change_document(c) for c in self.history]
        return json.dumps(document, separators=(",", ":"))

    @classmethod
    def decode(cls, text: str) -> IntervalLayout:
        document = json.loads(text)
        change = document.get("change")
        return cls(
            version=int(document["version"]),
            bounds=tuple(int(b) for b in document["bounds"]),
            ids=tuple(int(i) for i in document["ids"]),
            next_id=int(document["next_id"]),
            change=None if change is None else _change_of(change),
            history=tuple(_change_of(c) for c in document.get("history", [])),
        )


def _change_document(change: LayoutChange) -> dict[str, Any]:
    document: dict[str, Any] = {
        "kind": change.kind,
        "sources": list(change.sources),
        "targets": [list(t) for t in change.targets],
    }
    if change.begun_at:
        document["begun_at"] = change.begun_at
    if change.finished_at:
        document["finished_at"] = change.finished_at
    return document


def _change_of(document: dict[str, Any]) -> LayoutChange:
    return LayoutChange(
        str(document["kind"]),
        tuple(int(s) for s in document["sources"]),
        tuple((int(i), int(lo), int(hi)) for i, lo, hi in document["targets"]),
        int(document.get("begun_at", 0)),
        int(document.get("finished_at", 0)),
    )


class LayoutStore(ABC):
    """Where a computation's :class:`IntervalLayout` is kept, changed only by compare-and-set
    (on Cassandra, a lightweight transaction on a row of its own)."""

    @abstractmethod
    def read_layout(self, computation: str) -> IntervalLayout | None:
        """The current layout (linearizable), or ``None`` if none was written."""

    @abstractmethod
    def write_layout(
        self, computation: str, layout: IntervalLayout, expected: IntervalLayout | None
    ) -> bool:
        """Replace ``expected`` (``None``: no layout yet) by ``layout``; false if the stored
        layout is not ``expected`` any more (another driver changed it)."""

    def layout(self, computation: str, key_intervals: int) -> IntervalLayout:
        """The current layout, the initial one of ``key_intervals`` written if none was."""
        while True:
            current = self.read_layout(computation)
            if current is not None:
                return current
            initial = IntervalLayout.initial(key_intervals)
            if self.write_layout(computation, initial, None):
                return initial
