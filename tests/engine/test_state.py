import pytest

from millstream.engine.productions import Production
from millstream.engine.records import Record
from millstream.engine.state import UNCHANGED, KeyChanges, effective_timers
from millstream.engine.timers import Timer

pytestmark = pytest.mark.unit

RID = bytes(16)


def production(value: bytes) -> Production:
    return Production("out", Record("k", value, 1, RID))


def test_new_changes_are_empty() -> None:
    changes = KeyChanges("k")
    assert changes.is_empty()
    assert changes.state is UNCHANGED


@pytest.mark.parametrize(
    "changes",
    [
        KeyChanges("k", state=b""),
        KeyChanges("k", state=None),
        KeyChanges("k", timers={"t": None}),
        KeyChanges("k", productions=[production(b"p")]),
        KeyChanges("k", dedup_ids=[RID]),
    ],
)
def test_any_change_is_not_empty(changes: KeyChanges) -> None:
    assert not changes.is_empty()


def test_merge_applies_later_changes_on_top() -> None:
    earlier = KeyChanges(
        "k",
        state=b"1",
        timers={"a": Timer("k", "a", 1), "b": Timer("k", "b", 2)},
        productions=[production(b"1")],
        dedup_ids=[b"1" * 16],
    )
    earlier.merge(
        KeyChanges(
            "k",
            timers={"a": None, "c": Timer("k", "c", 3)},
            productions=[production(b"2")],
            dedup_ids=[b"2" * 16],
        )
    )
    assert earlier.state == b"1"  # unchanged by the later call
    assert earlier.timers == {"a": None, "b": Timer("k", "b", 2), "c": Timer("k", "c", 3)}
    assert [p.record.value for p in earlier.productions] == [b"1", b"2"]
    assert earlier.dedup_ids == [b"1" * 16, b"2" * 16]
    earlier.merge(KeyChanges("k", state=None))
    assert earlier.state is None


def test_merged_changes_know_the_keys_whole_timer_set_when_the_later_or_both_know_it() -> None:
    a, b, c = Timer("k", "a", 1), Timer("k", "b", 2), Timer("k", "c", 3)
    earlier = KeyChanges("k", timers={"b": b}, timers_after={"a": a, "b": b})
    earlier.merge(KeyChanges("k", timers={"a": None, "c": c}))
    assert earlier.timers_after == {"b": b, "c": c} == effective_timers({"a": a}, earlier)
    earlier.merge(KeyChanges("k", state=b"s"))  # no timer changed: still known
    assert earlier.timers_after == {"b": b, "c": c}
    earlier.merge(KeyChanges("k", timers={"b": None}, timers_after={"c": c}))
    assert earlier.timers_after == {"c": c}
    unknown = KeyChanges("k", timers={"a": a})
    unknown.merge(KeyChanges("k", timers={"b": b}))
    assert unknown.timers_after is None


def test_changes_of_another_key_do_not_merge() -> None:
    with pytest.raises(ValueError, match="cannot merge"):
        KeyChanges("a").merge(KeyChanges("b"))


def test_size_grows_with_every_kind_of_change() -> None:
    base = KeyChanges("k").approximate_size()
    for changes in (
        KeyChanges("k", state=b"x" * 100),
        KeyChanges("k", timers={"t": None}),
        KeyChanges("k", productions=[production(b"x" * 100)]),
        KeyChanges("k", dedup_ids=[RID]),
    ):
        assert changes.approximate_size() > base


def test_effective_timers_apply_changes_in_order() -> None:
    committed = {"a": Timer("k", "a", 1), "b": Timer("k", "b", 2)}
    first = KeyChanges("k", timers={"a": None, "c": Timer("k", "c", 3)})
    second = KeyChanges("k", timers={"a": Timer("k", "a", 9)})
    assert effective_timers(committed, first, second) == {
        "a": Timer("k", "a", 9),
        "b": Timer("k", "b", 2),
        "c": Timer("k", "c", 3),
    }
    assert committed == {"a": Timer("k", "a", 1), "b": Timer("k", "b", 2)}
