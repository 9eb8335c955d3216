"""The Cassandra store's row packing, without Cassandra."""

from __future__ import annotations

import pytest

from millstream.engine.stores.cassandra.rows import (
    dedup_bucket_end,
    dedup_item,
    dedup_item_floor,
    dedup_kind,
    dedup_kinds_after,
    dedup_row_ids,
    pack_dedup_ids,
)
from millstream.engine.stores.cassandra.schema import DEDUP_BUCKET_PREFIX, DEDUP_BUCKETS_END

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
