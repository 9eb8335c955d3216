"""The poison-pill planner: offset ranges in, halves out, a failing record found in few runs."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest

from millstream.spark.isolation import (
    MAX_ISOLATED,
    OffsetRange,
    Position,
    batch_ranges,
    count,
    isolate,
    narrow,
    split,
    without,
)

pytestmark = pytest.mark.unit

RANGES = [
    OffsetRange("a", 0, 100, 1100),
    OffsetRange("a", 1, 0, 1000),
    OffsetRange("b", 0, 7, 1007),
]


def positions(ranges: Sequence[OffsetRange]) -> list[Position]:
    return [Position(r.topic, r.partition, o) for r in ranges for o in range(r.start, r.end)]


def test_batch_ranges_run_from_the_previous_ends_to_the_batch_ends_in_order() -> None:
    ends = {"b": {0: 50}, "a": {1: 30, 0: 10}, "wake": {0: 9}}
    starts = {"a": {0: 10, 1: 20}}
    assert batch_ranges(ends, starts, ["b", "a"]) == [
        OffsetRange("a", 1, 20, 30),  # partition 0 did not move: no range
        OffsetRange("b", 0, 0, 50),  # no start known: from offset 0
    ]


def test_split_halves_by_count_and_keeps_earlier_offsets_first() -> None:
    first, second = split(RANGES)
    assert count(first) == count(second) == 1500
    assert first == [OffsetRange("a", 0, 100, 1100), OffsetRange("a", 1, 0, 500)]
    assert second == [OffsetRange("a", 1, 500, 1000), OffsetRange("b", 0, 7, 1007)]
    # Within every partition, each offset of the first half precedes those of the second.
    for a in first:
        assert all(
            b.start >= a.end for b in second if (b.topic, b.partition) == (a.topic, a.partition)
        )
    assert sorted(positions(first) + positions(second)) == sorted(positions(RANGES))


def test_split_of_an_odd_count_and_of_too_little() -> None:
    assert split([OffsetRange("a", 0, 0, 3)]) == (
        [OffsetRange("a", 0, 0, 1)],
        [OffsetRange("a", 0, 1, 3)],
    )
    with pytest.raises(ValueError, match="cannot split 1"):
        split([OffsetRange("a", 0, 5, 6)])


def test_without_cuts_positions_out() -> None:
    cut = without(RANGES, [Position("a", 1, 0), Position("b", 0, 500), Position("c", 0, 1)])
    assert cut == [
        OffsetRange("a", 0, 100, 1100),
        OffsetRange("a", 1, 1, 1000),
        OffsetRange("b", 0, 7, 500),
        OffsetRange("b", 0, 501, 1007),
    ]
    assert count(cut) == count(RANGES) - 2


class Batch:
    """A fake batch that fails whenever a sub-run holds one of ``poison``; records every
    sub-run's ranges, in order, and what ran through (committed)."""

    def __init__(self, poison: set[Position], every: bool = False) -> None:
        self.poison = poison
        self.every = every
        self.runs: list[list[OffsetRange]] = []
        self.committed: list[Position] = []

    def fails(self, ranges: Sequence[OffsetRange]) -> bool:
        self.runs.append(list(ranges))
        held = positions(ranges)
        if self.every or self.poison.intersection(held):
            return True
        self.committed.extend(held)
        return False


@pytest.mark.parametrize("where", [0, 1, 777, 1499, 1500, 2222, 2999])
def test_one_poison_record_is_found_in_a_logarithmic_number_of_runs(where: int) -> None:
    poison = positions(RANGES)[where]
    batch = Batch({poison})
    found = isolate(RANGES, batch.fails)
    assert found.poison == (poison,)
    assert not found.too_many
    levels = math.ceil(math.log2(count(RANGES)))
    assert found.probes == len(batch.runs) <= levels + 2
    # Each failing question is asked twice by the runtime: 2 * levels + 2 sub-runs at most.
    failing = sum(poison in r for run in batch.runs for r in run)
    assert len(batch.runs) + failing <= 2 * levels + 2


def test_what_a_bisection_commits_keeps_the_order_of_every_partition() -> None:
    poison = Position("a", 1, 321)
    batch = Batch({poison})
    isolate(RANGES, batch.fails)
    # Before the last question (the batch without the poison), every record committed in a
    # partition comes after those committed earlier in it, and the poison is never passed.
    before_check = batch.committed[: len(batch.committed) - (count(RANGES) - 1)]
    last: dict[tuple[str, int], int] = {}
    for p in before_check:
        assert p.offset > last.get((p.topic, p.partition), -1)
        last[p.topic, p.partition] = p.offset
        if (p.topic, p.partition) == (poison.topic, poison.partition):
            assert p.offset < poison.offset


def test_several_poison_records_are_found_one_after_the_other() -> None:
    poison = {Position("a", 0, 500), Position("a", 0, 501), Position("b", 0, 9)}
    found = isolate(RANGES, Batch(poison).fails)
    assert set(found.poison) == poison
    assert len(found.poison) == 3


def test_a_failure_every_record_trips_is_not_poison_beyond_the_limit() -> None:
    batch = Batch(set(), every=True)
    found = isolate(RANGES, batch.fails, limit=3)
    assert found.too_many
    assert found.poison == ()
    assert batch.committed == []
    assert len(batch.runs) <= 4 * (math.ceil(math.log2(count(RANGES))) + 2)
    assert MAX_ISOLATED == 16


@pytest.mark.parametrize(("size", "allowed"), [(1, 1), (2, 1), (3, 1), (9, 4), (100, 16)])
def test_no_more_than_half_a_small_batch_is_taken_for_poison(size: int, allowed: int) -> None:
    ranges = [OffsetRange("a", 0, 0, size)]
    every = isolate(ranges, Batch(set(), every=True).fails)
    assert every.too_many == (size > 1)
    assert every.poison == (() if size > 1 else (Position("a", 0, 0),))
    poison = {Position("a", 0, o) for o in range(allowed)}
    assert set(isolate(ranges, Batch(poison).fails).poison) == poison


def test_a_failure_that_takes_records_of_both_halves_is_not_pinned_on_one() -> None:
    pair = {Position("a", 0, 200), Position("b", 0, 900)}

    def fails(ranges: Sequence[OffsetRange]) -> bool:
        return pair.issubset(positions(ranges))

    found = isolate(RANGES, fails)
    assert found.poison == ()
    assert not found.too_many


def test_narrow_verifies_a_record_it_only_inferred() -> None:
    asked: list[list[OffsetRange]] = []

    def flaky_once(ranges: Sequence[OffsetRange]) -> bool:
        asked.append(list(ranges))
        return False

    # Nothing fails alone: every earlier half runs through, the last record is asked alone.
    assert narrow([OffsetRange("a", 0, 0, 4)], flaky_once) is None
    assert asked[-1] == [OffsetRange("a", 0, 3, 4)]
    assert narrow([OffsetRange("a", 0, 8, 9)], flaky_once) == Position("a", 0, 8)
