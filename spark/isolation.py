"""Isolating poison pills: narrowing a failing micro-batch down to the records that fail it.

A batch whose job fails again on retry, neither on an outage nor on a fence, may hold a
*poison pill*: a message that makes the engine itself fail (a decoder, a library, a worker
crashing on it; user code's own exceptions are already dead-lettered per record). Replaying
the batch would fail forever, so :class:`~millstream.spark.batch.BatchHandler` narrows the
failure down with the pure planner here and quarantines what it finds
(:mod:`millstream.spark.quarantine`).

The batch's records are :class:`OffsetRange` s of Kafka offsets. :func:`isolate` bisects
them, asking ``fails(ranges)`` (a *sub-run* of the batch on those records only, which counts
as failing when it fails twice in a row) about one half at a time:

- the earlier half first (:func:`split`: within each partition, by offset), and the later
  half only once the earlier one ran through, so every record a sub-run commits comes after
  the ones committed before it in its partition: per-key order is kept;
- when the earlier half runs through, the later one is taken to fail without running it, and
  the single record it narrows to is run alone to make sure: at most ``ceil(log2 n) + 1``
  questions per record isolated from ``n``, and one more for the batch without it; a
  question costs one sub-run when it runs through and two when it fails, so at most
  ``2 * ceil(log2 n) + 2`` sub-runs isolate a single poison pill;
- a record that fails alone is a *candidate*; the batch without its candidates runs next, and
  while that still fails the next candidate is looked for in it;
- if neither half fails alone (the failure takes records of both), or more records fail
  alone than :data:`MAX_ISOLATED` or than half the batch (one in a batch of one or two),
  nothing is isolated: the caller raises. A failure that many records trip is a bug or a
  broken worker, not poison.

Nothing is quarantined until the batch without its candidates ran through, so a failure that
is not record-caused never dead-letters good data. Re-running records that a sub-run already
committed is safe: exactly-once computations drop them as duplicates by record ID.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, NamedTuple

__all__ = [
    "MAX_ISOLATED",
    "Isolation",
    "OffsetRange",
    "Position",
    "batch_ranges",
    "count",
    "isolate",
    "narrow",
    "split",
    "without",
]

MAX_ISOLATED: Final = 16
"""Records one batch may isolate as poison. A bug that trips on many records (or on every
record of a kind) is not poison; dead-lettering them would hide it behind lost data, so
beyond this the batch fails as it did before isolation existed."""


class Position(NamedTuple):
    """A message's place in Kafka: topic, partition, offset."""

    topic: str
    partition: int
    offset: int

    def __str__(self) -> str:
        return f"{self.topic}/{self.partition}@{self.offset}"


@dataclass(frozen=True, slots=True, order=True)
class OffsetRange:
    """The offsets ``start`` (inclusive) to ``end`` (exclusive) of one topic partition."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        """Offsets in the range (an upper bound of its messages: transaction markers and
        compacted messages take offsets too)."""
        return self.end - self.start

    def __contains__(self, position: object) -> bool:
        return (
            isinstance(position, Position)
            and (position.topic, position.partition) == (self.topic, self.partition)
            and self.start <= position.offset < self.end
        )


def batch_ranges(
    ends: Mapping[str, Mapping[int, int]],
    starts: Mapping[str, Mapping[int, int]],
    topics: Iterable[str],
) -> list[OffsetRange]:
    """The non-empty ranges of ``topics`` a batch reads: from ``starts`` (the previous
    batch's end offsets, or the first offset read) to ``ends`` (its own), in (topic,
    partition) order. A partition with no start is read from offset 0."""
    ranges = []
    for topic in sorted(topics):
        for partition, end in sorted(ends.get(topic, {}).items()):
            start = starts.get(topic, {}).get(partition, 0)
            if end > start:
                ranges.append(OffsetRange(topic, partition, start, end))
    return ranges


def count(ranges: Iterable[OffsetRange]) -> int:
    """The offsets in ``ranges``."""
    return sum(r.size for r in ranges)


def split(ranges: Sequence[OffsetRange]) -> tuple[list[OffsetRange], list[OffsetRange]]:
    """``ranges`` (in (topic, partition, offset) order) cut into two halves as equal in
    offsets as can be, the first holding, within each partition, the earlier offsets.
    Each half is non-empty when ``ranges`` has two offsets or more."""
    total = count(ranges)
    if total < 2:
        raise ValueError(f"cannot split {total} offset(s) in two: {list(ranges)}")
    wanted = total // 2
    first: list[OffsetRange] = []
    second: list[OffsetRange] = []
    taken = 0
    for r in ranges:
        if taken >= wanted:
            second.append(r)
        elif taken + r.size <= wanted:
            first.append(r)
            taken += r.size
        else:
            cut = r.start + wanted - taken
            first.append(OffsetRange(r.topic, r.partition, r.start, cut))
            second.append(OffsetRange(r.topic, r.partition, cut, r.end))
            taken = wanted
    return first, second


def without(ranges: Iterable[OffsetRange], positions: Iterable[Position]) -> list[OffsetRange]:
    """``ranges`` with the offsets of ``positions`` cut out."""
    result = list(ranges)
    for position in positions:
        kept: list[OffsetRange] = []
        for r in result:
            if position not in r:
                kept.append(r)
                continue
            for start, end in ((r.start, position.offset), (position.offset + 1, r.end)):
                if end > start:
                    kept.append(OffsetRange(r.topic, r.partition, start, end))
        result = kept
    return result


def narrow(
    ranges: Sequence[OffsetRange], fails: Callable[[Sequence[OffsetRange]], bool]
) -> Position | None:
    """The one record of ``ranges`` (which fail together) that fails alone, found by halving
    (see the module docstring); ``None`` if the failure takes records of both halves."""
    current = list(ranges)
    verified = True  # current is known to fail: it did, or it is what the caller ran
    while count(current) > 1:
        first, second = split(current)
        if fails(first):
            current, verified = first, True
        else:
            current, verified = second, False  # the earlier half ran through
    if not current:
        return None
    if not verified and not fails(current):
        return None
    only = current[0]
    return Position(only.topic, only.partition, only.start)


@dataclass(frozen=True, slots=True)
class Isolation:
    """What :func:`isolate` found: the records that fail alone (empty: none could be found,
    or ``too_many``), and how many times it asked ``fails``."""

    poison: tuple[Position, ...]
    probes: int
    too_many: bool = False
    limit: int = MAX_ISOLATED


def isolate(
    ranges: Sequence[OffsetRange],
    fails: Callable[[Sequence[OffsetRange]], bool],
    *,
    limit: int = MAX_ISOLATED,
) -> Isolation:
    """The records of a batch's ``ranges`` (which failed together) that each fail alone and
    without which the rest runs through; see the module docstring. At most ``limit`` and
    half the batch: one more found and the result is ``too_many``, with no record."""
    limit = min(limit, max(1, count(ranges) // 2))

    probes = 0

    def counted(part: Sequence[OffsetRange]) -> bool:
        nonlocal probes
        probes += 1
        return fails(part)

    candidates: list[Position] = []
    remaining = list(ranges)
    while True:
        found = narrow(remaining, counted)
        if found is None:
            return Isolation((), probes, limit=limit)
        candidates.append(found)
        if len(candidates) > limit:
            return Isolation((), probes, too_many=True, limit=limit)
        remaining = without(remaining, [found])
        if not remaining or not counted(remaining):
            return Isolation(tuple(candidates), probes, limit=limit)
