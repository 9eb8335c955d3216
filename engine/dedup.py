"""Duplicate detection for exactly-once delivery (paper 6.1.1).

A computation records the ID of every record it processed in the same atomic commit as the
record's effects, so a redelivered record can be recognised and dropped. The store holds these
dedup IDs (until their TTL: the retry window plus the slack for late injectors); a worker also
keeps a Bloom filter of them, so most records, which were never seen, need no store read:

1. an ID the filter does not contain was provably never committed in this interval: fresh;
2. an ID it may contain is looked up in the store, which has the final word.

The filter is soft state: it is valid only while the worker's lease says nobody else wrote to
the interval (see :mod:`millstream.engine.sequencer`), and rebuilt from a scan otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Set

import mmh3

__all__ = ["BloomFilter", "seen_before"]


class BloomFilter:
    """A Bloom filter over byte strings, sized for ``expected_items`` at ``false_positive_rate``.

    ``m = ceil(-n ln p / (ln 2)^2)`` bits and ``k = round(m / n * ln 2)`` probes, derived by
    double hashing from the two 64-bit halves of MurmurHash3 x64 128 (Kirsch-Mitzenmacher).
    Beyond ``expected_items`` it keeps working with a rising false-positive rate; see
    :attr:`saturated`.
    """

    def __init__(self, expected_items: int, false_positive_rate: float) -> None:
        if expected_items < 1:
            raise ValueError(f"expected_items must be at least 1, got {expected_items}")
        if not 0.0 < false_positive_rate < 1.0:
            raise ValueError(f"false_positive_rate must be in (0, 1), got {false_positive_rate}")
        self.expected_items = expected_items
        self.bit_count = max(
            8, math.ceil(-expected_items * math.log(false_positive_rate) / math.log(2) ** 2)
        )
        self.probe_count = max(1, round(self.bit_count / expected_items * math.log(2)))
        self._bits = bytearray((self.bit_count + 7) // 8)
        self.count = 0

    def add(self, item: bytes) -> None:
        for position in self._positions(item):
            self._bits[position >> 3] |= 1 << (position & 7)
        self.count += 1

    def __contains__(self, item: object) -> bool:
        """False means never added; True means possibly added."""
        if not isinstance(item, bytes):
            return False
        return all(self._bits[p >> 3] & (1 << (p & 7)) for p in self._positions(item))

    @property
    def saturated(self) -> bool:
        """More items were added than it was sized for: rebuild it larger from the store."""
        return self.count > self.expected_items

    def _positions(self, item: bytes) -> list[int]:
        digest = mmh3.hash128(item, 0, signed=False)
        first, second = digest & 0xFFFF_FFFF_FFFF_FFFF, (digest >> 64) | 1
        return [(first + i * second) % self.bit_count for i in range(self.probe_count)]


def seen_before(
    record_ids: Collection[bytes],
    bloom: BloomFilter,
    lookup: Callable[[Collection[bytes]], Set[bytes]],
) -> frozenset[bytes]:
    """The IDs among ``record_ids`` that were already committed.

    ``lookup`` asks the store, and is called (once) only with the IDs the filter may contain.
    """
    maybe = [record_id for record_id in record_ids if record_id in bloom]
    return frozenset(lookup(maybe)) if maybe else frozenset()
