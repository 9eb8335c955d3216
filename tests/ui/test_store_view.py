"""The live view's look at the interval table, on the real Cassandra: data written by the
engine's own store (commits, timers, productions, dedup IDs, a finished and a journaled
split), read back exactly, within bounds, and without writing."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from cassandra import ConsistencyLevel

from millstream.engine.clock import ManualClock
from millstream.engine.config import MillstreamConfig
from millstream.engine.errors import FencedError, StoreError
from millstream.engine.layout import IntervalLayout
from millstream.engine.productions import Production
from millstream.engine.rebalance import finish_change
from millstream.engine.records import Record
from millstream.engine.sequencer import Lease
from millstream.engine.state import KeyChanges
from millstream.engine.store import TimerFloor
from millstream.engine.stores.cassandra import CassandraIntervalStore, create_schema
from millstream.engine.stores.cassandra.schema import FENCES_TABLE
from millstream.engine.timers import TimeDomain, Timer
from millstream.ui.server import StoreReader
from millstream.ui.store_view import IntervalReads, interval_overview
from tests.tombstones import delete_index_entries, delete_states

pytestmark = pytest.mark.integration

TABLE = "view_intervals"
TTL = 60 * 1_000_000
BEGUN = 1_795_000_000_000_000  # 2026-11-18T11:06:40Z, in µs
EMPTY = {
    "sequencer": None,
    "retired": False,
    "state_keys": 0,
    "timers": 0,
    "pending_productions": 0,
    "dedup_rows": 0,
    "next_event_timer": None,
    "next_wall_timer": None,
    "more": False,
    "fenced": 0,
}


class RecordingSession:
    """A real session that notes the CQL and consistency level of every statement it runs."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.executed: list[tuple[str, int]] = []
        self.prepared: list[str] = []

    def prepare(self, cql: str) -> Any:
        self.prepared.append(cql)
        return self.session.prepare(cql)

    def execute(self, statement: Any, parameters: Any = None, **options: Any) -> Any:
        self._note(statement)
        return self.session.execute(statement, parameters, **options)

    def execute_async(self, statement: Any, parameters: Any = None, **options: Any) -> Any:
        self._note(statement)
        return self.session.execute_async(statement, parameters, **options)

    def _note(self, statement: Any) -> None:
        self.executed.append((statement.query_string, statement.consistency_level))


@pytest.fixture
def keyspace(cassandra: Any, cassandra_keyspace: Callable[[], str]) -> str:
    name = cassandra_keyspace()
    create_schema(cassandra, name, TABLE)
    return name


@pytest.fixture
def store(cassandra: Any, keyspace: str) -> CassandraIntervalStore:
    return CassandraIntervalStore(cassandra, keyspace, ManualClock(1_000_000), table=TABLE)


def keys_in(layout: IntervalLayout, interval: int, count: int) -> list[str]:
    """``count`` keys whose hash ``interval`` owns in ``layout``."""
    candidates = (f"key-{n}" for n in itertools.count())
    return list(itertools.islice((k for k in candidates if layout.owns(interval, k)), count))


def production(key: str, timestamp: int) -> Production:
    return Production("out", Record(key, b"v", timestamp, uuid.uuid4().bytes))


def rid(n: int) -> bytes:
    """A record ID (16 bytes)."""
    return n.to_bytes(16, "big")


def commit(store: CassandraIntervalStore, lease: Lease, *changes: KeyChanges) -> None:
    store.commit(lease, list(changes), dedup_ttl=TTL)


def test_counts_timers_sequencers_and_a_journaled_split_are_read_exactly(
    cassandra: Any, keyspace: str, store: CassandraIntervalStore
) -> None:
    computation = "counts"
    # Two intervals; interval 0 split into 2 and 3 (finished: 0 is retired), then a split of
    # interval 1 into 4 and 5 journaled and left pending.
    initial = store.layout(computation, 2)
    split = initial.begin_split(0, at=BEGUN)
    assert store.write_layout(computation, split, initial)
    finished = finish_change(store, computation, split, dedup_ttl=TTL, now=BEGUN + 1_500_000)
    a, b, c = keys_in(finished, 2, 3)
    lease = store.acquire(computation, 2)  # the split's copy acquired it once already
    window_b = Timer(b, "window", 2_000_000, set_by=b"r2")
    commit(
        store,
        lease,
        KeyChanges(
            a,
            state=b"1",
            timers={
                "window": Timer(a, "window", 5_000_000, set_by=b"r1"),
                "flush": Timer(a, "flush", 9_000_000, TimeDomain.WALL_TIME, b"r1"),
            },
            dedup_ids=[rid(1), rid(3)],
            productions=[production(a, 5), production(a, 6)],
        ),
        KeyChanges(b, state=b"2", timers={"window": window_b}, dedup_ids=[rid(2)]),
    )
    # A second commit: another production row, and b's earlier timer deleted (and unindexed).
    commit(
        store,
        lease,
        KeyChanges(b, timers={"window": None}, previous_timers=[window_b]),
        KeyChanges(c, state=b"3", productions=[production(c, 7)]),
    )
    (d,) = keys_in(finished, 1, 1)
    zombie = store.acquire(computation, 1)
    other = store.acquire(computation, 1)
    commit(
        store,
        other,
        KeyChanges(d, state=b"4", timers={"t": Timer(d, "t", 3_000_000, TimeDomain.WALL_TIME)}),
    )
    with pytest.raises(FencedError):  # counted for the view
        commit(store, zombie, KeyChanges(d, state=b"zombie"))
    assert store.write_layout(computation, finished.begin_split(1, at=BEGUN + 60_000_000), finished)

    recording = RecordingSession(cassandra)
    overview = interval_overview(recording, keyspace, TABLE, computation, now=store.clock.now())

    assert overview == {
        "computation": computation,
        "keyspace": keyspace,
        "table": TABLE,
        "max_rows": 1_000,
        "layout": {
            "version": 4,
            "intervals": [
                {"interval": 2, "low": 0, "high": 2**30},
                {"interval": 3, "low": 2**30, "high": 2**31},
                {"interval": 1, "low": 2**31, "high": 2**32},
            ],
            "pending_change": "split of interval 1 into 4 and 5, begun 2026-11-18T11:07:40Z",
        },
        "intervals": [
            {**EMPTY, "interval": 0, "retired": True},  # its sequencer is past all others
            {
                **EMPTY,
                "interval": 1,
                "sequencer": 2,
                "state_keys": 1,
                "timers": 1,
                "next_wall_timer": 3_000_000,
                "fenced": 1,
            },
            {
                **EMPTY,
                "interval": 2,
                "sequencer": 2,
                "state_keys": 3,
                "timers": 2,
                "pending_productions": 2,  # rows, one per commit: three records in all
                "dedup_rows": 2,  # one per key and commit: three IDs in all
                "next_event_timer": 5_000_000,
                "next_wall_timer": 9_000_000,
            },
            {**EMPTY, "interval": 3, "sequencer": 1},
        ],
        "history": [
            "split of interval 0 into 2 and 3, begun 2026-11-18T11:06:40Z, finished 1.5 s later"
        ],
    }
    # Read-only and bounded: only SELECTs at QUORUM (no Paxos round), each with a LIMIT or
    # naming one row by its whole primary key (the layout).
    assert recording.executed
    for cql, consistency in recording.executed:
        assert cql.startswith("SELECT "), cql
        assert consistency == ConsistencyLevel.QUORUM, cql
        assert " LIMIT " in cql or "AND item = 0x" in cql, cql
    assert store.holds(other)  # nothing was acquired


def test_counts_stop_at_max_rows_and_say_there_is_more(
    keyspace: str, store: CassandraIntervalStore, cassandra: Any
) -> None:
    layout = store.layout("big", 1)
    keys = keys_in(layout, 0, 5)
    lease = store.acquire("big", 0)
    commit(
        store,
        lease,
        *(KeyChanges(key, state=b"x", dedup_ids=[rid(n)]) for n, key in enumerate(keys)),
    )

    now = store.clock.now()
    capped = interval_overview(cassandra, keyspace, TABLE, "big", max_rows=3, now=now)["intervals"]
    exact = interval_overview(cassandra, keyspace, TABLE, "big", max_rows=5, now=now)["intervals"]

    expected = {**EMPTY, "interval": 0, "sequencer": 1}
    assert capped == [{**expected, "state_keys": 3, "dedup_rows": 3, "more": True}]
    assert exact == [{**expected, "state_keys": 5, "dedup_rows": 5, "more": False}]


def test_a_computation_with_nothing_stored_has_no_layout_and_no_intervals(
    keyspace: str, store: CassandraIntervalStore, cassandra: Any
) -> None:
    store.layout("other", 2)
    store.acquire("other", 0)

    overview = interval_overview(cassandra, keyspace, TABLE, "nobody")

    assert overview == {
        "computation": "nobody",
        "keyspace": keyspace,
        "table": TABLE,
        "max_rows": 1_000,
        "layout": None,
        "intervals": [],
        "history": [],
    }


def test_without_a_layout_the_intervals_are_the_partitions_found(
    keyspace: str, store: CassandraIntervalStore, cassandra: Any
) -> None:
    store.acquire("no-layout", 0)
    store.acquire("no-layout", 2)
    store.acquire("no-layout", 2)

    overview = interval_overview(cassandra, keyspace, TABLE, "no-layout")

    assert overview["layout"] is None
    assert overview["intervals"] == [
        {**EMPTY, "interval": 0, "sequencer": 1},
        {**EMPTY, "interval": 2, "sequencer": 2},
    ]


def test_names_are_checked_and_a_missing_table_is_reported(keyspace: str, cassandra: Any) -> None:
    with pytest.raises(ValueError, match="not a valid table name"):
        interval_overview(cassandra, keyspace, "intervals; DROP TABLE x", "c")
    with pytest.raises(ValueError, match="max_rows"):
        interval_overview(cassandra, keyspace, TABLE, "c", max_rows=0)
    with pytest.raises(StoreError, match=f"{keyspace}.absent"):
        interval_overview(cassandra, keyspace, "absent", "c")


def test_a_keyspace_of_an_older_millstream_has_no_fence_counts(
    keyspace: str, store: CassandraIntervalStore, cassandra: Any
) -> None:
    store.layout("old", 1)
    cassandra.execute(f"DROP TABLE {keyspace}.{FENCES_TABLE}")
    (entry,) = interval_overview(cassandra, keyspace, TABLE, "old")["intervals"]
    assert (entry["interval"], entry["fenced"]) == (0, None)


def test_reads_asked_again_prepare_nothing_again(
    keyspace: str, store: CassandraIntervalStore, cassandra: Any
) -> None:
    store.layout("twice", 1)
    recording = RecordingSession(cassandra)
    reads = IntervalReads(recording, keyspace, TABLE)
    prepared = list(recording.prepared)
    assert prepared  # the statements, once
    first = reads.overview("twice")
    store.acquire("twice", 0)
    second = reads.overview("twice")
    assert recording.prepared == prepared
    assert [first["intervals"][0]["sequencer"], second["intervals"][0]["sequencer"]] == [None, 1]


def test_pages_asking_within_the_fresh_time_share_one_read(
    services: MillstreamConfig, keyspace: str, store: CassandraIntervalStore
) -> None:
    store.layout("shared", 1)
    clock = ManualClock(5_000_000)
    reader = StoreReader(services, keyspace, TABLE, clock, fresh=5.0)
    try:
        first = reader.intervals("shared", lambda: False)
        assert (first["read_at"], first["intervals"][0]["sequencer"]) == (5_000_000, None)
        store.acquire("shared", 0)
        clock.advance(4_999_999)
        assert reader.intervals("shared", lambda: False) is first  # another page: no read
        clock.advance(1)
        again = reader.intervals("shared", lambda: False)
        assert (again["read_at"], again["intervals"][0]["sequencer"]) == (10_000_000, 1)
    finally:
        reader.close()


def test_timers_are_read_from_the_kept_floor_and_a_count_past_too_many_tombstones_is_unknown(
    keyspace: str, store: CassandraIntervalStore, cassandra: Any
) -> None:
    lease = store.acquire("fired", 0)
    # The index entries of timers fired before, more than a read may pass over.
    delete_index_entries(cassandra, f"{keyspace}.{TABLE}", "fired")
    live = Timer("k", "t", 500_000)
    store.commit(
        lease,
        [KeyChanges("k", timers={"t": live})],
        dedup_ttl=TTL,
        timer_floor=TimerFloor(400_000, None),
    )
    # And keys whose state was deleted, as many: that count is unknown, the rest are read.
    delete_states(cassandra, f"{keyspace}.{TABLE}", "fired")
    (entry,) = interval_overview(cassandra, keyspace, TABLE, "fired", now=1)["intervals"]
    assert entry == {
        **EMPTY,
        "interval": 0,
        "sequencer": 1,
        "state_keys": None,
        "timers": 1,
        "next_event_timer": 500_000,
    }
