import pytest

from millstream.engine.state import KeyChanges
from millstream.engine.store import split_batches

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
