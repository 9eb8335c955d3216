"""How the interval table's rows encode the model, and back.

A key's timers packed in one row, the time-ordered timer index, the packed productions of a
commit batch, the packed dedup IDs of a key's commit and their TTL, the rows a key's changes
write, and query results read as dicts. The table's columns are described in
:mod:`millstream.engine.stores.cassandra.store`.
"""

from __future__ import annotations

import struct
from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import Any, Final, NamedTuple, TypeAlias

from millstream.engine.errors import StoreError
from millstream.engine.productions import CommitTag, Production
from millstream.engine.records import RECORD_ID_BYTES, decode_record
from millstream.engine.sequencer import Lease
from millstream.engine.state import UNCHANGED, KeyChanges
from millstream.engine.store import NO_FLOOR, TimerFloor
from millstream.engine.stores.cassandra.schema import (
    DEDUP_BUCKET_PREFIX,
    LEGACY_TIMER_KIND,
    TIMERS_KIND,
    Statements,
)
from millstream.engine.timers import TimeDomain, Timer

__all__ = [
    "DEDUP_BUCKETS_PER_TTL",
    "TIMER_INDEX",
    "TIMESTAMP_OFFSET",
    "Bound",
    "Row",
    "change_rows",
    "dedup_bucket_end",
    "dedup_item",
    "dedup_item_floor",
    "dedup_kind",
    "dedup_kinds_after",
    "dedup_row_ids",
    "dedup_ttl_seconds",
    "index_floor",
    "index_row",
    "index_time",
    "indexed_timer",
    "one_row",
    "one_row_or_none",
    "pack_dedup_ids",
    "pack_productions",
    "pack_timer_floor",
    "pack_timers",
    "production_row_tag",
    "production_slot",
    "production_tag_value",
    "result_rows",
    "row_count",
    "row_timer",
    "timers_count",
    "unpack_productions",
    "unpack_timer_floor",
    "unpack_timers",
]


TIMER_INDEX: Final = {TimeDomain.EVENT_TIME: "timer_event", TimeDomain.WALL_TIME: "timer_wall"}
# Timestamps in the index as fixed-width decimals of (timestamp + 2^63): text order = time order.
TIMESTAMP_OFFSET = 2**63
# Length prefixes: of a stream name in a production row; of a record, and of a key in the
# timer index's item.
_LENGTH16 = struct.Struct(">H")
_LENGTH32 = struct.Struct(">I")
# A commit tag in a production row's ``value``: this prefix, then the lease token and commit
# number (earlier versions wrote the same in front of the row's marker in its ``item``).
_TAGGED: Final = b"T"
_TAG = struct.Struct(">qq")
# A production row's item: a slot, this prefix and a number.
_SLOT: Final = b"#"
_SLOT_NUMBER = struct.Struct(">I")
# Cassandra refuses TTLs above 20 years (Attributes.MAX_TTL).
_MAX_TTL_SECONDS = 20 * 365 * 24 * 3600
_MICROS_PER_SECOND = 1_000_000

# A commit's dedup rows fall in buckets of expiry times this many to a dedup TTL: a read of
# the live ones passes over the expired rows of one bucket at most (an eighth of a TTL's),
# and a lookup names some ten buckets.
DEDUP_BUCKETS_PER_TTL: Final = 8
# A dedup row's item starts with its expiry plus 2**63, unsigned: byte order is time order.
_EXPIRY = struct.Struct(">Q")

_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")
# A key's packed timers: their count, then each one's tag (length-prefixed), timestamp,
# domain, and ``set_by`` (length-prefixed).
_TIMER = struct.Struct(">qB")
_DOMAINS: Final = (TimeDomain.EVENT_TIME, TimeDomain.WALL_TIME)
_DOMAIN_CODES: Final = {domain: code for code, domain in enumerate(_DOMAINS)}


class Bound(NamedTuple):
    """A row of a batch whose values are serialized already, as the driver's ``bind`` would
    serialize its parameters: the batch takes them as they are.

    A commit's state and dedup rows are bound so, the partition and key of their values
    serialized once per key: ``BatchStatement.add`` binds every row on its own, 4 to 7 µs a
    row, against about 0.4 µs. The statements' column types are
    checked when they are prepared (``schema.Statements``).
    """

    statement: Any
    values: list[bytes]


# A statement of a batch with its parameters, or bound already.
Row: TypeAlias = tuple[Any, tuple[Any, ...]] | Bound


def index_time(timestamp: int) -> str:
    """``timestamp`` as the ``key`` of the timer index (text order is time order)."""
    return f"{timestamp + TIMESTAMP_OFFSET:020d}"


def index_floor(floor: TimerFloor, domain: TimeDomain) -> str:
    """Where a read of ``domain``'s timer index starts: at the floor, or at its first entry."""
    bound = floor.of(domain)
    return index_time(-TIMESTAMP_OFFSET if bound is None else bound)


def index_row(timer: Timer) -> tuple[str, str, bytes]:
    """The (kind, key, item) of a timer's row in the time-ordered index."""
    key = timer.key.encode("utf-8")
    item = _LENGTH32.pack(len(key)) + key + timer.tag.encode("utf-8")
    return TIMER_INDEX[timer.domain], index_time(timer.timestamp), item


def indexed_timer(row: dict[str, Any]) -> Timer:
    """The timer a row of the timer index holds."""
    item: bytes = row["item"]
    (length,) = _LENGTH32.unpack_from(item)
    start = _LENGTH32.size
    return Timer(
        key=item[start : start + length].decode("utf-8"),
        tag=item[start + length :].decode("utf-8"),
        timestamp=row["timer_timestamp"],
        domain=TimeDomain(row["timer_domain"]),
        set_by=row["timer_set_by"] or b"",
    )


def row_timer(row: dict[str, Any]) -> Timer:
    """The timer an earlier version's row of one timer (``LEGACY_TIMER_KIND``) holds."""
    return Timer(
        key=row["key"],
        tag=row["item"].decode("utf-8"),
        timestamp=row["timer_timestamp"],
        domain=TimeDomain(row["timer_domain"]),
        set_by=row["timer_set_by"] or b"",
    )


# A timer floor: per domain (event time, then wall time), whether it is known, and where.
_FLOOR = struct.Struct(">?q?q")


def pack_timer_floor(floor: TimerFloor) -> bytes:
    """``floor`` as the ``value`` of the interval's ``TIMER_FLOOR_KIND`` row."""
    event_time, wall_time = floor.event_time, floor.wall_time
    return _FLOOR.pack(
        event_time is not None, event_time or 0, wall_time is not None, wall_time or 0
    )


def unpack_timer_floor(packed: bytes | None) -> TimerFloor:
    """The floor a ``TIMER_FLOOR_KIND`` row's ``value`` holds (``None``, no row: none)."""
    if packed is None:
        return NO_FLOOR
    try:
        event_known, event_time, wall_known, wall_time = _FLOOR.unpack(packed)
    except struct.error as exc:
        raise StoreError(f"the interval's timer floor row is corrupt: {exc}") from exc
    return TimerFloor(event_time if event_known else None, wall_time if wall_known else None)


def pack_timers(timers: Collection[Timer]) -> bytes:
    """A key's ``timers`` as the ``value`` of its :data:`TIMERS_KIND` row."""
    parts = [_LENGTH32.pack(len(timers))]
    for timer in timers:
        tag = timer.tag.encode("utf-8")
        parts += (_LENGTH32.pack(len(tag)), tag)
        parts += (_TIMER.pack(timer.timestamp, _DOMAIN_CODES[timer.domain]),)
        parts += (_LENGTH32.pack(len(timer.set_by)), timer.set_by)
    return b"".join(parts)


def unpack_timers(key: str, packed: bytes) -> dict[str, Timer]:
    """The timers of ``key`` by tag, from its :data:`TIMERS_KIND` row's ``value``."""
    try:
        (count,) = _LENGTH32.unpack_from(packed)
        offset = _LENGTH32.size
        timers: dict[str, Timer] = {}
        for _ in range(count):
            (length,) = _LENGTH32.unpack_from(packed, offset)
            offset += _LENGTH32.size
            tag = packed[offset : offset + length].decode("utf-8")
            offset += length
            timestamp, domain = _TIMER.unpack_from(packed, offset)
            offset += _TIMER.size
            (length,) = _LENGTH32.unpack_from(packed, offset)
            offset += _LENGTH32.size
            set_by = packed[offset : offset + length]
            offset += length
            timers[tag] = Timer(key, tag, timestamp, _DOMAINS[domain], set_by)
    except (struct.error, IndexError, UnicodeDecodeError) as exc:
        raise StoreError(f"the timers row of key {key!r} is corrupt: {exc}") from exc
    if offset != len(packed) or len(timers) != count:
        raise StoreError(
            f"the timers row of key {key!r} is corrupt: {len(packed)} bytes where its "
            f"{count} timers take {offset}, {len(timers)} distinct tags"
        )
    return timers


def timers_count(packed: bytes) -> int:
    """How many timers a :data:`TIMERS_KIND` row's ``value`` holds (read from its head)."""
    return int(_LENGTH32.unpack_from(packed)[0])


def pack_productions(productions: Sequence[Production]) -> bytes:
    """The ``record`` column of a commit batch's production row."""
    parts: list[bytes] = []
    for production in productions:
        stream = production.stream.encode("utf-8")
        record = production.envelope
        parts += (_LENGTH16.pack(len(stream)), stream, _LENGTH32.pack(len(record)))
        parts.append(record)
    return b"".join(parts)


def production_slot(number: int) -> bytes:
    """The ``item`` of the production row in slot ``number``."""
    return _SLOT + _SLOT_NUMBER.pack(number)


def production_tag_value(tag: CommitTag | None) -> bytes:
    """The ``value`` of a production row of a commit tagged ``tag`` (empty: untagged)."""
    return b"" if tag is None else _TAGGED + _TAG.pack(tag.token, tag.number)


def production_row_tag(row: dict[str, Any]) -> CommitTag | None:
    """The commit tag of a production row (``None``: untagged): in its ``value``, or, in a
    row of an earlier version, in front of the marker in its ``item``."""
    value: bytes | None = row["value"]
    if value:
        return CommitTag(*_TAG.unpack_from(value, len(_TAGGED)))
    item: bytes = row["item"]
    if value is None and len(item) == 1 + _TAG.size + 16 and item.startswith(_TAGGED):
        return CommitTag(*_TAG.unpack_from(item, 1))
    return None


def unpack_productions(packed: bytes, tag: CommitTag | None = None) -> list[Production]:
    """The productions of a production row's ``record`` column, tagged ``tag``."""
    productions: list[Production] = []
    offset = 0
    while offset < len(packed):
        (length,) = _LENGTH16.unpack_from(packed, offset)
        offset += _LENGTH16.size
        stream = packed[offset : offset + length].decode("utf-8")
        offset += length
        (length,) = _LENGTH32.unpack_from(packed, offset)
        offset += _LENGTH32.size
        envelope = packed[offset : offset + length]
        productions.append(Production(stream, decode_record(envelope), envelope, tag))
        offset += length
    return productions


def pack_dedup_ids(record_ids: Sequence[bytes]) -> bytes:
    """A dedup row's ``record``: the distinct IDs, 16 bytes each, one after the other."""
    distinct = dict.fromkeys(map(bytes, record_ids))  # map: no generator frame per ID
    packed = b"".join(distinct)
    if len(packed) != RECORD_ID_BYTES * len(distinct):
        odd = next(i for i in distinct if len(i) != RECORD_ID_BYTES)
        raise ValueError(f"a dedup ID must be {RECORD_ID_BYTES} bytes (a record ID), got {odd!r}")
    return packed


def dedup_row_ids(row: dict[str, Any]) -> list[bytes]:
    """The record IDs of a dedup row: those packed in its ``record``, or its ``item`` alone
    (a row per ID, as versions before packing wrote them; read until they expire)."""
    packed = row["record"]
    if packed is None:
        return [row["item"]]
    size = RECORD_ID_BYTES
    return [packed[start : start + size] for start in range(0, len(packed), size)]


def dedup_kind(expires: int, dedup_ttl: int) -> str:
    """The ``kind`` of a dedup row expiring at ``expires``: its bucket's (exclusive) end,
    buckets an eighth of ``dedup_ttl`` wide (``schema.DEDUP_BUCKET_PREFIX``)."""
    width = max(1, -(-dedup_ttl // DEDUP_BUCKETS_PER_TTL))
    return DEDUP_BUCKET_PREFIX + index_time((expires // width + 1) * width)


def dedup_bucket_end(kind: str) -> int:
    """The end of the bucket a dedup row's ``kind`` names: its rows expire before it."""
    return int(kind[len(DEDUP_BUCKET_PREFIX) :]) - TIMESTAMP_OFFSET


def dedup_kinds_after(now: int) -> str:
    """The bound past which the dedup kinds are of buckets ending after ``now``: the ones that
    may hold a live ID."""
    return DEDUP_BUCKET_PREFIX + index_time(now)


def dedup_item(expires: int, marker: bytes) -> bytes:
    """The ``item`` of a commit's dedup row: its ``expires``, then the commit's ``marker``."""
    return _EXPIRY.pack(expires + TIMESTAMP_OFFSET) + marker


def dedup_item_floor(now: int) -> bytes:
    """The items after this one are of dedup rows expiring at ``now`` or later."""
    return _EXPIRY.pack(now + TIMESTAMP_OFFSET)


def dedup_ttl_seconds(dedup_ttl: int) -> int:
    """The ``USING TTL`` of dedup IDs kept for ``dedup_ttl`` µs."""
    if dedup_ttl <= 0:
        raise ValueError(
            f"dedup_ttl must be a positive number of µs, got {dedup_ttl} (a TTL of 0 would "
            "make Cassandra keep dedup IDs forever)"
        )
    # Rounded up, plus the part of the current second Cassandra's expiry clock ignores.
    seconds = -(-dedup_ttl // _MICROS_PER_SECOND) + 1
    if seconds > _MAX_TTL_SECONDS:
        raise ValueError(
            f"dedup_ttl of {dedup_ttl} µs is over Cassandra's 20-year TTL limit; "
            "shorten the retry window and late-injector slack"
        )
    return seconds


def change_rows(
    statements: Statements,
    lease: Lease,
    change: KeyChanges,
    dedup: tuple[bytes, bytes],
    expires: int,
    ttl_seconds: int,
    timers: Mapping[str, Timer] | None = None,
    legacy_tags: Collection[str] = (),
) -> list[Row]:
    """The rows that write ``change`` (its timers' index rows included), with their
    statements. Its dedup IDs go in one row, ``dedup`` its kind and item (the item unique to
    the commit batch), serialized; ``expires`` and ``ttl_seconds`` their expiry.

    If ``change.timers`` is not empty, ``timers`` is the key's whole set after it, written as
    the key's one timers row (deleted once empty), and ``legacy_tags`` the tags of the key's
    rows of an earlier version, deleted (the new row holds what they held)."""
    partition = (lease.computation, lease.interval)
    key = change.key
    # The values of put_state and put_dedup that every row of the key shares, serialized.
    shared = [lease.computation.encode("utf-8"), _INT32.pack(lease.interval), key.encode("utf-8")]
    rows: list[Row] = []
    if change.state is None:
        rows.append((statements.delete_row, (*partition, "state", key, b"")))
    elif change.state is not UNCHANGED:
        rows.append(Bound(statements.put_state, [*shared, bytes(change.state)]))
    if change.timers:
        if timers is None:
            raise ValueError(f"the timers of key {key!r} change, and their whole set is unknown")
        # One row of all the key's timers, rewritten whole, not a row a tag: a fired timer's
        # row would stay a tombstone for gc_grace_seconds, and a key whose timers are tagged
        # afresh (a window's end) would have every read of it pass over thousands.
        if timers:
            rows.append((statements.put_timers, (*partition, key, pack_timers(timers.values()))))
        else:
            rows.append((statements.delete_row, (*partition, TIMERS_KIND, key, b"")))
        for tag in legacy_tags:
            item = tag.encode("utf-8")
            rows.append((statements.delete_row, (*partition, LEGACY_TIMER_KIND, key, item)))
    indexed: set[tuple[str, str, bytes]] = set()
    for timer in change.timers.values():
        if timer is None:
            continue
        timer_columns = (timer.timestamp, timer.domain.value, timer.set_by)
        index = index_row(timer)
        indexed.add(index)
        rows.append((statements.put_index, (*partition, *index, *timer_columns)))
    for previous in change.previous_timers:
        # A delete and a put of one row in one batch share a timestamp, and the delete
        # would win: a timer set again at the same time keeps its index row.
        index = index_row(previous)
        if index not in indexed:
            rows.append((statements.delete_row, (*partition, *index)))
    if change.dedup_ids:
        # One row of all the key's IDs, not a row each: each row of a commit is written
        # twice (the Paxos proposal, then the table), and a record's ID was most of them.
        packed = pack_dedup_ids(change.dedup_ids)
        expiry = [_INT64.pack(expires), packed, _INT32.pack(ttl_seconds)]
        kind, item = dedup
        computation, interval, key_bytes = shared
        rows.append(
            Bound(statements.put_dedup, [computation, interval, kind, key_bytes, item, *expiry])
        )
    return rows


def row_count(change: KeyChanges, legacy_timers: int = 0) -> int:
    """The statements :func:`change_rows` makes of ``change`` (with ``legacy_timers`` legacy
    timer rows of its key to delete), at most."""
    state = 0 if change.state is UNCHANGED else 1
    timers = len(change.timers) + len(change.previous_timers)
    if change.timers:
        timers += 1 + legacy_timers
    # Productions share one row per batch; counting each keeps the cap conservative.
    return state + timers + (1 if change.dedup_ids else 0) + len(change.productions)


def result_rows(result: Any) -> Iterator[dict[str, Any]]:
    """Rows as dicts, whatever row factory the caller's session uses."""
    names = result.column_names
    for row in result:
        yield dict(row) if isinstance(row, dict) else dict(zip(names, row, strict=True))


def one_row(result: Any) -> dict[str, Any]:
    """The one row of an LWT's ``result`` as a dict."""
    rows = list(result_rows(result))
    if len(rows) != 1:
        raise StoreError(f"an LWT returned {len(rows)} rows instead of one; this is a bug")
    return rows[0]


def one_row_or_none(result: Any) -> dict[str, Any] | None:
    """The first row of ``result`` as a dict, or ``None``."""
    return next(result_rows(result), None)
