"""Duplicate detection for exactly-once delivery (paper 6.1.1).

A computation records the ID of every record it processed in the same atomic commit as the
record's effects (a *dedup ID*, kept until its TTL: the retry window plus the slack for late
injectors), so a redelivered record is recognised and dropped. Per batch and key:

1. a record repeated within the batch counts once, at its first delivery;
2. the rest are looked up in the store, all keys of the batch in one bulk read
   (:meth:`~millstream.engine.store.IntervalStore.seen`), but for the IDs the worker's Bloom
   filter proves fresh.

A worker whose view of its interval is exact (it kept the interval since its last batch:
:mod:`millstream.engine.sequencer`) keeps a Bloom filter of the interval's dedup IDs in its
soft state (:class:`IdFilter`, paper 6.1.1's fast path): an ID the filter has never seen
was never committed, so it needs no lookup; only the IDs the filter may have seen are looked
up. The filter is loaded from the store when a worker takes an interval over (every unexpired
ID of it, unless there are more than a bound: then every ID is looked up) and learns each
commit's IDs. An ID that expired stays in it, which costs a lookup, never a wrong answer.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Mapping, Set
from typing import TypeVar

import numpy as np

__all__ = ["IdFilter", "first_occurrences", "unseen"]

T = TypeVar("T")


def first_occurrences(
    items: Mapping[str, Iterable[T]], identity: Callable[[T], bytes]
) -> dict[str, dict[bytes, T]]:
    """Per key, each distinct ID's first item, in delivery order."""
    firsts: dict[str, dict[bytes, T]] = {}
    for key, key_items in items.items():
        by_id = firsts.setdefault(key, {})
        for item in key_items:
            by_id.setdefault(identity(item), item)
    return firsts


def unseen(
    firsts: Mapping[str, Mapping[bytes, T]], seen: Set[tuple[str, bytes]]
) -> dict[str, list[T]]:
    """Per key, the items whose ``(key, ID)`` is not among ``seen``."""
    return {
        key: [item for record_id, item in by_id.items() if (key, record_id) not in seen]
        for key, by_id in firsts.items()
    }


_FALSE_POSITIVES = 0.01  # a Bloom filter's rate of IDs wrongly taken for seen: lookups
# splitmix64's mixing constants: IDs are 16 arbitrary bytes, not necessarily uniform.
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def _mix(words: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser of each word (uint64 arithmetic wraps, as it should)."""
    words = words + _GOLDEN
    words = (words ^ (words >> np.uint64(30))) * _MIX1
    words = (words ^ (words >> np.uint64(27))) * _MIX2
    mixed: np.ndarray = words ^ (words >> np.uint64(31))
    return mixed


class IdFilter:
    """A Bloom filter of record IDs (16 bytes each), sized for ``capacity`` IDs at a 1 %
    false-positive rate; whole batches of IDs at a time.

    :meth:`held_at` never leaves out an ID it was given (:meth:`add`); of the others it
    wrongly keeps about 1 % while it holds at most ``capacity`` (more, once :attr:`full`).
    It lives in one process only.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = max(capacity, 1)
        bits = math.ceil(-self.capacity * math.log(_FALSE_POSITIVES) / math.log(2) ** 2)
        self._words = max((bits + 63) // 64, 1)
        self._bits = np.uint64(self._words * 64)
        self._hashes = max(round(self._words * 64 / self.capacity * math.log(2)), 1)
        self._array = np.zeros(self._words, dtype=np.uint64)
        self.count = 0  # IDs added (with repeats)

    @property
    def full(self) -> bool:
        """Whether it holds more IDs than it was sized for (its answers grow vaguer)."""
        return self.count > self.capacity

    @property
    def size(self) -> int:
        """Its bits, in bytes."""
        return self._words * 8

    def _positions(self, record_ids: Collection[bytes]) -> np.ndarray:
        """Per ID, the bit positions of its ``_hashes`` hash functions (double hashing)."""
        halves = np.frombuffer(b"".join(record_ids), dtype="<u8").reshape(-1, 2)
        first = _mix(halves[:, 0] ^ _mix(halves[:, 1]))
        second = _mix(first) | np.uint64(1)
        steps = np.arange(self._hashes, dtype=np.uint64)
        with np.errstate(over="ignore"):
            return (first[:, None] + steps[None, :] * second[:, None]) % self._bits

    def add(self, record_ids: Collection[bytes]) -> None:
        if not record_ids:
            return
        positions = self._positions(record_ids).ravel()
        np.bitwise_or.at(
            self._array,
            positions >> np.uint64(6),
            np.left_shift(np.uint64(1), positions & np.uint64(63)),
        )
        self.count += len(record_ids)

    def held_at(self, record_ids: Collection[bytes]) -> list[int]:
        """The indices of those of ``record_ids`` it may hold, in order (the others were
        never added): for batches where most IDs are fresh."""
        if not record_ids:
            return []
        at: list[int] = np.flatnonzero(self._held(record_ids)).tolist()
        return at

    def _held(self, record_ids: Collection[bytes]) -> np.ndarray:
        positions = self._positions(record_ids)
        words = self._array[positions >> np.uint64(6)]
        bits = (words >> (positions & np.uint64(63))) & np.uint64(1)
        held: np.ndarray = bits.all(axis=1)
        return held
