"""The Cassandra store's row packing, without Cassandra."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from millstream.engine.errors import StoreError
from millstream.engine.sequencer import Lease
from millstream.engine.state import KeyChanges
from millstream.engine.store import NO_FLOOR, TimerFloor
from millstream.engine.stores.cassandra.rows import (
    change_rows,
    dedup_bucket_end,
    dedup_item,
    dedup_item_floor,
    dedup_kind,
    dedup_kinds_after,
    dedup_row_ids,
    pack_dedup_ids,
    pack_timer_floor,
    pack_timers,
    timers_count,
    unpack_timer_floor,
    unpack_timers,
)
from millstream.engine.stores.cassandra.schema import DEDUP_BUCKET_PREFIX, DEDUP_BUCKETS_END
from millstream.engine.timers import TimeDomain, Timer

pytestmark = pytest.mark.unit


def test_dedup_ids_pack_once_each_in_order_and_unpack_as_they_were() -> None:
    ids = [bytes([n]) * 16 for n in (3, 1, 3, 2)]
    packed = pack_dedup_ids(ids)
    assert packed == ids[0] + ids[1] + ids[3]
    assert dedup_row_ids({"record": packed, "item": b"row"}) == [ids[0], ids[1], ids[3]]


def test_a_dedup_id_that_is_no_record_id_is_refused() -> None:
    with pytest.raises(ValueError, match="must be 16 bytes"):
        pack_dedup_ids([b"\x01" * 16, b"short"])


def test_dedup_buckets_are_an_eighth_of_the_ttl_and_sort_in_time_order() -> None:
    ttl = 80
    kinds = [dedup_kind(expires, ttl) for expires in (-11, -1, 0, 9, 10, 79, 10**15)]
    assert [dedup_bucket_end(kind) for kind in kinds] == [-10, 0, 10, 10, 20, 80, 10**15 + 10]
    assert kinds == sorted(kinds)
    assert all(DEDUP_BUCKET_PREFIX < kind < DEDUP_BUCKETS_END for kind in kinds)
    # A bucket is after the bound of ``now`` exactly when it ends after ``now``.
    assert [kind > dedup_kinds_after(10) for kind in kinds] == [False] * 4 + [True] * 3
    assert dedup_bucket_end(dedup_kind(5, 1)) == 6  # never narrower than 1 µs


def test_a_dedup_rows_item_sorts_by_its_expiry_and_the_floor_of_now_keeps_the_unexpired() -> None:
    marker = b"\xff" * 16
    items = [dedup_item(expires, marker) for expires in (-(2**63), -1, 0, 1, 2**63 - 1)]
    assert items == sorted(items)
    assert dedup_item(5, b"\x00" * 16) > dedup_item_floor(5) > dedup_item(4, marker)


def test_a_keys_timers_pack_in_one_value_and_unpack_as_they_were() -> None:
    timers = [
        Timer("k", "close", -(2**63), TimeDomain.EVENT_TIME, b""),
        Timer("k", "ttl \u00e9", 2**63 - 1, TimeDomain.WALL_TIME, b"\x01" * 16),
        Timer("k", "", 0),
    ]
    packed = pack_timers(timers)
    assert timers_count(packed) == 3
    assert unpack_timers("k", packed) == {timer.tag: timer for timer in timers}
    assert unpack_timers("k", pack_timers([])) == {}


@pytest.mark.parametrize(
    "damage",
    [
        lambda packed: packed[:-1],  # truncated
        lambda packed: packed + b"\0",  # trailing bytes
        lambda packed: b"\0\0\0\2" + packed[4:],  # fewer timers than it says
        lambda packed: b"",
    ],
)
def test_a_damaged_timers_value_is_refused_not_misread(damage: Any) -> None:
    packed = pack_timers([Timer("k", "t", 5, set_by=b"x")])
    with pytest.raises(StoreError, match="timers row of key 'k' is corrupt"):
        unpack_timers("k", damage(packed))


# Stands in for the prepared statements: change_rows only names them.
_STATEMENTS: Any = SimpleNamespace(
    put_timers="put_timers", put_index="put_index", delete_row="delete_row", put_state="put_state"
)


def _rows(change: KeyChanges, timers: dict[str, Timer] | None, legacy: tuple[str, ...] = ()) -> Any:
    rows = change_rows(
        _STATEMENTS, Lease("c", 0, 1, cache_valid=False), change, (b"", b""), 0, 60, timers, legacy
    )
    return [(statement, values[2:]) for statement, values in rows]  # without the partition


def test_a_commit_writes_a_keys_whole_timer_set_in_one_row_and_deletes_it_once_empty() -> None:
    fired, kept, new = Timer("k", "w1", 10), Timer("k", "w2", 20), Timer("k", "w3", 30)
    change = KeyChanges("k", timers={"w1": None, "w3": new}, previous_timers=[fired])
    rows = _rows(change, {"w2": kept, "w3": new}, legacy=("w0",))
    assert rows[0] == ("put_timers", ("k", pack_timers([kept, new])))
    # The earlier version's row of the key goes; the index gains the new one, loses the fired.
    assert rows[1] == ("delete_row", ("timer", "k", b"w0"))
    assert [(statement, values[0]) for statement, values in rows[2:]] == [
        ("put_index", "timer_event"),
        ("delete_row", "timer_event"),
    ]
    emptied = _rows(KeyChanges("k", timers={"w2": None}), {})
    assert emptied == [("delete_row", ("timers", "k", b""))]
    # A change that leaves the timers alone writes no timers row, and needs no set.
    assert _rows(KeyChanges("k", state=b"s"), None) != []
    with pytest.raises(ValueError, match="whole set is unknown"):
        _rows(change, None)


def test_a_timer_floor_packs_and_unpacks_as_it_was_and_no_row_is_no_floor() -> None:
    for floor in (NO_FLOOR, TimerFloor(0, None), TimerFloor(None, -5), TimerFloor(2**63 - 1, 7)):
        assert unpack_timer_floor(pack_timer_floor(floor)) == floor
    assert unpack_timer_floor(None) == NO_FLOOR
    with pytest.raises(StoreError, match="timer floor row is corrupt"):
        unpack_timer_floor(pack_timer_floor(NO_FLOOR)[:-1])
