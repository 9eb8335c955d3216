"""Tombstones by the hundred thousand, for tests of the reads that must not pass over them."""

from __future__ import annotations

from typing import Any

from cassandra.concurrent import execute_concurrent
from cassandra.query import BatchStatement, BatchType

from millstream.engine.stores.cassandra.rows import index_row
from millstream.engine.timers import Timer

# One more than Cassandra's default tombstone_failure_threshold: a read that meets them fails.
FAILING = 100_001


def delete_many(session: Any, delete: Any, rows: list[tuple[Any, ...]]) -> None:
    """Run the prepared ``delete`` for each of ``rows`` (rows of one partition), in unlogged
    batches of 400 sent 8 at a time: a hundred thousand tombstones in a few seconds."""
    batches = []
    for start in range(0, len(rows), 400):
        batch = BatchStatement(batch_type=BatchType.UNLOGGED)
        for values in rows[start : start + 400]:
            batch.add(delete, values)
        batches.append((batch, ()))
    for success, failure in execute_concurrent(session, batches, concurrency=8):
        assert success, failure


def delete_index_entries(session: Any, table: str, computation: str, count: int = FAILING) -> None:
    """Delete the time-index entries of ``count`` event-time timers (``k<n>``, tag ``t``, due
    at ``n``) from interval 0 of ``computation`` in ``table`` (``keyspace.table``): as if
    fired, tombstones below every timestamp from ``count`` on."""
    delete = session.prepare(
        f"DELETE FROM {table} WHERE computation = ? AND interval = 0 "
        "AND kind = ? AND key = ? AND item = ?"
    )
    entries = (index_row(Timer(f"k{n}", "t", n)) for n in range(count))
    delete_many(session, delete, [(computation, *entry) for entry in entries])


def delete_states(session: Any, table: str, computation: str, count: int = FAILING) -> None:
    """Delete the state of ``count`` keys (``gone<n>``, six digits, sorting before most) from
    interval 0 of ``computation`` in ``table``: as if their sessions ended."""
    delete = session.prepare(
        f"DELETE FROM {table} WHERE computation = ? AND interval = 0 "
        "AND kind = 'state' AND key = ? AND item = 0x"
    )
    delete_many(session, delete, [(computation, f"gone{n:06d}") for n in range(count)])
