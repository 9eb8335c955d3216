import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from millstream.engine.dedup import IdFilter, first_occurrences, unseen

pytestmark = pytest.mark.unit


def test_first_occurrences_keep_each_id_once_per_key_in_delivery_order() -> None:
    items = {"a": [(b"1", "x"), (b"2", "y"), (b"1", "z")], "b": [(b"1", "w")]}
    firsts = first_occurrences(items, lambda item: item[0])
    assert firsts == {"a": {b"1": (b"1", "x"), b"2": (b"2", "y")}, "b": {b"1": (b"1", "w")}}
    assert list(firsts["a"]) == [b"1", b"2"]


def test_an_id_seen_under_one_key_is_fresh_under_another() -> None:
    firsts = {"a": {b"1": "a1", b"2": "a2"}, "b": {b"1": "b1"}}
    assert unseen(firsts, {("a", b"1")}) == {"a": ["a2"], "b": ["b1"]}


@given(
    st.dictionaries(
        st.sampled_from("abc"), st.lists(st.binary(min_size=1, max_size=2), max_size=8)
    ),
    st.sets(st.tuples(st.sampled_from("abc"), st.binary(min_size=1, max_size=2))),
)
def test_unseen_is_the_distinct_ids_minus_the_seen_pairs(
    items: dict[str, list[bytes]], seen: set[tuple[str, bytes]]
) -> None:
    fresh = unseen(first_occurrences(items, lambda item: item), seen)
    for key, ids in items.items():
        assert fresh[key] == [i for i in dict.fromkeys(ids) if (key, i) not in seen]


def _ids(start: int, count: int) -> list[bytes]:
    return [
        hashlib.blake2b(str(n).encode(), digest_size=16).digest()
        for n in range(start, start + count)
    ]


@pytest.mark.parametrize(
    "ids",
    [
        _ids(0, 20_000),
        # Not every 16-byte ID is a hash: counters, mostly zero bytes, must spread too.
        [n.to_bytes(16, "big") for n in range(20_000)],
    ],
    ids=["hashed", "counters"],
)
def test_a_filter_holds_every_id_added_and_few_others(ids: list[bytes]) -> None:
    ids_filter = IdFilter(len(ids))
    ids_filter.add(ids)
    assert ids_filter.held_at(ids) == list(range(len(ids)))
    others = _ids(10**9, 20_000)
    rate = len(ids_filter.held_at(others)) / len(others)
    assert rate < 0.02  # sized for 1 %
    assert not ids_filter.full
    ids_filter.add(_ids(10**8, 1))
    assert ids_filter.full


def test_an_empty_filter_holds_nothing_and_answers_in_order() -> None:
    ids_filter = IdFilter(100)
    assert ids_filter.held_at([]) == []
    ids_filter.add([])
    fresh, added = _ids(0, 2)
    assert ids_filter.held_at([fresh, added]) == []
    ids_filter.add([added])
    assert ids_filter.held_at([fresh, added, added]) == [1, 2]
    assert ids_filter.held_at([fresh, added, fresh, added]) == [1, 3]
