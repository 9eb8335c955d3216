"""Per-key state and the change set a key accumulates before its commit (paper 4.4, 6.2).

A key's *hard* state in the store is its state bytes, its timers, the IDs of the records it
processed (dedup IDs) and, for the interval, the pending productions. User code never writes
any of it directly: each call records its effects in a :class:`KeyChanges`, the engine merges
the changes of a key's successful calls, and commits them in one atomic, sequencer-guarded
write, together with the dedup IDs of the records that caused them. A failed call's changes
are dropped whole.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, Literal, TypeAlias

from millstream.engine.productions import Production
from millstream.engine.timers import Timer

__all__ = ["UNCHANGED", "KeyChanges", "StateChange", "Unchanged", "effective_timers"]


class Unchanged(enum.Enum):
    """Marker type of :data:`UNCHANGED`."""

    UNCHANGED = "unchanged"


UNCHANGED: Final = Unchanged.UNCHANGED
StateChange: TypeAlias = bytes | Literal[Unchanged.UNCHANGED] | None
"""New state bytes, ``None`` to delete the state, or :data:`UNCHANGED`."""

# Rough per-row overhead of a store write, for sizing commit batches.
_ROW_OVERHEAD = 48
# Rough bytes of a timer in a key's row of all its timers, besides its tag.
_TIMER_BYTES = 40


@dataclass
class KeyChanges:
    """What one key's calls change, pending its commit.

    ``timers`` maps a tag to its new timer or to ``None`` (delete). ``productions`` are to be
    checkpointed as pending productions; ``dedup_ids`` are the IDs of the records consumed.
    ``previous_timers`` are committed timers these changes replace or delete (or stale index
    entries of them), named so a backend can drop them from its time-ordered index; the engine
    fills it at commit time. ``timers_after`` is the key's whole set of timers once ``timers``
    apply to its committed ones (:func:`effective_timers`), or ``None`` if the caller does not
    know it: a backend that keeps a key's timers in one row rewrites that row from it, and
    reads the committed timers itself when it is ``None``. The engine fills it at commit time
    for every key whose ``timers`` changed.
    """

    key: str
    state: StateChange = UNCHANGED
    timers: dict[str, Timer | None] = field(default_factory=dict)
    productions: list[Production] = field(default_factory=list)
    dedup_ids: list[bytes] = field(default_factory=list)
    previous_timers: list[Timer] = field(default_factory=list)
    timers_after: dict[str, Timer] | None = None

    def is_empty(self) -> bool:
        return (
            self.state is UNCHANGED
            and not self.timers
            and not self.productions
            and not self.dedup_ids
            and not self.previous_timers
        )

    def merge(self, later: KeyChanges) -> None:
        """Apply ``later`` (changes of the same key made afterwards) on top of these."""
        if later.key != self.key:
            raise ValueError(f"cannot merge changes of key {later.key!r} into {self.key!r}")
        if later.state is not UNCHANGED:
            self.state = later.state
        if later.timers and later.timers_after is not None:
            self.timers_after = later.timers_after
        elif later.timers and self.timers_after is not None:
            self.timers_after = effective_timers(self.timers_after, later)
        self.timers.update(later.timers)
        self.productions.extend(later.productions)
        self.dedup_ids.extend(later.dedup_ids)
        self.previous_timers.extend(later.previous_timers)

    def approximate_size(self) -> int:
        """Bytes this change set adds to a store batch, for splitting commits."""
        size = _ROW_OVERHEAD + len(self.key.encode("utf-8"))
        if isinstance(self.state, bytes):
            size += len(self.state)
        # A changed timer is a row of the time-ordered index, and a part of the key's row of
        # all its timers (rewritten whole: every timer of the set counts).
        size += sum(_ROW_OVERHEAD + len(tag) for tag in self.timers)
        if self.timers:
            whole = self.timers if self.timers_after is None else self.timers_after
            size += _ROW_OVERHEAD + sum(_TIMER_BYTES + len(tag) for tag in whole)
        size += sum(
            _ROW_OVERHEAD + len(p.stream) + len(p.record.key) + len(p.record.value)
            for p in self.productions
        )
        size += (_ROW_OVERHEAD + 16) * len(self.dedup_ids)
        size += sum(_ROW_OVERHEAD + len(t.tag) for t in self.previous_timers)
        return size


def effective_timers(committed: Mapping[str, Timer], *changes: KeyChanges) -> dict[str, Timer]:
    """A key's timers by tag: ``committed`` with ``changes`` applied in order."""
    timers = dict(committed)
    for change in changes:
        for tag, timer in change.timers.items():
            if timer is None:
                timers.pop(tag, None)
            else:
                timers[tag] = timer
    return timers
