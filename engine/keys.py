"""Keys to key intervals: contiguous ranges of a 32-bit MurmurHash3.

A computation's keys are spread over ``N`` key intervals; each interval is one unit of work
(one sequencer, one store partition). The mapping is by hash *range*, not modulo::

    h        = mmh3.hash(key.encode("utf-8"), seed=0, signed=False)   # x86 32-bit, in [0, 2**32)
    interval = (h * N) >> 32                                           # in [0, N)

so interval ``i`` owns exactly the hashes ``[ceil(i * 2**32 / N), ceil((i + 1) * 2**32 / N))``.
Contiguous ranges can be split or merged without moving keys between unrelated intervals:
with ``2N`` intervals, interval ``i`` splits into ``2i`` and ``2i + 1``.

The formula is part of the storage format: changing it, or ``N`` for a running computation,
reassigns keys to partitions that do not hold their state. 32 bits give every interval at least
``2**32 / MAX_KEY_INTERVALS`` hash values, ample for balance.
"""

from __future__ import annotations

import mmh3

__all__ = ["HASH_SPACE", "MAX_KEY_INTERVALS", "interval_hash_range", "key_hash", "key_interval"]

HASH_SPACE = 2**32
# Each interval is a store partition and a sequencer to acquire per batch; more than this is a
# misconfiguration rather than a need.
MAX_KEY_INTERVALS = 2**16


def key_hash(key: str) -> int:
    """The unsigned 32-bit MurmurHash3 (x86, seed 0) of the key's UTF-8 bytes."""
    return mmh3.hash(key.encode("utf-8"), 0, signed=False)


def key_interval(key: str, intervals: int) -> int:
    """The interval in ``[0, intervals)`` whose hash range holds ``key``."""
    _check_intervals(intervals)
    return (key_hash(key) * intervals) >> 32


def interval_hash_range(interval: int, intervals: int) -> tuple[int, int]:
    """The half-open range ``[low, high)`` of key hashes that ``interval`` owns."""
    _check_intervals(intervals)
    if not 0 <= interval < intervals:
        raise ValueError(f"interval {interval} is outside [0, {intervals})")
    return -(-interval * HASH_SPACE // intervals), -(-(interval + 1) * HASH_SPACE // intervals)


def _check_intervals(intervals: int) -> None:
    if isinstance(intervals, bool) or not isinstance(intervals, int):
        raise TypeError(f"the number of key intervals must be an int, got {intervals!r}")
    if not 1 <= intervals <= MAX_KEY_INTERVALS:
        raise ValueError(
            f"the number of key intervals must be in [1, {MAX_KEY_INTERVALS}], got {intervals}"
        )
