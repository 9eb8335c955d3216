"""For the live view: what Cassandra holds about one computation's key intervals, read-only."""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Any, Final

from cassandra import ConsistencyLevel, InvalidRequest, ReadFailure

from millstream.engine.errors import StoreError
from millstream.engine.layout import IntervalLayout, LayoutChange
from millstream.engine.stores.cassandra.chain import is_too_many_tombstones
from millstream.engine.stores.cassandra.rows import (
    TIMER_INDEX,
    TIMESTAMP_OFFSET,
    dedup_kinds_after,
    index_floor,
    result_rows,
    timers_count,
    unpack_timer_floor,
)
from millstream.engine.stores.cassandra.schema import (
    DEDUP_BUCKETS_END,
    FENCES_TABLE,
    LEGACY_DEDUP_KIND,
    LEGACY_TIMER_KIND,
    TIMERS_KIND,
    check_identifier,
    first_timer_cql,
    timer_floor_cql,
)
from millstream.engine.stores.cassandra.store import RETIRED_SEQUENCER
from millstream.engine.timers import TimeDomain

__all__ = ["MAX_ROWS", "IntervalReads", "interval_overview"]

# Where CassandraIntervalStore keeps a computation's layout: a partition of this interval ID
# (never a key interval's), one row of kind 'layout', its value the layout's JSON.
_LAYOUT_INTERVAL: Final = -1
# The counts of an interval's entry and the row kind each counts.
_COUNTED_KINDS: Final = {
    "state_keys": "state",
    "timers": LEGACY_TIMER_KIND,  # and the timers of the keys' timers rows
    "pending_productions": "production",
    "dedup_rows": LEGACY_DEDUP_KIND,  # and the rows of the dedup buckets not yet ended
}
MAX_ROWS: Final = 1_000
"""Where an interval's counts stop by default: each counted row crosses the network and the
driver's decoder, and a view must cost its topology next to nothing."""
# Intervals whose reads are in flight at once: one round trip for many, yet a bounded load
# on the coordinator however many intervals the computation has.
_INTERVALS_AT_ONCE: Final = 32


def interval_overview(
    session: Any,
    keyspace: str,
    table: str,
    computation: str,
    *,
    max_rows: int = MAX_ROWS,
    now: int | None = None,
) -> dict[str, Any]:
    """What the interval table ``keyspace.table`` holds about ``computation``, as a JSON-able
    dict, read without writing anything.

    ``computation`` is the computation's plain name, as its topology names it (the store's
    ``computation`` column holds exactly that, not a topology-qualified name: topologies
    are kept apart by their keyspace and table). Injector checkpoints live in the same table
    under ``injector/<injector>/<process>`` and can be looked at the same way.

    ``layout`` is the computation's interval layout as the Cassandra store keeps it (one row
    in the partition of interval -1): its ``version``, its ``intervals`` in hash order, each
    with the ``low`` and exclusive ``high`` key hash it owns, and its ``pending_change`` in
    words (a split or merge journaled and not finished yet), or ``None``. The whole
    ``layout`` is ``None`` if none was ever written: a driver writes the initial one before
    the computation's first batch, so no driver ran it on this table (or the partitions were
    written without one, as injector checkpoints are).

    ``intervals`` has an entry per interval of the layout and per interval partition found in
    the table (retired sources of finished changes, targets of a pending one), in ID order:
    its ``sequencer`` (the static column: the current owner's lease token; ``None`` if never
    acquired or once ``retired``, split or merged away), how many state keys, timers,
    pending production rows (one per commit batch, not per record) and dedup rows (one per
    key and commit within the dedup TTL, each holding the record IDs that commit processed)
    it holds (``None`` where the read of them met more deleted rows than the node's
    ``tombstone_failure_threshold``: keys whose state was deleted in ``gc_grace_seconds``),
    how many operations the store refused to workers holding an old lease of it
    (``fenced``: zombies fenced, from the keyspace's
    :data:`~millstream.engine.stores.cassandra.schema.FENCES_TABLE`; ``None`` where the
    keyspace has no such table, made by an older millstream),
    and the timestamps (µs) of its next event-time and wall-time timers, the first rows of
    the time-ordered timer indexes from the floor the interval's latest commit kept (past
    the fired timers' entries), whose ``key`` is the timestamp plus ``2**63`` as a 20-digit
    decimal. Dedup rows are counted in the buckets of expiry times that end after
    ``now`` (µs; the wall clock by default, the clock the workers' stores run on in a
    deployment), the only ones a read passes over no expired rows to reach, and may include
    a few that expired within the earliest bucket.

    ``history`` is the layout's latest finished splits and merges in words, newest first
    (the layout keeps :data:`~millstream.engine.layout.HISTORY` of them).

    Every read is bounded: each count reads at most ``max_rows + 1`` rows (the result says
    ``max_rows``) and an interval's ``more`` says one of its counts stopped at ``max_rows``
    (a lower bound); the partitions
    are found by one scan of the table's partition keys, filtered by computation and limited
    to ``max_rows`` intervals. Every read is at ``QUORUM``, as the store's own reads and
    ``millstream state``'s are, and never at ``SERIAL``: a SERIAL read is a Paxos round that
    would complete a worker's in-flight proposal and compete with its LWTs for the ballot, so
    an observer stays out of it (and may miss an acquire or a commit still in flight).
    """
    reads = IntervalReads(session, keyspace, table)
    return reads.overview(computation, max_rows=max_rows, now=now)


class IntervalReads:
    """:func:`interval_overview`'s statements on ``keyspace.table``, prepared once, for a
    reader that asks again and again on one session (the live view, every few seconds):
    a statement prepared per overview is a round trip and a parse on the coordinator each
    time. Raises :class:`StoreError` if the table is not there."""

    def __init__(self, session: Any, keyspace: str, table: str) -> None:
        check_identifier("keyspace", keyspace)
        check_identifier("table", table)
        self.keyspace = keyspace
        self.table = table
        self._reads = _Reads(session, f"{keyspace}.{table}")

    def overview(
        self, computation: str, *, max_rows: int = MAX_ROWS, now: int | None = None
    ) -> dict[str, Any]:
        """:func:`interval_overview` of ``computation``."""
        if now is None:
            now = time.time_ns() // 1_000
        if max_rows < 1:
            raise ValueError(f"max_rows must be at least 1, got {max_rows}")
        reads = self._reads
        layout = reads.layout(computation)
        sequencers = reads.partitions(computation, max_rows)
        fenced = reads.fenced(computation, max_rows)
        interval_ids = sorted(set(sequencers) | set(() if layout is None else layout.ids))
        intervals: list[dict[str, Any]] = []
        for start in range(0, len(interval_ids), _INTERVALS_AT_ONCE):
            wave = interval_ids[start : start + _INTERVALS_AT_ONCE]
            intervals += reads.intervals(computation, wave, sequencers, max_rows, now)
        for entry in intervals:
            entry["fenced"] = None if fenced is None else fenced.get(entry["interval"], 0)
        return {
            "computation": computation,
            "keyspace": self.keyspace,
            "table": self.table,
            "max_rows": max_rows,
            "layout": None if layout is None else _layout_document(layout),
            "intervals": intervals,
            "history": _history(layout),
        }


class _Reads:
    """The view's statements on one table, prepared at ``QUORUM``."""

    def __init__(self, session: Any, name: str) -> None:
        self._session = session
        self._name = name
        where = "WHERE computation = ? AND interval = ?"
        self._read_layout = self._prepare(
            f"SELECT value FROM {name} {where} AND kind = 'layout' AND key = '' AND item = 0x"
        )
        # Partition keys and the static column only: no row of any partition is read.
        self._list_partitions = self._prepare(
            f"SELECT DISTINCT computation, interval, sequencer FROM {name} "
            "WHERE computation = ? LIMIT ? ALLOW FILTERING"
        )
        # Counting rows client-side: a COUNT(*)'s LIMIT bounds its one result row, not the
        # rows it reads.
        self._list_kind = self._prepare(f"SELECT kind FROM {name} {where} AND kind = ? LIMIT ?")
        self._list_dedup = self._prepare(
            f"SELECT kind FROM {name} {where} AND kind > ? AND kind < '{DEDUP_BUCKETS_END}' LIMIT ?"
        )
        # A key's timers are one row: its value's head says how many.
        self._list_timers = self._prepare(
            f"SELECT value FROM {name} {where} AND kind = '{TIMERS_KIND}' LIMIT ?"
        )
        # From the floor the interval's latest commit kept: from the start, the read passes
        # over the index entry of every timer fired in gc_grace_seconds (and fails past
        # tombstone_failure_threshold of them).
        self._first_key = self._prepare(first_timer_cql(name))
        self._read_floor = self._prepare(timer_floor_cql(name))
        try:
            self._read_fences: Any = self._prepare(
                f"SELECT interval, refused FROM {name.split('.')[0]}.{FENCES_TABLE} "
                "WHERE store = ? AND computation = ? LIMIT ?"
            )
        except StoreError:  # a keyspace of an older millstream: no fences counted there
            self._read_fences = None

    def fenced(self, computation: str, max_rows: int) -> dict[int, int] | None:
        """Per interval, the operations refused to an old lease's holder (None: not counted
        in this keyspace)."""
        if self._read_fences is None:
            return None
        result = self._session.execute(self._read_fences, (self._name, computation, max_rows))
        return {row["interval"]: row["refused"] for row in result_rows(result)}

    def layout(self, computation: str) -> IntervalLayout | None:
        result = self._session.execute(self._read_layout, (computation, _LAYOUT_INTERVAL))
        row = next(result_rows(result), None)
        return None if row is None else IntervalLayout.decode(row["value"].decode("utf-8"))

    def partitions(self, computation: str, max_rows: int) -> dict[int, int | None]:
        """The computation's interval partitions in the table, with their sequencers."""
        result = self._session.execute(self._list_partitions, (computation, max_rows + 1))
        return {
            row["interval"]: row["sequencer"]
            for row in result_rows(result)
            if row["interval"] != _LAYOUT_INTERVAL
        }

    def intervals(
        self,
        computation: str,
        interval_ids: Sequence[int],
        sequencers: dict[int, int | None],
        max_rows: int,
        now: int,
    ) -> list[dict[str, Any]]:
        """The entries of ``interval_ids``, every read of all of them sent before any is
        awaited."""
        send = self._session.execute_async
        counts = {
            (interval, field): send(self._list_kind, (computation, interval, kind, max_rows + 1))
            for interval in interval_ids
            for field, kind in _COUNTED_KINDS.items()
        }
        live_buckets = dedup_kinds_after(now)
        dedup = {
            interval: send(self._list_dedup, (computation, interval, live_buckets, max_rows + 1))
            for interval in interval_ids
        }
        timers = {
            interval: send(self._list_timers, (computation, interval, max_rows + 1))
            for interval in interval_ids
        }
        floors = {
            interval: send(self._read_floor, (computation, interval)) for interval in interval_ids
        }
        firsts = {}
        for interval in interval_ids:
            row = next(result_rows(floors[interval].result()), None)
            floor = unpack_timer_floor(None if row is None else row["value"])
            for domain, index in TIMER_INDEX.items():
                start = index_floor(floor, domain)
                firsts[interval, domain] = send(
                    self._first_key, (computation, interval, index, start)
                )
        entries: list[dict[str, Any]] = []
        counted = partial(_count, limit=max_rows + 1)
        for interval in interval_ids:
            sequencer = sequencers.get(interval)
            retired = sequencer == RETIRED_SEQUENCER
            entry: dict[str, Any] = {
                "interval": interval,
                # 2**63 - 1 is past what a browser's numbers hold exactly: said as retired.
                "sequencer": None if retired else sequencer,
                "retired": retired,
            }
            more = False
            for field in _COUNTED_KINDS:
                # Counted as they come, never made into dicts: this is most of the rows read.
                found = _readable(counts[interval, field], counted)
                if field == "dedup_rows":
                    found = _sum(found, _readable(dedup[interval], counted))
                elif field == "timers":
                    found = _sum(found, _readable(timers[interval], _timers_held))
                entry[field] = None if found is None else min(found, max_rows)
                more = more or (found or 0) > max_rows
            for field, domain in (
                ("next_event_timer", TimeDomain.EVENT_TIME),
                ("next_wall_timer", TimeDomain.WALL_TIME),
            ):
                row = next(result_rows(firsts[interval, domain].result()), None)
                entry[field] = None if row is None else int(row["key"]) - TIMESTAMP_OFFSET
            entry["more"] = more
            entries.append(entry)
        return entries

    def _prepare(self, cql: str) -> Any:
        try:
            statement = self._session.prepare(cql)
        except InvalidRequest as exc:
            raise StoreError(
                f"cannot read the interval table {self._name} ({exc}): does the keyspace exist, "
                "and has a topology run with this table?"
            ) from exc
        statement.consistency_level = ConsistencyLevel.QUORUM
        return statement


def _readable(future: Any, read: Callable[[Any], int]) -> int | None:
    """``read`` of the rows of ``future``; ``None`` if a replica failed the read for the
    tombstones it met (rows deleted within ``gc_grace_seconds``, more than its
    ``tombstone_failure_threshold``): the view shows that count as unknown, and the rest."""
    try:
        return read(future.result())
    except ReadFailure as exc:
        if not is_too_many_tombstones(exc):
            raise
        return None


def _sum(first: int | None, second: int | None) -> int | None:
    return None if first is None or second is None else first + second


def _timers_held(rows: Iterable[Any]) -> int:
    """The timers the keys' timers rows among ``rows`` hold."""
    return sum(timers_count(row["value"]) for row in result_rows(rows))


def _count(rows: Iterable[Any], limit: int) -> int:
    """How many of ``rows`` there are, reading at most ``limit`` of them."""
    return sum(1 for _ in zip(range(limit), rows, strict=False))


def _layout_document(layout: IntervalLayout) -> dict[str, Any]:
    return {
        "version": layout.version,
        "intervals": [
            {"interval": interval, "low": low, "high": high}
            for interval in layout.ids
            for low, high in [layout.range_of(interval)]
        ],
        "pending_change": None if layout.change is None else _change_words(layout.change),
    }


def _history(layout: IntervalLayout | None) -> list[str]:
    """The layout's finished changes in words, newest first."""
    return [] if layout is None else [_change_words(c) for c in reversed(layout.history)]


def _change_words(change: LayoutChange) -> str:
    """``change`` as a person says it: "split of interval 3 into 5 and 6, begun
    2026-11-27T22:10:03Z, finished 1.2 s later" (times where the layout has them)."""
    sources = _listed([str(source) for source in change.sources])
    targets = _listed([str(target[0]) for target in change.targets])
    noun = "interval" if len(change.sources) == 1 else "intervals"
    words = f"{change.kind} of {noun} {sources} into {targets}"
    if change.begun_at:
        words += f", begun {_utc(change.begun_at)}"
        if change.finished_at:
            words += f", finished {(change.finished_at - change.begun_at) / 1e6:.1f} s later"
    elif change.finished_at:
        words += f", finished {_utc(change.finished_at)}"
    return words


def _utc(micros: int) -> str:
    when = datetime.datetime.fromtimestamp(micros / 1e6, tz=datetime.UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def _listed(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"
