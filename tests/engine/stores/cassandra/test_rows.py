"""The Cassandra store's row packing, without Cassandra."""

from __future__ import annotations

import pytest

from millstream.engine.stores.cassandra.rows import dedup_row_ids, pack_dedup_ids

pytestmark = pytest.mark.unit


def test_dedup_ids_pack_once_each_in_order_and_unpack_as_they_were() -> None:
    ids = [bytes([n]) * 16 for n in (3, 1, 3, 2)]
    packed = pack_dedup_ids(ids)
    assert packed == ids[0] + ids[1] + ids[3]
    assert dedup_row_ids({"record": packed, "item": b"row"}) == [ids[0], ids[1], ids[3]]


def test_a_dedup_id_that_is_no_record_id_is_refused() -> None:
    with pytest.raises(ValueError, match="must be 16 bytes"):
        pack_dedup_ids([b"\x01" * 16, b"short"])
