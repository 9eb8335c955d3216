import math
from collections.abc import Collection

import pytest
from hypothesis import given
from hypothesis import strategies as st

from millstream.engine.dedup import BloomFilter, seen_before
from millstream.engine.records import injector_record_id

pytestmark = pytest.mark.unit


def ids(start: int, count: int) -> list[bytes]:
    return [injector_record_id("t", 0, n) for n in range(start, start + count)]


def test_sizing_follows_the_formulas() -> None:
    bloom = BloomFilter(1_000, 0.01)
    assert bloom.bit_count == math.ceil(-1_000 * math.log(0.01) / math.log(2) ** 2)
    assert bloom.probe_count == round(bloom.bit_count / 1_000 * math.log(2)) == 7


@given(st.lists(st.binary(min_size=1, max_size=32), max_size=200))
def test_no_false_negatives(items: list[bytes]) -> None:
    bloom = BloomFilter(50, 0.05)
    for item in items:
        bloom.add(item)
    assert all(item in bloom for item in items)


def test_false_positive_rate_stays_near_the_target() -> None:
    bloom = BloomFilter(5_000, 0.01)
    for record_id in ids(0, 5_000):
        bloom.add(record_id)
    false_positives = sum(record_id in bloom for record_id in ids(10_000, 20_000))
    assert false_positives / 20_000 < 0.02


def test_saturation_is_reported() -> None:
    bloom = BloomFilter(2, 0.01)
    for record_id in ids(0, 2):
        bloom.add(record_id)
    assert not bloom.saturated
    bloom.add(ids(2, 1)[0])
    assert bloom.saturated


def test_non_bytes_are_never_contained() -> None:
    bloom = BloomFilter(10, 0.01)
    bloom.add(b"x")
    assert "x" not in bloom


@pytest.mark.parametrize(("expected", "rate"), [(0, 0.01), (10, 0.0), (10, 1.0)])
def test_sizing_arguments_are_validated(expected: int, rate: float) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - either argument's message
        BloomFilter(expected, rate)


def test_only_possible_members_reach_the_store_and_it_decides() -> None:
    bloom = BloomFilter(100, 0.001)
    old, new = ids(0, 5), ids(100, 5)
    for record_id in old:
        bloom.add(record_id)
    asked: list[list[bytes]] = []

    def lookup(candidates: Collection[bytes]) -> set[bytes]:
        asked.append(list(candidates))
        return set(old[:2]) & set(candidates)

    assert seen_before([*old, *new], bloom, lookup) == frozenset(old[:2])
    assert asked == [old]


def test_fresh_ids_need_no_lookup() -> None:
    def lookup(candidates: Collection[bytes]) -> set[bytes]:
        raise AssertionError("the store must not be asked")

    assert seen_before(ids(0, 3), BloomFilter(10, 0.001), lookup) == frozenset()
