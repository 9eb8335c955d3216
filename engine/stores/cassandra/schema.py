"""The interval table: its CQL, its creation, and every statement the store runs on it.

The table's columns and what its rows hold are described in
:mod:`millstream.engine.stores.cassandra.store`.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

from cassandra.policies import FallthroughRetryPolicy

from millstream.engine.config import DEFAULT_KEYSPACE, DEFAULT_TABLE
from millstream.engine.errors import StoreError

__all__ = [
    "ANCHOR_KIND",
    "DEDUP_BUCKETS_END",
    "DEDUP_BUCKET_PREFIX",
    "DEFAULT_KEYSPACE",
    "DEFAULT_TABLE",
    "FENCES_TABLE",
    "LEGACY_DEDUP_KIND",
    "LEGACY_TIMER_KIND",
    "TIMERS_KIND",
    "TIMER_FLOOR_KIND",
    "Statements",
    "check_identifier",
    "create_schema",
    "execute_schema_change",
    "fences_cql",
    "first_timer_cql",
    "schema_cql",
    "table_id",
    "timer_floor_cql",
]

_IDENTIFIER = re.compile(r"^[a-z][a-z0-9_]{0,47}$")
ANCHOR_KIND = ""
"""The ``kind`` of an interval partition's anchor row (``key`` ``''``, ``item`` empty), which
sorts before every other row and is never deleted. A conditional write whose conditions are
on static columns only (every acquire and commit: ``IF sequencer = ...``) makes Cassandra read
the partition's first live row besides its static row, and that read passes over every
tombstone before it: acknowledged productions, fired timers, expired dedup IDs, kept for
``gc_grace_seconds`` (10 days). Without the anchor, an interval whose rows in front were all
deleted or expired paid for each of them in every LWT (20,000 of them: a store commit of one
key 30 to 34 ms against 6, ``bench/core_commits.py --tombstones 20000``), and from
``tombstone_failure_threshold`` (100,000) on every LWT failed. The anchor stops that read
at once. Written in the batch of a store's first acquire of the interval, so the partitions
of earlier versions get theirs too."""
DEDUP_BUCKET_PREFIX = "dedup@"
"""The ``kind`` of dedup rows starts so, followed by the end of the bucket of expiry times the
row's falls in (exclusive, µs plus 2**63 as a 20-digit decimal, so text order is time order;
:func:`~millstream.engine.stores.cassandra.rows.dedup_kind`). An expired ID stays a tombstone
for ``gc_grace_seconds`` (10 days) while its ID lives for the dedup TTL (10 minutes by
default): in one kind, every read of a key's or an interval's IDs passed over up to 10 days
of them. A read of the live buckets starts past the expired ones."""
DEDUP_BUCKETS_END = DEDUP_BUCKET_PREFIX + ":"
"""Sorts after every dedup bucket's kind (``:`` follows the digits)."""
LEGACY_DEDUP_KIND = "dedup"
"""The one ``kind`` of the dedup rows earlier versions wrote, read until they expire."""
TIMERS_KIND = "timers"
"""The ``kind`` of a key's one row of all its timers (``item`` empty, ``value`` packed:
:func:`~millstream.engine.stores.cassandra.rows.pack_timers`), rewritten whole by a commit
that changes them and deleted once none is left. A row a timer (earlier versions) left a
tombstone a fired timer for ``gc_grace_seconds`` (10 days), and a key whose timers are
tagged afresh (a window's end) had every read of it pass over them: 200 keys with 520 fired
timers each made a read of their state fail on the local node. Overwritten, a row leaves
none."""
LEGACY_TIMER_KIND = "timer"
"""The ``kind`` of earlier versions' timer rows, one per key and tag (``item`` the tag): read
beside :data:`TIMERS_KIND` (which, where a key has one, holds the key's timers) and deleted by
the key's next commit that changes its timers."""
TIMER_FLOOR_KIND = "timer_floor"
"""The ``kind`` of the interval's one row (``key`` ``''``, ``item`` empty) holding the timer
floor its latest commit kept (``value``:
:func:`~millstream.engine.stores.cassandra.rows.pack_timer_floor`), overwritten, never
deleted: where a worker taking the interval over starts its reads of the timer index. From
the start they passed over the index rows of every timer fired in ``gc_grace_seconds`` (ten
days), a tombstone each; 100,000 of them (a hundred keys with a timer a minute, for 17 hours)
fail the read, and with it every batch of the interval after a takeover."""
FENCES_TABLE = "millstream_fences"
"""The keyspace's table of fenced operations: per interval table, computation and key
interval, how many operations of a worker holding an old lease the store refused (a zombie
fenced), for the people looking at it (``millstream ui``); nothing depends on it."""


def schema_cql(keyspace: str, table: str = DEFAULT_TABLE) -> str:
    """The ``CREATE TABLE IF NOT EXISTS`` statement of the interval table."""
    check_identifier("keyspace", keyspace)
    check_identifier("table", table)
    return f"""CREATE TABLE IF NOT EXISTS {keyspace}.{table} (
    computation text,
    interval int,
    kind text,
    key text,
    item blob,
    sequencer bigint static,
    last_commit blob static,
    value blob,
    timer_timestamp bigint,
    timer_domain text,
    timer_set_by blob,
    expires bigint,
    stream text,
    record blob,
    PRIMARY KEY ((computation, interval), kind, key, item)
) WITH comment = 'millstream interval store: one partition per key interval, LWT writes only'"""


def fences_cql(keyspace: str) -> str:
    """The ``CREATE TABLE IF NOT EXISTS`` statement of :data:`FENCES_TABLE` (counters live
    in a table of their own in Cassandra)."""
    check_identifier("keyspace", keyspace)
    return f"""CREATE TABLE IF NOT EXISTS {keyspace}.{FENCES_TABLE} (
    store text,
    computation text,
    interval int,
    refused counter,
    PRIMARY KEY ((store, computation), interval)
) WITH comment = 'millstream: operations refused to workers holding an old lease, per interval'"""


def create_schema(session: Any, keyspace: str, table: str = DEFAULT_TABLE) -> None:
    """Create the interval table (and the keyspace's :data:`FENCES_TABLE`) in an existing
    keyspace; does nothing if they exist.

    ``session`` is a cassandra-driver ``Session``. The keyspace is not created here: its
    replication is a deployment decision (``millstream.connectors.cassandra.create_keyspace``
    makes a SimpleStrategy one for development).
    """
    statement = schema_cql(keyspace, table)
    if keyspace not in session.cluster.metadata.keyspaces:
        raise StoreError(
            f"keyspace {keyspace!r} does not exist; create it first (for development: "
            f"millstream.connectors.cassandra.create_keyspace(session, {keyspace!r}))"
        )
    execute_schema_change(session, statement)
    execute_schema_change(session, fences_cql(keyspace))


def execute_schema_change(session: Any, statement: str) -> None:
    """Run a schema change (``CREATE``, ``DROP``, ``ALTER``) with time for schema agreement.

    The driver answers a schema change only once the nodes agree on the new schema, waiting
    up to ``Cluster.max_schema_agreement_wait`` (10 s by default), and that wait counts against
    the request's own timeout (``Session.default_timeout``, also 10 s). A node that has just
    rejoined can take most of it to agree, and the statement, applied, then timed out on the
    client (reported as ``OperationTimedOut``, "Connection defunct by heartbeat"). So the
    timeout here is the two together.
    """
    timeout = session.default_timeout
    if timeout is not None:
        timeout += session.cluster.max_schema_agreement_wait
    session.execute(statement, timeout=timeout)


def table_id(session: Any, keyspace: str, table: str = DEFAULT_TABLE) -> uuid.UUID:
    """Cassandra's ID of the interval table: a new one whenever the table (or its keyspace)
    is dropped and created again, so it names the store's incarnation."""
    row = session.execute(
        "SELECT id FROM system_schema.tables WHERE keyspace_name = %s AND table_name = %s",
        (keyspace, table),
    ).one()
    if row is None:
        raise StoreError(f"table {keyspace}.{table} does not exist; create_schema makes it")
    found: uuid.UUID = row.id if hasattr(row, "id") else row["id"]
    return found


class Statements:
    """Every statement the store runs, prepared once with its consistency levels.

    ``name`` is the table's ``keyspace.table``; ``serial`` is the consistency level of Paxos
    and of reads of the sequencer, ``quorum`` that of everything else.
    """

    def __init__(self, session: Any, name: str, *, serial: Any, quorum: Any) -> None:
        self._session = session
        self._name = name
        self._serial = serial
        self._quorum = quorum
        where = "WHERE computation = ? AND interval = ?"
        self.acquire_first = self._prepare(
            f"INSERT INTO {name} (computation, interval, sequencer, last_commit) "
            "VALUES (?, ?, ?, ?) IF NOT EXISTS",
            lwt=True,
        )
        self.acquire_next = self._prepare(
            f"UPDATE {name} SET sequencer = ?, last_commit = ? {where} IF sequencer = ?",
            lwt=True,
        )
        # In the conditional batch of a store's first acquire of an interval: the
        # partition's first row, which no statement deletes (see ``ANCHOR_KIND``).
        self.put_anchor = self._prepare(
            f"INSERT INTO {name} (computation, interval, kind, key, item) "
            f"VALUES (?, ?, '{ANCHOR_KIND}', '', 0x)"
        )
        # Alone, it resolves unknown outcomes; as the first statement of a batch, it guards it.
        self.guard = self._prepare(
            f"UPDATE {name} SET last_commit = ? {where} IF sequencer = ? AND last_commit = ?",
            lwt=True,
        )
        self.read_sequencer = self._prepare(
            f"SELECT sequencer, last_commit FROM {name} {where} LIMIT 1", serial_read=True
        )
        # Not linearizable, and so no consensus round: a kept lease's check (holds).
        self.peek_sequencer = self._prepare(f"SELECT sequencer FROM {name} {where} LIMIT 1")
        columns = "computation, interval, kind, key, item"
        self.put_state = self._prepare(
            f"INSERT INTO {name} ({columns}, value) VALUES (?, ?, 'state', ?, 0x, ?)"
        )
        self.put_timer_floor = self._prepare(
            f"INSERT INTO {name} ({columns}, value) VALUES (?, ?, '{TIMER_FLOOR_KIND}', '', 0x, ?)"
        )
        self.read_timer_floor = self._prepare(timer_floor_cql(name))
        self.put_timers = self._prepare(
            f"INSERT INTO {name} ({columns}, value) VALUES (?, ?, '{TIMERS_KIND}', ?, 0x, ?)"
        )
        # A key's dedup IDs of one commit batch, packed in ``record``, in the bucket of their
        # expiry (``kind``); ``item``, unique, starts with the expiry (``rows.dedup_item``).
        self.put_dedup = self._prepare(
            f"INSERT INTO {name} ({columns}, expires, record) VALUES (?, ?, ?, ?, ?, ?, ?) "
            "USING TTL ?"
        )
        self.put_index = self._prepare(
            f"INSERT INTO {name} ({columns}, timer_timestamp, timer_domain, timer_set_by) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
        )
        # ``value``: the commit's tag, if any; written empty otherwise, for a reused slot's.
        self.put_productions = self._prepare(
            f"INSERT INTO {name} ({columns}, value, record) "
            "VALUES (?, ?, 'production', '', ?, ?, ?)"
        )
        self.delete_row = self._prepare(
            f"DELETE FROM {name} {where} AND kind = ? AND key = ? AND item = ?"
        )
        timer_columns = "timer_timestamp, timer_domain, timer_set_by"
        self.read_keys = self._prepare(
            f"SELECT kind, key, item, value, {timer_columns} FROM {name} {where} "
            f"AND kind IN ('state', '{LEGACY_TIMER_KIND}', '{TIMERS_KIND}') AND key IN ?"
        )
        dedup_columns = f"SELECT key, item, expires, record FROM {name} {where}"
        # The live rows of the keys in the live buckets: ``item > ?``, the expiry of now,
        # skips the expired rows of the earliest bucket.
        self.read_dedup = self._prepare(f"{dedup_columns} AND kind IN ? AND key IN ? AND item > ?")
        self.read_legacy_dedup = self._prepare(
            f"{dedup_columns} AND kind = '{LEGACY_DEDUP_KIND}' AND key IN ?"
        )
        # The buckets after the one of now, newest first: a load that stops at a bound of IDs
        # does before it reaches the expired rows of the earliest live bucket.
        live_buckets = f"AND kind > ? AND kind < '{DEDUP_BUCKETS_END}' ORDER BY kind DESC"
        # With their kinds: a takeover's load learns the live buckets from it.
        scanned = f"SELECT kind, key, item, expires, record FROM {name} {where}"
        self.scan_dedup = self._prepare(f"{scanned} {live_buckets}")
        self.scan_legacy_dedup = self._prepare(f"{scanned} AND kind = '{LEGACY_DEDUP_KIND}'")
        # The live buckets, one a read from the newest down (past a bucket's rows by the
        # index, not through them), and whether any row of an earlier version lives.
        self.next_dedup_bucket = self._prepare(
            f"SELECT kind FROM {name} {where} AND kind > ? AND kind < ? ORDER BY kind DESC LIMIT 1"
        )
        self.first_legacy_dedup = self._prepare(
            f"SELECT kind FROM {name} {where} AND kind = '{LEGACY_DEDUP_KIND}' LIMIT 1"
        )
        self.read_due = self._prepare(
            f"SELECT item, {timer_columns} FROM {name} {where} "
            "AND kind = ? AND key >= ? AND key < ?"
        )
        self.read_first_timer = self._prepare(first_timer_cql(name))
        self.scan_timers = self._prepare(
            f"SELECT kind, key, item, value, {timer_columns} FROM {name} {where} "
            f"AND kind IN ('{LEGACY_TIMER_KIND}', '{TIMERS_KIND}')"
        )
        self.scan_keys = self._prepare(
            f"SELECT key FROM {name} {where} "
            f"AND kind IN ('state', '{LEGACY_TIMER_KIND}', '{TIMERS_KIND}')"
        )
        self.scan_states = self._prepare(
            f"SELECT key, value FROM {name} {where} AND kind = 'state'"
        )
        self.delete_kind = self._prepare(f"DELETE FROM {name} {where} AND kind = ?")
        self.delete_dedup_buckets = self._prepare(
            f"DELETE FROM {name} {where} AND kind > '{DEDUP_BUCKET_PREFIX}' "
            f"AND kind < '{DEDUP_BUCKETS_END}'"
        )
        layout_row = f"{where} AND kind = 'layout' AND key = '' AND item = 0x"
        self.read_layout = self._prepare(f"SELECT value FROM {name} {layout_row}", serial_read=True)
        self.create_layout = self._prepare(
            f"INSERT INTO {name} ({columns}, value) VALUES (?, ?, 'layout', '', 0x, ?) "
            "IF NOT EXISTS",
            lwt=True,
        )
        self.change_layout = self._prepare(
            f"UPDATE {name} SET value = ? {layout_row} IF value = ?", lwt=True
        )
        self.scan_productions = self._prepare(
            f"SELECT item, value, record FROM {name} {where} AND kind = 'production'"
        )
        self.list_intervals = self._prepare(f"SELECT DISTINCT computation, interval FROM {name}")
        keyspace = name.split(".", 1)[0]
        self.count_fence = self._prepare(
            f"UPDATE {keyspace}.{FENCES_TABLE} SET refused = refused + 1 "
            "WHERE store = ? AND computation = ? AND interval = ?"
        )
        # A counter update is not idempotent: never sent twice (a count, not a fact).
        self.count_fence.retry_policy = FallthroughRetryPolicy()
        self.read_fences = self._prepare(
            f"SELECT interval, refused FROM {keyspace}.{FENCES_TABLE} "
            "WHERE store = ? AND computation = ?"
        )
        # A commit binds these two itself (rows.Bound): their values must be what it encodes.
        _expect_types(self.put_state, ("VarcharType", "Int32Type", "VarcharType", "BytesType"))
        _expect_types(
            self.put_dedup,
            (
                "VarcharType",
                "Int32Type",
                "VarcharType",
                "VarcharType",
                "BytesType",
                "LongType",
                "BytesType",
                "Int32Type",
            ),
        )

    def _prepare(self, cql: str, *, lwt: bool = False, serial_read: bool = False) -> Any:
        try:
            statement = self._session.prepare(cql)
        except Exception as exc:
            raise StoreError(
                f"cannot prepare a statement on {self._name} ({exc}); the table must exist "
                "with the interval store's columns: create it with "
                "millstream.engine.stores.cassandra.create_schema(session, keyspace, table)"
            ) from exc
        if serial_read:
            statement.consistency_level = self._serial
        else:
            statement.consistency_level = self._quorum
        if lwt:
            # Inside a batch the batch's own settings apply; these are for lone execution.
            statement.serial_consistency_level = self._serial
            statement.retry_policy = FallthroughRetryPolicy()
        return statement


def timer_floor_cql(name: str) -> str:
    """The read of an interval's kept timer floor (``TIMER_FLOOR_KIND``) in table ``name``:
    one row, by its whole key (the store's, and the live view's)."""
    return (
        f"SELECT value FROM {name} WHERE computation = ? AND interval = ? "
        f"AND kind = '{TIMER_FLOOR_KIND}' AND key = '' AND item = 0x"
    )


def first_timer_cql(name: str) -> str:
    """The read of the first entry of a timer index (``kind``) from a floor (``key >= ?``) in
    table ``name``: the store's next timers, and the live view's."""
    return (
        "SELECT key FROM "
        f"{name} WHERE computation = ? AND interval = ? AND kind = ? AND key >= ? LIMIT 1"
    )


def _expect_types(statement: Any, types: tuple[str, ...]) -> None:
    """Refuse a table whose columns would make :class:`~.rows.Bound` values wrong."""
    found = tuple(column.type.__name__ for column in statement.column_metadata)
    if found != types:
        raise StoreError(
            f"the statement {statement.query_string!r} binds {', '.join(found)}, not "
            f"{', '.join(types)}: the table's columns are not the interval store's; create it "
            "with millstream.engine.stores.cassandra.create_schema(session, keyspace, table)"
        )


def check_identifier(what: str, name: str) -> None:
    # Keyspace and table names cannot be bound as parameters; refuse anything but a plain
    # (unquoted, hence case-insensitive) identifier.
    if not _IDENTIFIER.match(name):
        raise ValueError(
            f"{name!r} is not a valid {what} name: use lowercase letters, digits and _ "
            "(at most 48, starting with a letter)"
        )
