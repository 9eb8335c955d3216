"""The soft-state cache: committed state and timers of recently used keys (paper 6.2).

A worker that owns an interval may keep what it read and committed in memory, so its next
batch does not read it again. That *soft* state is valid only while nobody else wrote to the
interval: the lease tells (see :mod:`millstream.engine.sequencer`). :class:`StateCache` holds
it for every interval worker of a process, bounded in bytes and evicting the least recently
used keys, so a Python worker's memory stays bounded however much state its intervals hold.

Entries live in *scopes*: a worker opens a fresh scope whenever its lease says the cache is
void (:meth:`StateCache.new_scope`), so invalidating an interval costs nothing; the entries
of the old scope are never read again and age out.
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Final

from millstream.engine.store import KeySnapshot

__all__ = ["DEFAULT_CACHE_BYTES", "CacheStats", "StateCache"]

DEFAULT_CACHE_BYTES: Final = 128 * 1024 * 1024
"""A process's cache budget unless configured (``[executor] cache_bytes``)."""

# Rough bytes of a cached entry besides its key, state and timers: the OrderedDict slot, the
# tuple key, the snapshot and its dicts.
_ENTRY_OVERHEAD = 400
_TIMER_OVERHEAD = 200


@dataclass
class CacheStats:
    """Counters of one cache: lookups that found a valid entry, or did not."""

    hits: int = 0
    misses: int = 0
    evictions: int = 0


class StateCache:
    """Key snapshots by (scope, key), at most ``max_bytes`` (approximately), LRU-evicted.

    Thread-safe: the interval workers of one process share it, and a task runs its intervals
    on several threads. ``max_bytes`` of 0 disables caching.
    """

    def __init__(self, max_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be non-negative, got {max_bytes}")
        self.max_bytes = max_bytes
        self.bytes = 0
        self.stats = CacheStats()
        self._entries: OrderedDict[tuple[int, str], tuple[KeySnapshot, int]] = OrderedDict()
        self._scopes = itertools.count(1)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def new_scope(self) -> int:
        """A scope no entry belongs to yet."""
        return next(self._scopes)

    def get(self, scope: int, key: str) -> KeySnapshot | None:
        with self._lock:
            entry = self._entries.get((scope, key))
            if entry is None:
                self.stats.misses += 1
                return None
            self._entries.move_to_end((scope, key))
            self.stats.hits += 1
            return entry[0]

    def put(self, scope: int, key: str, snapshot: KeySnapshot) -> None:
        size = _size(key, snapshot)
        with self._lock:
            old = self._entries.pop((scope, key), None)
            if old is not None:
                self.bytes -= old[1]
            if size > self.max_bytes:
                return
            self._entries[(scope, key)] = (snapshot, size)
            self.bytes += size
            while self.bytes > self.max_bytes:
                _, (_, evicted) = self._entries.popitem(last=False)
                self.bytes -= evicted
                self.stats.evictions += 1

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.bytes = 0


def _size(key: str, snapshot: KeySnapshot) -> int:
    size = _ENTRY_OVERHEAD + len(key) + (len(snapshot.state) if snapshot.state else 0)
    for tag, timer in snapshot.timers.items():
        size += _TIMER_OVERHEAD + len(tag) + len(timer.set_by)
    return size
