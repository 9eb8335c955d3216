import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from millstream.engine.keys import (
    HASH_SPACE,
    MAX_KEY_INTERVALS,
    interval_hash_range,
    key_hash,
    key_interval,
)

pytestmark = pytest.mark.unit

interval_counts = st.integers(1, MAX_KEY_INTERVALS)


def test_hash_is_the_documented_murmur3() -> None:
    # Reference values of MurmurHash3_x86_32 with seed 0.
    assert key_hash("") == 0
    assert key_hash("hello") == 0x248BFA47
    assert key_hash("britney") == key_hash("britney")


def test_known_intervals_are_stable() -> None:
    # Part of the storage format: these must never change.
    assert [key_interval(k, 16) for k in ("britney", "carly", "cat videos", "")] == [
        key_hash("britney") * 16 >> 32,
        key_hash("carly") * 16 >> 32,
        key_hash("cat videos") * 16 >> 32,
        0,
    ]
    assert key_interval("hello", 16) == 0x248BFA47 >> 28


@given(st.text(), interval_counts)
def test_key_lands_in_the_range_its_interval_owns(key: str, intervals: int) -> None:
    interval = key_interval(key, intervals)
    low, high = interval_hash_range(interval, intervals)
    assert 0 <= interval < intervals
    assert low <= key_hash(key) < high


@given(interval_counts)
def test_ranges_tile_the_hash_space(intervals: int) -> None:
    ranges = [interval_hash_range(i, intervals) for i in range(min(intervals, 64))]
    assert ranges[0][0] == 0
    assert all(a[1] == b[0] and a[0] < a[1] for a, b in itertools.pairwise(ranges))
    assert interval_hash_range(intervals - 1, intervals)[1] == HASH_SPACE


@given(st.text(), st.integers(1, MAX_KEY_INTERVALS // 2))
def test_doubling_splits_each_interval_in_two(key: str, intervals: int) -> None:
    assert key_interval(key, 2 * intervals) // 2 == key_interval(key, intervals)


@pytest.mark.parametrize("bad", [0, -1, MAX_KEY_INTERVALS + 1])
def test_interval_count_is_validated(bad: int) -> None:
    with pytest.raises(ValueError, match="key intervals"):
        key_interval("k", bad)


@pytest.mark.parametrize("bad", [2.0, True, "4"])
def test_interval_count_must_be_an_int(bad: object) -> None:
    with pytest.raises(TypeError):
        key_interval("k", bad)  # type: ignore[arg-type]


def test_interval_index_is_validated() -> None:
    with pytest.raises(ValueError, match="outside"):
        interval_hash_range(4, 4)
