import pytest
from hypothesis import given
from hypothesis import strategies as st

from millstream.engine.dedup import first_occurrences, unseen

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
