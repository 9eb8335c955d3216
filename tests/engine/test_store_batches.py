import pytest

from millstream.engine.state import KeyChanges
from millstream.engine.store import NO_FLOOR, TimerFloor, kept_floors, split_batches
from millstream.engine.timers import TimeDomain, Timer

pytestmark = pytest.mark.unit


def sized(key: str, state_bytes: int) -> KeyChanges:
    return KeyChanges(key, state=b"x" * state_bytes)


def test_keys_are_grouped_in_order_under_the_limit() -> None:
    changes = [sized(k, 100) for k in "abcde"]
    one = changes[0].approximate_size()
    batches = split_batches(changes, 2 * one)
    assert [[c.key for c in batch] for batch in batches] == [["a", "b"], ["c", "d"], ["e"]]


def test_a_key_over_the_limit_goes_alone_and_is_never_split() -> None:
    changes = [sized("a", 10), sized("big", 10_000), sized("b", 10)]
    batches = split_batches(changes, 500)
    assert [[c.key for c in batch] for batch in batches] == [["a"], ["big"], ["b"]]


def test_no_changes_no_batches() -> None:
    assert split_batches([], 100) == []


def test_a_commit_keeps_its_floor_with_its_last_batch_and_none_with_one_that_sets_timers() -> None:
    early, late = Timer("a", "t", 5), Timer("c", "t", 50, TimeDomain.WALL_TIME)
    batches = [
        [KeyChanges("a", timers={"t": early})],
        [KeyChanges("b", state=b"s")],
        [KeyChanges("c", timers={"t": late})],
    ]
    # Should a later batch never apply, the floor kept must hold after every one: a batch
    # setting a timer keeps none (it cannot know the floor kept before), one setting none
    # leaves it; the last keeps the caller's, at most every timer the commit sets.
    assert kept_floors(batches, TimerFloor(10, 60)) == [NO_FLOOR, None, TimerFloor(5, 50)]
    assert kept_floors(batches, None) == [NO_FLOOR, None, NO_FLOOR]
    assert kept_floors(batches[1:2], None) == [None]
    assert kept_floors(batches[1:2], TimerFloor(10, None)) == [TimerFloor(10, None)]
    assert kept_floors([], TimerFloor(10, 10)) == []
