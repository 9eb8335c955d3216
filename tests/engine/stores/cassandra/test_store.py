"""The Cassandra interval store on the real Cassandra: what the shared contract cannot show.

Fencing and atomicity of real conditional batches, batch splitting and sizes, real TTLs,
linearizable acquires under contention, and unknown outcomes. Faults are injected by
:class:`ScriptedSession`, a real session whose requests a test can intercept (run them and
then fail, fail without running, or run something in between); one unknown outcome is real,
a client timeout shorter than the LWT.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest
from cassandra import OperationTimedOut, ReadFailure, Unavailable, WriteTimeout, WriteType
from cassandra.protocol import ErrorMessage
from cassandra.query import BatchStatement, dict_factory

from millstream.connectors import cassandra as cassandra_connector
from millstream.engine.clock import ManualClock, SystemClock
from millstream.engine.computation import Computation
from millstream.engine.config import MillstreamConfig
from millstream.engine.context import Context
from millstream.engine.errors import FencedError, StoreError, UnknownOutcomeError
from millstream.engine.productions import CommitTag, Production
from millstream.engine.protocol import Delivery, IntervalWorker
from millstream.engine.records import Record, injector_record_id
from millstream.engine.sequencer import Lease
from millstream.engine.state import KeyChanges
from millstream.engine.store import NO_FLOOR, KeySnapshot, NextTimers, TimerFloor, split_batches
from millstream.engine.stores.cassandra import (
    DEFAULT_MAX_BATCH_BYTES,
    CassandraIntervalStore,
    create_schema,
)
from millstream.engine.stores.cassandra.rows import (
    Bound,
    change_rows,
    dedup_item,
    dedup_item_floor,
    dedup_kind,
    index_row,
    pack_productions,
)
from millstream.engine.stores.cassandra.schema import (
    DEDUP_BUCKET_PREFIX,
    DEDUP_BUCKETS_END,
    schema_cql,
)
from millstream.engine.testing import TestingSink
from millstream.engine.timers import TimeDomain, Timer
from millstream.engine.topology import ComputationOptions, ComputationSpec, InputStream
from tests.store_tables import StoreTable
from tests.tombstones import delete_index_entries, delete_states
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

TTL = 60 * 1_000_000
# Cassandra 5.0's default batch_size_fail_threshold.
FAIL_THRESHOLD = 50 * 1024

Run = Callable[[], Any]
Interceptor = Callable[[Run], Any]


class ScriptedSession:
    """A real driver session whose requests can be intercepted, one interceptor per request.

    Requests are classified as ``"batch"`` (commits and deletes), ``"acquire"`` (the
    sequencer LWTs, alone or, in a store's first acquire of an interval, as the first
    statement of a batch), ``"resolve"`` (the LWT of ``was_applied``) or ``"read"``; an interceptor
    queued for a class receives the request as a thunk and decides what happens. Everything
    else is passed through. With ``batch_session``, batches travel on another connection.
    """

    def __init__(self, session: Any, batch_session: Any = None) -> None:
        self.session = session
        self.batch_session = batch_session or session
        self.prepared: list[str] = []
        self._queries: dict[bytes, str] = {}  # the prepared statements' CQL, by query ID
        self.batches: list[Any] = []
        self._interceptors: dict[str, deque[Interceptor]] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.session, name)

    def intercept(self, kind: str, interceptor: Interceptor) -> None:
        self._interceptors.setdefault(kind, deque()).append(interceptor)

    def prepare(self, cql: str) -> Any:
        self.prepared.append(cql)
        prepared = self.session.prepare(cql)
        self._queries[prepared.query_id] = cql
        return prepared

    def execute(self, statement: Any, parameters: Any = None, **options: Any) -> Any:
        kind = self.kind(statement)
        if kind == "batch":
            self.batches.append(statement)

        def run() -> Any:
            session = self.batch_session if kind == "batch" else self.session
            return session.execute(statement, parameters, **options)

        queued = self._interceptors.get(kind)
        return queued.popleft()(run) if queued else run()

    def execute_async(self, statement: Any, parameters: Any = None, **options: Any) -> Any:
        return self.session.execute_async(statement, parameters, **options)

    def kind(self, statement: Any) -> str:
        if isinstance(statement, BatchStatement):
            # (is prepared, query ID or CQL, values) per statement: the driver's own list.
            _, first, _ = statement._statements_and_parameters[0]
            return "acquire" if _acquires(self._queries.get(first, "")) else "batch"
        cql = getattr(statement, "prepared_statement", statement).query_string
        if _acquires(cql):
            return "acquire"
        return "resolve" if cql.startswith("UPDATE") else "read"


def _acquires(cql: str) -> bool:
    return "SET sequencer" in cql or cql.startswith("INSERT")


def timeout_after_running(run: Run) -> Any:
    run()
    raise WriteTimeout("injected: applied, then timed out", write_type=WriteType.CAS)


def timeout_without_running(run: Run) -> Any:
    raise WriteTimeout("injected: timed out before applying", write_type=WriteType.CAS)


def cas_write_unknown_after_running(run: Run) -> Any:
    run()
    raise ErrorMessage(0x1700, "CAS operation result is unknown - proposal accepted by 1", {})


def unavailable(run: Run) -> Any:
    raise Unavailable("injected: not enough replicas", required_replicas=1, alive_replicas=0)


def then(action: Callable[[], object]) -> Interceptor:
    def interceptor(run: Run) -> Any:
        result = run()
        action()
        return result

    return interceptor


def payload_bytes(batch: Any) -> int:
    """Bytes of bound values a batch carried (test-only peek at the driver's batch)."""
    return sum(
        len(value)
        for _, _, values in batch._statements_and_parameters
        for value in values
        if value is not None
    )


def rid(n: int) -> bytes:
    return injector_record_id("t", 0, n)


def production(n: int, key: str = "k", size: int = 1) -> Production:
    return Production("out", Record(key, b"v" * size, n, rid(n)))


def full_change(n: int, state_size: int = 10, value_size: int = 10) -> KeyChanges:
    """A key's realistic changes: new state, one dedup ID and one pending production."""
    key = f"key-{n:05d}"
    return KeyChanges(
        key,
        state=bytes([n % 251]) * state_size,
        productions=[production(n, key, value_size)],
        dedup_ids=[rid(n)],
    )


StoreFactory = Callable[..., CassandraIntervalStore]


@pytest.fixture
def table(store_table: StoreTable) -> StoreTable:
    """The test's interval table (a table of its own, in the module's keyspace)."""
    return store_table


@pytest.fixture
def scripted(cassandra: Any) -> ScriptedSession:
    return ScriptedSession(cassandra)


@pytest.fixture
def make_store(scripted: ScriptedSession, table: StoreTable) -> StoreFactory:
    """Factory of stores on the test's table: all share the scripted session by default."""

    def make(session: Any = None, clock: Any = None, **options: Any) -> CassandraIntervalStore:
        return CassandraIntervalStore(
            scripted if session is None else session,
            table.keyspace,
            clock if clock is not None else ManualClock(1_000_000),
            table=table.name,
            **options,
        )

    return make


def rows_of(session: Any, table: StoreTable, kind: str) -> list[Any]:
    """Every row of one kind in the table, read plainly (for checks only)."""
    return list(session.execute(f"SELECT * FROM {table} WHERE kind = %s ALLOW FILTERING", (kind,)))


def dedup_rows(session: Any, table: StoreTable) -> list[Any]:
    """Every dedup row of the table (those of earlier versions' kind aside), read plainly."""
    return list(
        session.execute(
            f"SELECT * FROM {table} WHERE kind > %s AND kind < %s ALLOW FILTERING",
            (DEDUP_BUCKET_PREFIX, DEDUP_BUCKETS_END),
        )
    )


# -- schema and construction ------------------------------------------------------------------


def test_create_schema_is_idempotent_and_requires_the_keyspace(
    cassandra: Any, table: StoreTable
) -> None:
    create_schema(cassandra, table.keyspace, table.name)
    with pytest.raises(StoreError, match="does not exist; create it first"):
        create_schema(cassandra, "no_such_keyspace_here")
    with pytest.raises(ValueError, match="not a valid table name"):
        create_schema(cassandra, table.keyspace, "drop table x")


def test_a_missing_table_is_reported_with_the_fix(cassandra: Any, table: StoreTable) -> None:
    with pytest.raises(StoreError, match=r"create_schema\(session, keyspace, table\)"):
        CassandraIntervalStore(cassandra, table.keyspace, SystemClock(), table="absent")


def test_a_table_whose_columns_bound_rows_would_misencode_is_refused(
    cassandra: Any, table: StoreTable
) -> None:
    # Every column the store reads and writes, but ``expires`` an int: a bound dedup row's
    # 8-byte expiry would not fit it.
    misshapen = f"{table.name}_m"
    statement = schema_cql(table.keyspace, misshapen)
    cassandra.execute(statement.replace("expires bigint", "expires int"))
    with pytest.raises(StoreError, match=r"binds .*Int32Type.*not .*LongType"):
        CassandraIntervalStore(cassandra, table.keyspace, SystemClock(), table=misshapen)


def test_bound_rows_carry_what_the_driver_would_bind(cassandra: Any, table: StoreTable) -> None:
    store = CassandraIntervalStore(cassandra, table.keyspace, SystemClock(), table=table.name)
    statements = store._statements
    lease = Lease("c\u00e9", 2**31 - 1, 7, cache_valid=False)
    change = KeyChanges("k\u00ff", state=b"\x00state", dedup_ids=[rid(1), rid(2), rid(1)])
    kind, item = dedup_kind(2**62 + 5, TTL), dedup_item(2**62 + 5, b"\x07" * 16)
    made = change_rows(statements, lease, change, (kind.encode(), item), 2**62 + 5, 3_601)
    rows = [row for row in made if isinstance(row, Bound)]
    # Every row bound; the key's IDs in one row, the repeated ID written once.
    assert len(rows) == len(made) == 2
    assert [row.statement for row in rows] == [statements.put_state, statements.put_dedup]
    partition = (lease.computation, lease.interval)
    packed = rid(1) + rid(2)
    expected = [
        statements.put_state.bind((*partition, change.key, change.state)).values,
        statements.put_dedup.bind(
            (*partition, kind, change.key, item, 2**62 + 5, packed, 3_601)
        ).values,
    ]
    assert [row.values for row in rows] == expected


def test_a_batchs_reads_are_all_sent_before_any_is_awaited(
    make_store: StoreFactory, scripted: ScriptedSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = make_store()
    lease = store.acquire("c", 0)
    store.commit(lease, [full_change(n) for n in range(3)], dedup_ttl=60_000_000)
    events: list[str] = []
    send = scripted.session.execute_async

    def recorded(statement: Any, parameters: Any = None, **options: Any) -> Any:
        events.append("send")
        future = send(statement, parameters, **options)
        result = future.result

        def awaited(*args: Any, **kwargs: Any) -> Any:
            events.append("await")
            return result(*args, **kwargs)

        future.result = awaited
        return future

    monkeypatch.setattr(scripted, "execute_async", recorded)
    keys = [f"key-{n:05d}" for n in range(3)]
    read, seen = store.read_batch(lease, keys, {keys[1]: [rid(1), rid(7)]})

    assert events == ["send", "send", "await", "await"]  # one round trip, not two
    assert read[keys[2]].state == bytes([2]) * 10
    assert seen == {(keys[1], rid(1))}


def test_options_are_validated(cassandra: Any, table: StoreTable) -> None:
    with pytest.raises(ValueError, match="max_batch_bytes"):
        CassandraIntervalStore(
            cassandra, table.keyspace, SystemClock(), table=table.name, max_batch_bytes=0
        )
    with pytest.raises(ValueError, match="request_timeout"):
        CassandraIntervalStore(
            cassandra, table.keyspace, SystemClock(), table=table.name, request_timeout=0
        )
    with pytest.raises(ValueError, match="acquire_attempts"):
        CassandraIntervalStore(
            cassandra, table.keyspace, SystemClock(), table=table.name, acquire_attempts=0
        )
    with pytest.raises(ValueError, match="not a valid keyspace name"):
        CassandraIntervalStore(cassandra, "Bad-Name", SystemClock())


def test_statements_are_prepared_once(make_store: StoreFactory, scripted: ScriptedSession) -> None:
    store = make_store()
    prepared = len(scripted.prepared)
    for _ in range(3):
        lease = store.acquire("c", 0)
        store.commit(lease, [full_change(1)], dedup_ttl=TTL)
        store.has_seen(lease, "k", [rid(1)])
        store.read_state(lease, "k")
        store.scan(lease)
        store.delete_productions(lease, [rid(1)])
        store.was_applied(lease, b"m")
    assert len(scripted.prepared) == prepared == len(set(scripted.prepared))


# -- fencing and atomicity --------------------------------------------------------------------


def test_a_fenced_batch_applies_nothing(
    make_store: StoreFactory, cassandra: Any, table: StoreTable
) -> None:
    store = make_store()
    zombie = store.acquire("c", 0)
    store.commit(zombie, [KeyChanges("before", b"kept")], dedup_ttl=TTL)
    store.acquire("c", 0)
    changes = [
        KeyChanges(
            f"k{n}",
            b"zombie",
            {"t": Timer(f"k{n}", "t", n)},
            [production(n, f"k{n}")],
            [rid(100 + n)],
        )
        for n in range(20)
    ]
    with pytest.raises(FencedError, match=r"sequencer 2, this lease 1"):
        store.commit(zombie, changes, dedup_ttl=TTL)
    assert [row.key for row in rows_of(cassandra, table, "state")] == ["before"]
    for kind in ("timers", "timer", "production"):
        assert rows_of(cassandra, table, kind) == []
    assert dedup_rows(cassandra, table) == []


def test_a_zombie_worker_is_fenced(make_store: StoreFactory) -> None:
    worker_a, worker_b = make_store(), make_store()
    lease_a = worker_a.acquire("c", 0)
    worker_a.commit(lease_a, [KeyChanges("k", b"a", productions=[production(1)])], dedup_ttl=TTL)
    lease_b = worker_b.acquire("c", 0)
    assert not lease_b.cache_valid

    with pytest.raises(FencedError, match="acquired by another worker"):
        worker_a.commit(lease_a, [KeyChanges("k", b"zombie", dedup_ids=[rid(2)])], dedup_ttl=TTL)
    with pytest.raises(FencedError):
        worker_a.delete_productions(lease_a, [rid(1)])
    with pytest.raises(FencedError):
        worker_a.was_applied(lease_a, b"m")
    # Each refusal is counted for the people looking at the interval (millstream ui).
    assert worker_b.fenced("c") == {0: 3}
    assert worker_b.fenced("other") == {}
    assert worker_b.read_state(lease_b, "k") == b"a"
    assert worker_b.has_seen(lease_b, "k", [rid(2)]) == set()
    # The new owner reads back, resends and deletes what the zombie left pending.
    assert worker_b.pending_productions(lease_b) == (production(1),)
    worker_b.delete_productions(lease_b, [rid(1)])
    worker_b.commit(lease_b, [KeyChanges("k", b"b")], dedup_ttl=TTL)
    assert worker_b.read_state(lease_b, "k") == b"b"
    assert worker_b.scan(lease_b).productions == ()


def test_a_lease_the_table_never_issued_is_fenced(make_store: StoreFactory) -> None:
    with pytest.raises(FencedError, match="was never acquired"):
        make_store().commit(Lease("c", 7, 5, False), [KeyChanges("k", b"s")], dedup_ttl=TTL)


def test_a_competitor_between_batches_leaves_a_prefix_of_whole_keys(
    make_store: StoreFactory, scripted: ScriptedSession
) -> None:
    store, competitor = make_store(max_batch_bytes=2_000), make_store()
    lease = store.acquire("c", 0)
    changes = [full_change(n, state_size=300) for n in range(40)]
    predicted = split_batches(changes, 2_000)
    assert len(predicted) > 3
    scripted.intercept("batch", lambda run: run())
    scripted.intercept("batch", then(lambda: competitor.acquire("c", 0)))

    with pytest.raises(FencedError):
        store.commit(lease, changes, dedup_ttl=TTL)
    assert len(scripted.batches) == 3  # the third was sent and refused
    applied = {c.key for batch in predicted[:2] for c in batch}
    snapshot = store.scan(lease)
    assert {p.record.key for p in snapshot.productions} == applied
    assert set(snapshot.dedup_ids) == {c.dedup_ids[0] for c in changes if c.key in applied}
    for c in changes:
        assert store.read_state(lease, c.key) == (c.state if c.key in applied else None)


# -- batch size -------------------------------------------------------------------------------


def test_a_large_commit_is_split_between_keys_and_applies_every_key(
    make_store: StoreFactory, scripted: ScriptedSession
) -> None:
    store = make_store()
    lease = store.acquire("c", 0)
    changes = [full_change(n, state_size=3_000, value_size=200) for n in range(1_000)]
    predicted = split_batches(changes, DEFAULT_MAX_BATCH_BYTES)

    started = time.monotonic()
    store.commit(lease, changes, dedup_ttl=TTL)
    elapsed = time.monotonic() - started

    # Whole keys per batch: each sent batch holds exactly the rows of its predicted keys
    # (state and dedup ID: 2 per key), one row of all its productions, and the guard.
    assert [len(batch) for batch in scripted.batches] == [2 + 2 * len(b) for b in predicted]
    assert store.stats.batches == len(predicted) > 1
    assert store.stats.largest_batch_bytes <= DEFAULT_MAX_BATCH_BYTES
    # Far past the fail threshold, which conditional single-partition batches are exempt
    # from; every key below reads back as applied.
    assert max(payload_bytes(batch) for batch in scripted.batches) > 10 * FAIL_THRESHOLD
    snapshot = store.scan(lease)
    assert len(snapshot.productions) == len(snapshot.dedup_ids) == 1_000
    assert all(store.read_state(lease, c.key) == c.state for c in changes)
    print(f"1000 keys x ~3.2 KB: {len(predicted)} batches in {elapsed:.2f} s")


def test_a_key_over_the_batch_limit_goes_alone_and_is_accepted(
    make_store: StoreFactory, scripted: ScriptedSession
) -> None:
    # Cassandra exempts conditional single-partition batches from batch_size_fail_threshold.
    store = make_store()
    lease = store.acquire("c", 0)
    big = KeyChanges("big", b"x" * (2 * DEFAULT_MAX_BATCH_BYTES), dedup_ids=[rid(1)])
    store.commit(lease, [full_change(1), big, full_change(2)], dedup_ttl=TTL)
    assert [len(batch) for batch in scripted.batches] == [4, 3, 4]
    assert payload_bytes(scripted.batches[1]) > 2 * DEFAULT_MAX_BATCH_BYTES
    assert store.read_state(lease, "big") == big.state


# -- acquiring --------------------------------------------------------------------------------


def test_concurrent_acquires_are_linearizable(make_store: StoreFactory, cassandra: Any) -> None:
    stores = [make_store(session=cassandra) for _ in range(6)]
    tokens: list[int] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def worker(store: CassandraIntervalStore) -> None:
        try:
            lease = None
            for _ in range(5):
                lease = store.acquire("c", 0, previous=lease)
                with lock:
                    tokens.append(lease.token)
        except BaseException as exc:
            errors.append(exc)
            raise

    threads = [threading.Thread(target=worker, args=(store,)) for store in stores]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert sorted(tokens) == list(range(1, 31))
    assert stores[0].sequencer("c", 0) == 30
    print("attempts per acquire:", sum(s.stats.acquire_attempts for s in stores) / 30)


def test_an_uncertain_acquire_is_resolved_and_claims_no_valid_cache(
    make_store: StoreFactory, scripted: ScriptedSession
) -> None:
    store = make_store()
    first = store.acquire("c", 0)
    scripted.intercept("acquire", timeout_after_running)
    second = store.acquire("c", 0, previous=first)
    # Its own advance to 2 applied unseen; it cannot know that, so it moved on to 3.
    assert (second.token, second.cache_valid) == (3, False)
    scripted.intercept("acquire", timeout_without_running)
    third = store.acquire("c", 0, previous=second)
    assert (third.token, third.cache_valid) == (4, False)
    with pytest.raises(FencedError):
        store.commit(second, [KeyChanges("k", b"s")], dedup_ttl=TTL)


def test_acquire_gives_up_with_advice_when_every_attempt_is_uncertain(
    make_store: StoreFactory, scripted: ScriptedSession
) -> None:
    store = make_store(acquire_attempts=3)
    for _ in range(3):
        scripted.intercept("acquire", timeout_without_running)
    with pytest.raises(StoreError, match=r"after 3 attempts .*WriteTimeout.*one worker runs"):
        store.acquire("c", 0)


# -- scans and TTLs ---------------------------------------------------------------------------


def test_scan_returns_timers_pending_productions_and_unexpired_dedup_ids(
    make_store: StoreFactory,
) -> None:
    clock = ManualClock(1_000_000)
    store = make_store(clock=clock)
    lease = store.acquire("c", 0)
    timers = {
        "a": Timer("a", "window", 10),
        "b": Timer("b", "flush", 20, TimeDomain.WALL_TIME, set_by=rid(3)),
        "c": Timer("c", "gone", 30),
    }
    store.commit(
        lease,
        [
            KeyChanges(k, timers={t.tag: t}, productions=[production(n, k)], dedup_ids=[rid(n)])
            for n, (k, t) in enumerate(timers.items())
        ],
        dedup_ttl=TTL,
    )
    clock.advance(TTL // 2)
    store.commit(
        lease,
        [KeyChanges("c", timers={"gone": None}), KeyChanges("d", dedup_ids=[rid(9)])],
        dedup_ttl=TTL,
    )
    store.commit(lease, [KeyChanges("e", productions=[production(5, "e")])], dedup_ttl=TTL)
    store.delete_productions(lease, [rid(0), rid(1), rid(2)])
    clock.advance(TTL // 2)  # the first three IDs are now exactly TTL old: expired

    snapshot = store.scan(lease)
    assert set(snapshot.timers) == {timers["a"], timers["b"]}
    assert snapshot.productions == (production(5, "e"),)
    assert snapshot.dedup_ids == (rid(9),)


def test_productions_share_a_row_per_commit_batch_deleted_once_all_are_acknowledged(
    make_store: StoreFactory, cassandra: Any, table: StoreTable
) -> None:
    store = make_store()
    lease = store.acquire("c", 0)
    store.commit(
        lease,
        [KeyChanges(k, productions=[production(n, k)]) for n, k in enumerate("abc")],
        dedup_ttl=TTL,
    )
    assert len(rows_of(cassandra, table, "production")) == 1
    store.delete_productions(lease, [rid(0), rid(2)])
    # The row stays while one of its productions is unacknowledged; a new owner resends all.
    successor = make_store()
    new_lease = successor.acquire("c", 0)
    assert set(successor.pending_productions(new_lease)) == {
        production(n, k) for n, k in enumerate("abc")
    }
    successor.delete_productions(new_lease, [rid(0), rid(1), rid(2)])
    assert rows_of(cassandra, table, "production") == []
    assert successor.pending_productions(new_lease) == ()


def test_delivered_rows_go_in_the_commits_own_batch_unless_it_is_split(
    make_store: StoreFactory, cassandra: Any, table: StoreTable
) -> None:
    store = make_store(max_batch_bytes=FAIL_THRESHOLD)
    lease = store.acquire("c", 0)
    store.commit(lease, [KeyChanges("a", productions=[production(0, "a")])], dedup_ttl=TTL)
    before = store.stats.batches
    store.commit(lease, [full_change(1)], dedup_ttl=TTL, delivered=[rid(0)])
    assert store.stats.batches == before + 1  # one conditional write: the commit's
    assert [r.key for r in rows_of(cassandra, table, "production")] == [""]  # key 1's
    # A commit split in several batches deletes in a write of its own, first.
    large = [full_change(n, state_size=1_000) for n in range(2, 2 + 3 * FAIL_THRESHOLD // 1_000)]
    before = store.stats.batches
    store.commit(lease, large, dedup_ttl=TTL, delivered=[rid(1)])
    assert store.stats.batches - before == 1 + len(split_batches(large, FAIL_THRESHOLD))
    pending = store.pending_productions(store.acquire("c", 0))
    assert {p.record_id for p in pending} == {rid(n) for n in range(2, 2 + len(large))}


def test_timers_are_indexed_by_time_and_the_index_follows_replacements(
    make_store: StoreFactory, cassandra: Any, table: StoreTable
) -> None:
    store = make_store()
    lease = store.acquire("c", 0)
    early, wall = Timer("a", "t", 10), Timer("b", "w", 15, TimeDomain.WALL_TIME, rid(1))
    store.commit(
        lease,
        [KeyChanges("a", timers={"t": early}), KeyChanges("b", timers={"w": wall})],
        dedup_ttl=TTL,
    )
    assert store.due_timers(lease, 11, 15) == [early, wall]
    assert store.next_timers(lease) == NextTimers(10, 15)

    later = Timer("a", "t", 40)
    store.commit(
        lease, [KeyChanges("a", timers={"t": later}, previous_timers=[early])], dedup_ttl=TTL
    )
    assert store.due_timers(lease, 39, 0) == []
    assert store.due_timers(lease, 41, 0) == [later]
    assert len(rows_of(cassandra, table, "timer_event")) == 1
    # Replaced at the same time: the index row stays (a delete would win over the put).
    store.commit(
        lease, [KeyChanges("a", timers={"t": later}, previous_timers=[later])], dedup_ttl=TTL
    )
    assert store.due_timers(lease, 41, 0) == [later]
    # A commit that does not name the timer it replaces leaves a stale entry behind, which
    # the reader recognises against the key's timers and deletes later.
    store.commit(lease, [KeyChanges("a", timers={"t": None})], dedup_ttl=TTL)
    assert store.due_timers(lease, 41, 0) == [later]
    assert store.read_keys(lease, ["a"])["a"].timers == {}
    store.commit(lease, [KeyChanges("a", previous_timers=[later])], dedup_ttl=TTL)
    assert store.due_timers(lease, 41, 0) == []
    assert store.next_timers(lease) == NextTimers(None, 15)


# A replica's trace event of a read (Cassandra's ReadCommand).
_TOMBSTONES_READ = re.compile(r"Read \d+ live rows and (\d+) tombstone cells")


class Traced:
    """A driver session whose requests (the store's reads, LWTs and batches) are traced, and
    their futures kept."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.futures: list[Any] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.session, name)

    def execute(self, statement: Any, parameters: Any = None, **options: Any) -> Any:
        return self.execute_async(statement, parameters, **options).result()

    def execute_async(self, statement: Any, parameters: Any = None, **options: Any) -> Any:
        future = self.session.execute_async(statement, parameters, trace=True, **options)
        self.futures.append(future)
        return future

    def tombstones(self) -> int:
        """Tombstone cells the kept requests read (from their traces), and forget them."""
        read = 0
        for future in self.futures:
            for event in future.get_query_trace(max_wait=20).events:
                found = _TOMBSTONES_READ.search(event.description)
                read += int(found.group(1)) if found else 0
        self.futures.clear()
        return read


def test_timer_reads_from_the_floor_step_over_the_fired_timers_tombstones(
    make_store: StoreFactory, cassandra: Any
) -> None:
    traced = Traced(cassandra)
    store = make_store(session=traced)
    lease = store.acquire("c", 0)
    fired = [Timer(f"k{n}", "t", n) for n in range(1, 201)]
    store.commit(lease, [KeyChanges(t.key, timers={"t": t}) for t in fired], dedup_ttl=TTL)
    store.commit(
        lease,
        [KeyChanges(t.key, timers={"t": None}, previous_timers=[t]) for t in fired],
        dedup_ttl=TTL,
    )
    live = Timer("k", "t", 1_000)
    store.commit(lease, [KeyChanges("k", timers={"t": live})], dedup_ttl=TTL)
    traced.futures.clear()

    # Read from the start, the index goes through the 200 deleted entries, each time.
    assert store.next_timers(lease) == NextTimers(1_000, None)
    assert store.due_timers(lease, 2_000, 0) == [live]
    assert traced.tombstones() >= 2 * len(fired)
    # From the floor an owner knows (its first live entry), through none of them.
    floor = TimerFloor.at(NextTimers(1_000, None))
    assert store.next_timers(lease, floor) == NextTimers(1_000, None)
    assert store.due_timers(lease, 2_000, 0, floor) == [live]
    assert traced.tombstones() == 0


def _fire_fresh_tags(store: CassandraIntervalStore, lease: Lease, keys: list[str], n: int) -> None:
    """As a window's timers tagged by their window: each commit sets a timer of a new tag on
    every key and fires (deletes) the one before, as the engine commits (with the whole set)."""
    for number in range(n):
        changes = []
        for key in keys:
            timer = Timer(key, f"w{number}", number)
            change = KeyChanges(key, timers={timer.tag: timer}, timers_after={timer.tag: timer})
            if number:
                fired = Timer(key, f"w{number - 1}", number - 1)
                change.timers[fired.tag] = None
                change.previous_timers.append(fired)
            changes.append(change)
        store.commit(lease, changes, dedup_ttl=TTL)


def test_a_keys_timers_are_one_row_so_its_reads_pass_over_no_fired_timer(
    make_store: StoreFactory, cassandra: Any, table: StoreTable
) -> None:
    keys = [f"k{n}" for n in range(5)]
    store = make_store()
    lease = store.acquire("c", 0)
    _fire_fresh_tags(store, lease, keys, 100)
    # One row a key, overwritten by each commit: not 100 rows a key, 99 of them deleted.
    assert sorted(row.key for row in rows_of(cassandra, table, "timers")) == keys
    assert rows_of(cassandra, table, "timer") == []

    traced = Traced(cassandra)
    other = make_store(session=traced)
    taken = other.acquire("c", 0)
    traced.futures.clear()
    read = other.read_keys(taken, keys)
    assert {key: list(snapshot.timers) for key, snapshot in read.items()} == {
        key: ["w99"] for key in keys
    }
    assert other.state_keys(taken, 100) == set(keys)
    assert traced.tombstones() == 0
    # Rows of a timer each (earlier versions), fired as often: every read of the keys
    # passes over each one's tombstone, as the reads above did before.
    delete = cassandra.prepare(
        f"DELETE FROM {table} WHERE computation = 'c' AND interval = 1 "
        "AND kind = 'timer' AND key = ? AND item = ?"
    )
    for key in keys:
        for number in range(100):
            cassandra.execute(delete, (key, f"w{number}".encode()))
    legacy = other.acquire("c", 1)
    traced.futures.clear()
    assert other.read_keys(legacy, keys) == {key: KeySnapshot() for key in keys}
    assert traced.tombstones() >= len(keys) * 100


def test_a_takeover_that_cannot_list_the_keys_for_the_deleted_rows_among_them_reads_every_key(
    make_store: StoreFactory, cassandra: Any, table: StoreTable, caplog: pytest.LogCaptureFixture
) -> None:
    store = make_store()
    lease = store.acquire("c", 0)
    store.commit(lease, [KeyChanges("live", state=b"s")], dedup_ttl=TTL)
    # Keys whose state was deleted (a session's end, a state TTL) stay tombstones for 10
    # days: here more than the node's tombstone_failure_threshold (100,000), before "live".
    delete_states(cassandra, str(table), "c")
    # The read that lists them fails on the node...
    with pytest.raises(ReadFailure):
        cassandra.execute(store._statements.scan_keys, ("c", 0))

    # ...so a worker taking over does not list them and reads every key it is given.
    other = make_store()
    taken = other.acquire("c", 0)
    with caplog.at_level(logging.WARNING, logger="millstream.engine.stores.cassandra.store"):
        assert other.state_keys(taken, 10_000) is None
    assert other.stats.unlisted == 1
    assert "tombstone_failure_threshold" in caplog.text
    assert other.read_keys(taken, ["live", "gone000007"]) == {
        "live": KeySnapshot(b"s"),
        "gone000007": KeySnapshot(),
    }
    # A split or merge must read every row: it stops, and says what to do.
    with pytest.raises(StoreError, match="Raise that threshold on the nodes for the change"):
        other.export("c", 0)


def _put_legacy_timer(session: Any, table: StoreTable, timer: Timer) -> None:
    """A timer as earlier versions wrote it: a row of its own, and its index row."""
    session.execute(
        f"INSERT INTO {table} (computation, interval, kind, key, item, "
        "timer_timestamp, timer_domain, timer_set_by) VALUES ('c', 0, 'timer', %s, %s, %s, %s, %s)",
        (timer.key, timer.tag.encode(), timer.timestamp, timer.domain.value, timer.set_by),
    )
    kind, key, item = index_row(timer)
    session.execute(
        f"INSERT INTO {table} (computation, interval, kind, key, item, "
        "timer_timestamp, timer_domain, timer_set_by) VALUES ('c', 0, %s, %s, %s, %s, %s, %s)",
        (kind, key, item, timer.timestamp, timer.domain.value, timer.set_by),
    )


def test_timer_rows_of_an_earlier_version_are_read_and_give_way_to_the_keys_timers_row(
    make_store: StoreFactory, cassandra: Any, table: StoreTable
) -> None:
    store = make_store()
    lease = store.acquire("c", 0)
    a, b, x = Timer("k", "a", 10), Timer("k", "b", 20), Timer("j", "x", 30, TimeDomain.WALL_TIME)
    for timer in (a, b, x):
        _put_legacy_timer(cassandra, table, timer)
    assert store.read_keys(lease, ["k", "j"]) == {
        "k": KeySnapshot(None, {"a": a, "b": b}),
        "j": KeySnapshot(None, {"x": x}),
    }
    assert store.state_keys(lease, 10) == {"k", "j"}
    assert set(store.scan(lease).timers) == {a, b, x}

    # The key's first commit of a timers row holds its whole set and deletes its old rows.
    c = Timer("k", "c", 15)
    change = KeyChanges("k", timers={"a": None, "c": c}, previous_timers=[a])
    change.timers_after = {"b": b, "c": c}
    store.commit(lease, [change], dedup_ttl=TTL)
    assert [row.key for row in rows_of(cassandra, table, "timer")] == ["j"]
    assert store.read_keys(lease, ["k"])["k"].timers == {"b": b, "c": c}
    assert store.due_timers(lease, 100, 100) == [c, b, x]
    # A worker taking over reads the same; emptied, the key has no timers (none comes back).
    other = make_store()
    taken = other.acquire("c", 0)
    assert other.read_keys(taken, ["k", "j"]) == {
        "k": KeySnapshot(None, {"b": b, "c": c}),
        "j": KeySnapshot(None, {"x": x}),
    }
    emptied = KeyChanges("k", timers={"b": None, "c": None}, previous_timers=[b, c])
    other.commit(taken, [emptied], dedup_ttl=TTL)
    assert rows_of(cassandra, table, "timers") == []
    assert make_store().read_keys(taken, ["k"])["k"] == KeySnapshot()
    assert [(c.key, c.timers_after) for c in other.export("c", 0)] == [("j", {"x": x})]


def test_a_commit_without_the_keys_whole_timer_set_reads_it(
    make_store: StoreFactory, cassandra: Any, table: StoreTable
) -> None:
    store = make_store()
    lease = store.acquire("c", 0)
    a, b = Timer("k", "a", 1), Timer("k", "b", 2)
    store.commit(lease, [KeyChanges("k", timers={"a": a})], dedup_ttl=TTL)
    # Another store, which never read the key: it reads the committed set itself.
    other = make_store()
    other.commit(lease, [KeyChanges("k", timers={"b": b}, state=b"s")], dedup_ttl=TTL)
    assert store.read_keys(lease, ["k"])["k"] == KeySnapshot(b"s", {"a": a, "b": b})
    other.commit(lease, [KeyChanges("k", timers={"a": None})], dedup_ttl=TTL)
    assert store.read_keys(lease, ["k"])["k"].timers == {"b": b}
    assert len(rows_of(cassandra, table, "timers")) == 1


def test_an_lwt_stops_at_the_partitions_anchor_not_at_the_tombstones_before_its_rows(
    make_store: StoreFactory, cassandra: Any, table: StoreTable
) -> None:
    # A partition as an earlier version left it: no anchor row, and before its rows 300
    # tombstones of the kind that sorts first (dedup IDs expire into such).
    cassandra.execute(
        f"INSERT INTO {table} (computation, interval, sequencer, last_commit) "
        "VALUES ('c', 0, 1, 0x00)"
    )
    delete = cassandra.prepare(
        f"DELETE FROM {table} WHERE computation = 'c' AND interval = 0 "
        "AND kind = 'dedup' AND key = ? AND item = 0x"
    )
    for n in range(300):
        cassandra.execute(delete, (f"k{n:03d}",))
    traced = Traced(cassandra)
    store = make_store(session=traced)

    # The acquire's reads (the sequencer's, then the LWT's own) still pass over them all...
    lease = store.acquire("c", 0)
    assert traced.tombstones() >= 2 * 300
    # ...and write the anchor, where every later LWT and sequencer read stops: this
    # worker's, and another's taking over.
    store.commit(lease, [KeyChanges("z", state=b"s")], dedup_ttl=TTL)
    assert store.holds(lease)
    lease = store.acquire("c", 0, lease)
    store.commit(lease, [KeyChanges("z", state=b"t")], dedup_ttl=TTL)
    other = make_store(session=traced)
    taken = other.acquire("c", 0)
    other.commit(taken, [KeyChanges("z", state=b"u")], dedup_ttl=TTL)
    assert traced.tombstones() == 0
    assert [row.kind for row in rows_of(cassandra, table, "")] == [""]
    assert other.read_keys(taken, ["z"])["z"].state == b"u"


def test_a_lookup_starts_at_the_expiry_of_now_within_the_earliest_live_bucket(
    make_store: StoreFactory, cassandra: Any
) -> None:
    clock = ManualClock(1_000_000)
    store = make_store(clock=clock)
    lease = store.acquire("c", 0)
    store.commit(lease, [KeyChanges("k", dedup_ids=[rid(1)])], dedup_ttl=TTL)
    clock.advance(1_000_000)
    store.commit(lease, [KeyChanges("k", dedup_ids=[rid(2)])], dedup_ttl=TTL)
    clock.set(1_000_000 + TTL + 500_000)  # the first commit's IDs expired, not the second's
    # Both in one bucket, [60 s, 67.5 s) of expiry times: the read starts between them.
    kind = dedup_kind(1_000_000 + TTL, TTL)
    assert dedup_kind(2_000_000 + TTL, TTL) == kind
    read = store._statements.read_dedup
    rows = cassandra.execute(read, ("c", 0, [kind], ["k"], dedup_item_floor(clock.now())))
    assert [row.record for row in rows] == [rid(2)]
    assert store.seen(lease, {"k": [rid(1), rid(2)]}) == {("k", rid(2))}


def test_production_rows_reuse_their_slots_so_a_takeover_passes_few_tombstones(
    make_store: StoreFactory, cassandra: Any, table: StoreTable
) -> None:
    # A commit's productions are one row, deleted once Kafka acknowledged them (here, with
    # the next commit): a row of its own per commit left one tombstone per commit, for 10 days.
    store = make_store()
    lease = store.acquire("c", 0)
    delivered: list[bytes] = []
    for n in range(300):
        tagged = CommitTag(lease.token, n) if n % 2 else None
        made = replace(production(n), tag=tagged)
        changes = [KeyChanges("k", productions=[made])]
        store.commit(lease, changes, dedup_ttl=TTL, delivered=delivered)
        delivered = [made.record_id]
    # Two slots in turn: a commit deletes the row it acknowledges and writes to the other.
    assert [row.item for row in rows_of(cassandra, table, "production")] == [b"#\0\0\0\1"]

    traced = Traced(cassandra)
    other = make_store(session=traced)
    taken = other.acquire("c", 0)
    (pending,) = other.pending_productions(taken)
    assert traced.tombstones() <= 2  # the slots the interval ever used, not its 300 commits
    # A slot's tag is the latest commit's: an untagged commit clears a tagged one's.
    assert (pending.record_id, pending.tag) == (rid(299), CommitTag(lease.token, 299))
    other.commit(taken, [KeyChanges("k", productions=[production(300)])], dedup_ttl=TTL)
    assert {p.record_id: p.tag for p in other.scan(taken).productions} == {
        rid(299): CommitTag(lease.token, 299),
        rid(300): None,
    }
    # Both acknowledged, both rows go; the next commit takes the first slot again.
    other.delete_productions(taken, [rid(299), rid(300)])
    assert rows_of(cassandra, table, "production") == []
    other.commit(taken, [KeyChanges("k", productions=[production(301)])], dedup_ttl=TTL)
    assert [row.item for row in rows_of(cassandra, table, "production")] == [b"#\0\0\0\0"]
    assert [p.tag for p in make_store().pending_productions(taken)] == [None]


def test_production_rows_of_an_earlier_version_keep_their_tags_and_are_deleted(
    make_store: StoreFactory, cassandra: Any, table: StoreTable
) -> None:
    # As versions before slots wrote them: a unique item, the commit's tag in front of it.
    store = make_store()
    lease = store.acquire("c", 0)
    tagged, untagged = production(1), production(2)
    insert = (
        f"INSERT INTO {table} (computation, interval, kind, key, item, record) "
        "VALUES ('c', 0, 'production', '', %s, %s)"
    )
    tag = CommitTag(lease.token, 4)
    old_item = b"T" + tag.token.to_bytes(8, "big") + tag.number.to_bytes(8, "big") + rid(90)
    cassandra.execute(insert, (old_item, pack_productions([tagged])))
    cassandra.execute(insert, (rid(91), pack_productions([untagged])))

    other = make_store()
    taken = other.acquire("c", 0)
    pending = {p.record_id: p.tag for p in other.pending_productions(taken)}
    assert pending == {tagged.record_id: tag, untagged.record_id: None}
    # The new commit takes the first slot beside them; acknowledged, the old rows go.
    other.commit(
        taken,
        [KeyChanges("k", productions=[production(3)])],
        dedup_ttl=TTL,
        delivered=[tagged.record_id, untagged.record_id],
    )
    assert [row.item for row in rows_of(cassandra, table, "production")] == [b"#\0\0\0\0"]


def test_dedup_ids_expire_by_cassandra_ttl(
    make_store: StoreFactory, cassandra: Any, table: StoreTable
) -> None:
    store = make_store(clock=SystemClock())
    lease = store.acquire("c", 0)
    committed = time.monotonic()
    store.commit(lease, [KeyChanges("k", dedup_ids=[rid(1), rid(2)])], dedup_ttl=1_000_000)
    assert store.has_seen(lease, "k", [rid(1), rid(2)]) == {rid(1), rid(2)}
    # Cassandra must keep them at least as long as they count as seen (one second).
    time.sleep(max(0.0, committed + 0.95 - time.monotonic()))
    assert len(dedup_rows(cassandra, table)) == 1  # the key's IDs in one row
    # Gone from Cassandra, not just filtered.
    wait_until(
        "Cassandra deletes the expired dedup row",
        lambda: dedup_rows(cassandra, table) == [],
        timeout=5,
        every=0.2,
    )
    assert store.has_seen(lease, "k", [rid(1), rid(2)]) == set()
    assert store.scan(lease).dedup_ids == ()


def test_a_hot_keys_lookup_and_a_takeovers_load_read_no_expired_dedup_ids(
    make_store: StoreFactory, cassandra: Any
) -> None:
    # A key in every batch for longer than its IDs live: each commit's row of its IDs expires
    # into tombstones, which Cassandra keeps for gc_grace_seconds (10 days), not one TTL.
    store = make_store(clock=SystemClock())
    lease = store.acquire("c", 0)
    for n in range(300):
        store.commit(lease, [KeyChanges("hot", dedup_ids=[rid(n)])], dedup_ttl=1_000_000)
    time.sleep(2.2)  # their TTL: 2 s (1 s rounded up, plus one)
    live = [rid(1_000), rid(1_001)]
    store.commit(lease, [KeyChanges("hot", dedup_ids=live)], dedup_ttl=TTL)
    traced = Traced(cassandra)
    read_all = cassandra.prepare(
        f"SELECT key FROM {store._name} WHERE computation = 'c' AND interval = 0 "
        f"AND kind > '{DEDUP_BUCKET_PREFIX}' AND kind < '{DEDUP_BUCKETS_END}' AND key = 'hot' "
        "ALLOW FILTERING"
    )
    assert len(list(traced.execute(read_all))) == 1
    assert traced.tombstones() >= 300  # what a read of all the key's rows passes over

    # A worker taking the interval over finds the live buckets, loads its Bloom filter and
    # looks the key up, and none of that reads an expired row; nor does the owner.
    other = make_store(session=traced, clock=SystemClock())
    taken = other.acquire("c", 0)
    assert sorted(other.dedup_ids(taken, 10) or ()) == sorted(live)
    asked = {"hot": [rid(0), rid(299), *live]}
    assert other.seen(taken, asked) == {("hot", record_id) for record_id in live}
    assert other.scan(taken).dedup_ids != ()
    other.commit(taken, [KeyChanges("hot", dedup_ids=[rid(1_002)])], dedup_ttl=TTL)
    assert other.seen(taken, {"hot": [rid(1_002)]}) == {("hot", rid(1_002))}
    assert traced.tombstones() == 0


def test_a_keys_ids_of_one_commit_are_one_row_and_rows_of_one_id_still_count(
    make_store: StoreFactory, cassandra: Any, table: StoreTable
) -> None:
    store = make_store()
    lease = store.acquire("c", 0)
    ids = [rid(n) for n in range(20)]
    store.commit(
        lease, [KeyChanges("a", dedup_ids=ids), KeyChanges("b", dedup_ids=[rid(20)])], dedup_ttl=TTL
    )
    store.commit(lease, [KeyChanges("a", dedup_ids=[rid(21)])], dedup_ttl=TTL)
    rows = dedup_rows(cassandra, table)
    assert sorted((row.key, len(row.record)) for row in rows) == [("a", 16), ("a", 320), ("b", 16)]
    # A row per ID, as versions before packing wrote them (no record, and the one kind of
    # rows before buckets), counts until it expires, for a worker taking the interval over.
    cassandra.execute(
        f"INSERT INTO {table} (computation, interval, kind, key, item, expires) "
        "VALUES ('c', 0, 'dedup', 'b', %s, %s)",
        (rid(30), store.clock.now() + TTL),
    )
    store = make_store()
    lease = store.acquire("c", 0)
    assert store.seen(
        lease, {"a": [rid(0), rid(19), rid(21), rid(30)], "b": [rid(20), rid(30), rid(0)]}
    ) == {
        ("a", rid(0)),
        ("a", rid(19)),
        ("a", rid(21)),
        ("b", rid(20)),
        ("b", rid(30)),
    }
    assert sorted(store.scan(lease).dedup_ids) == sorted([*ids, rid(20), rid(21), rid(30)])
    assert len(store.dedup_ids(lease, 23) or ()) == 23
    assert store.dedup_ids(lease, 22) is None  # counted by ID, not by row
    exported = {change.key: sorted(change.dedup_ids) for change in store.export("c", 0)}
    assert exported == {"a": sorted([*ids, rid(21)]), "b": sorted([rid(20), rid(30)])}


def test_a_dedup_id_that_is_not_a_record_id_is_refused(make_store: StoreFactory) -> None:
    store = make_store()
    lease = store.acquire("c", 0)
    with pytest.raises(ValueError, match="a dedup ID must be 16 bytes"):
        store.commit(lease, [KeyChanges("a", dedup_ids=[rid(1), b"short"])], dedup_ttl=TTL)


def test_the_ttl_is_rounded_up_to_outlive_the_expiry_time(
    make_store: StoreFactory, cassandra: Any, table: StoreTable
) -> None:
    store = make_store(clock=SystemClock())
    lease = store.acquire("c", 0)
    remaining = []
    # 100.000001 s: 101 whole seconds, plus one since Cassandra's TTL clock ignores the part
    # of the current second. TTL() counts down in whole seconds: a read right after the write
    # sees 102 unless a second boundary passed in between, so a few tries make it reliable.
    for n in range(3):
        store.commit(lease, [KeyChanges(f"k{n}", dedup_ids=[rid(n)])], dedup_ttl=100_000_001)
        rows = cassandra.execute(
            f"SELECT key, TTL(expires) AS ttl FROM {table} WHERE computation = 'c' "
            "AND interval = 0 AND kind > %s AND kind < %s",
            (DEDUP_BUCKET_PREFIX, DEDUP_BUCKETS_END),
        )
        remaining.append(next(row.ttl for row in rows if row.key == f"k{n}"))
    assert max(remaining) == 102
    with pytest.raises(ValueError, match="positive"):
        store.commit(lease, [], dedup_ttl=0)
    with pytest.raises(ValueError, match="20-year"):
        store.commit(lease, [], dedup_ttl=21 * 365 * 24 * 3600 * 1_000_000)


# -- unknown outcomes -------------------------------------------------------------------------


def test_a_timeout_after_applying_is_resolved_as_applied(
    make_store: StoreFactory, scripted: ScriptedSession
) -> None:
    store = make_store()
    lease = store.acquire("c", 0)
    store.commit(lease, [KeyChanges("k", b"old")], dedup_ttl=TTL)
    scripted.intercept("batch", timeout_after_running)
    with pytest.raises(UnknownOutcomeError, match="was_applied") as raised:
        store.commit(lease, [KeyChanges("k", b"new")], dedup_ttl=TTL)
    error = raised.value
    assert isinstance(error.__cause__, WriteTimeout)
    assert (error.uncertain_keys, error.unattempted_keys) == (("k",), ())
    assert store.was_applied(lease, error.marker)
    assert not store.was_applied(lease, b"\x00" * 16)
    assert store.read_state(lease, "k") == b"new"


def test_a_timeout_before_applying_is_resolved_as_not_applied(
    make_store: StoreFactory, scripted: ScriptedSession
) -> None:
    store = make_store(max_batch_bytes=1)
    lease = store.acquire("c", 0)
    scripted.intercept("batch", timeout_without_running)
    changes = [KeyChanges(k, k.encode()) for k in ("a", "b", "c")]
    with pytest.raises(UnknownOutcomeError) as raised:
        store.commit(lease, changes, dedup_ttl=TTL)
    error = raised.value
    assert (error.uncertain_keys, error.unattempted_keys) == (("a",), ("b", "c"))
    assert not store.was_applied(lease, error.marker)
    assert [store.read_state(lease, k) for k in "abc"] == [None, None, None]
    store.commit(lease, changes, dedup_ttl=TTL)  # what the caller does next
    assert [store.read_state(lease, k) for k in "abc"] == [b"a", b"b", b"c"]


def test_cas_write_unknown_of_protocol_v5_is_an_unknown_outcome(
    make_store: StoreFactory, scripted: ScriptedSession
) -> None:
    store = make_store()
    lease = store.acquire("c", 0)
    scripted.intercept("batch", cas_write_unknown_after_running)
    with pytest.raises(UnknownOutcomeError) as raised:
        store.commit(lease, [KeyChanges("k", b"s")], dedup_ttl=TTL)
    assert store.was_applied(lease, raised.value.marker)


def test_an_unknown_outcome_of_a_delete_carries_its_marker(
    make_store: StoreFactory, scripted: ScriptedSession
) -> None:
    store = make_store()
    lease = store.acquire("c", 0)
    store.commit(lease, [KeyChanges("k", productions=[production(1)])], dedup_ttl=TTL)
    scripted.intercept("batch", timeout_after_running)
    with pytest.raises(UnknownOutcomeError, match="deletion of 1") as raised:
        store.delete_productions(lease, [rid(1)])
    assert (raised.value.uncertain_keys, raised.value.unattempted_keys) == ((), ())
    assert store.was_applied(lease, raised.value.marker)
    assert store.scan(lease).productions == ()


def test_errors_that_prove_nothing_was_sent_propagate_unchanged(
    make_store: StoreFactory, scripted: ScriptedSession
) -> None:
    store = make_store()
    lease = store.acquire("c", 0)
    scripted.intercept("batch", unavailable)
    with pytest.raises(Unavailable):
        store.commit(lease, [KeyChanges("k", b"s")], dedup_ttl=TTL)
    assert store.read_state(lease, "k") is None


class Held:
    """Intercepts a request without sending it, to send it late: a write still in flight."""

    def __init__(self) -> None:
        self.run: Run | None = None

    def __call__(self, run: Run) -> Any:
        self.run = run
        raise OperationTimedOut("injected: the client gave up, the request is still on its way")

    def land(self) -> bool:
        """Send the held request now; whether it applied."""
        assert self.run is not None
        return bool(self.run().one()[0])


def test_was_applied_fences_a_write_still_in_flight(
    make_store: StoreFactory, scripted: ScriptedSession
) -> None:
    store = make_store()
    lease = store.acquire("c", 0)
    held = Held()
    scripted.intercept("batch", held)
    with pytest.raises(UnknownOutcomeError) as raised:
        store.commit(lease, [KeyChanges("k", b"late")], dedup_ttl=TTL)
    assert not store.was_applied(lease, raised.value.marker)
    assert not held.land()  # the answer stands: the late write finds its chain moved on
    assert store.read_state(lease, "k") is None
    store.commit(lease, [KeyChanges("k", b"again")], dedup_ttl=TTL)
    assert store.read_state(lease, "k") == b"again"


def test_the_next_write_fences_an_unresolved_write_in_flight(
    make_store: StoreFactory, scripted: ScriptedSession
) -> None:
    store = make_store()
    lease = store.acquire("c", 0)
    held = Held()
    scripted.intercept("batch", held)
    with pytest.raises(UnknownOutcomeError) as raised:
        store.commit(lease, [KeyChanges("k", b"old")], dedup_ttl=TTL)
    store.commit(lease, [KeyChanges("k", b"new")], dedup_ttl=TTL)  # without resolving first
    assert not held.land()  # it would have overwritten the newer state
    assert store.read_state(lease, "k") == b"new"
    assert not store.was_applied(lease, raised.value.marker)


def test_an_uncertain_write_that_landed_is_recognised_by_the_next_write(
    make_store: StoreFactory, scripted: ScriptedSession
) -> None:
    store = make_store()
    lease = store.acquire("c", 0)
    scripted.intercept("batch", timeout_after_running)
    with pytest.raises(UnknownOutcomeError) as raised:
        store.commit(lease, [KeyChanges("a", b"a")], dedup_ttl=TTL)
    # The next commit finds the chain moved on by the write it was unsure of, and follows.
    store.commit(lease, [KeyChanges("b", b"b")], dedup_ttl=TTL)
    assert store.was_applied(lease, raised.value.marker)
    assert (store.read_state(lease, "a"), store.read_state(lease, "b")) == (b"a", b"b")


def test_an_uncertain_resolution_can_be_retried(
    make_store: StoreFactory, scripted: ScriptedSession
) -> None:
    store = make_store()
    lease = store.acquire("c", 0)
    scripted.intercept("batch", timeout_without_running)
    with pytest.raises(UnknownOutcomeError) as raised:
        store.commit(lease, [KeyChanges("k", b"s")], dedup_ttl=TTL)
    scripted.intercept("resolve", timeout_after_running)
    with pytest.raises(UnknownOutcomeError, match="call was_applied again") as again:
        store.was_applied(lease, raised.value.marker)
    assert again.value.marker == raised.value.marker
    assert not store.was_applied(lease, raised.value.marker)
    assert store.read_state(lease, "k") is None


def test_two_store_instances_sharing_a_lease_follow_each_other(
    make_store: StoreFactory,
) -> None:
    first, second = make_store(), make_store()
    lease = first.acquire("c", 0)
    first.commit(lease, [KeyChanges("a", b"1")], dedup_ttl=TTL)
    second.commit(lease, [KeyChanges("b", b"2")], dedup_ttl=TTL)
    first.commit(lease, [KeyChanges("c", b"3")], dedup_ttl=TTL)  # learns the new head
    assert [first.read_state(lease, k) for k in "abc"] == [b"1", b"2", b"3"]
    assert first.stats.batches == 3  # one retry after the head it expected had moved


@pytest.fixture
def other_session(services: MillstreamConfig) -> Iterator[Any]:
    """A session of its own, so that its requests travel on other connections."""
    cluster, session = cassandra_connector.connect(services)
    try:
        yield session
    finally:
        cluster.shutdown()


def test_real_client_timeouts_are_resolved_for_good(
    make_store: StoreFactory, cassandra: Any, other_session: Any
) -> None:
    # Genuine unknown outcomes on one node: the client gives up after a microsecond while
    # the LWT, already on the wire, runs on. Batches travel on other connections than the
    # resolving LWT, which therefore often overtakes them; whatever was_applied answers must
    # stay true once the late writes have landed.
    store = make_store(session=ScriptedSession(cassandra, batch_session=other_session))
    lease = store.acquire("c", 0)
    answers = {}
    for n in range(20):
        store.request_timeout = 1e-6
        with pytest.raises(UnknownOutcomeError) as raised:
            store.commit(lease, [KeyChanges(f"k{n}", b"x" * 20_000)], dedup_ttl=TTL)
        store.request_timeout = 10.0
        assert isinstance(raised.value.__cause__, OperationTimedOut)
        answers[f"k{n}"] = store.was_applied(lease, raised.value.marker)
    time.sleep(1)
    assert {k: store.read_state(lease, k) is not None for k in answers} == answers
    print("applied before resolution:", sum(answers.values()), "of", len(answers))


# -- sessions and the protocol ----------------------------------------------------------------


@pytest.fixture
def dict_session(services: MillstreamConfig) -> Iterator[Any]:
    cluster, session = cassandra_connector.connect(services)
    session.row_factory = dict_factory
    try:
        yield session
    finally:
        cluster.shutdown()


def test_any_row_factory_and_datacenter_local_consistency_work(
    make_store: StoreFactory, dict_session: Any
) -> None:
    store = make_store(session=dict_session, datacenter_local=True)
    lease = store.acquire("c", 0)
    lease = store.acquire("c", 0, previous=lease)
    assert lease.cache_valid
    store.commit(lease, [full_change(1)], dedup_ttl=TTL)
    assert store.read_state(lease, "key-00001") == full_change(1).state
    assert len(store.scan(lease).productions) == 1
    with pytest.raises(FencedError):
        store.commit(Lease("c", 0, 1, False), [full_change(2)], dedup_ttl=TTL)


class Counter(Computation):
    """Counts records per key in state and produces the running count."""

    def process_record(self, ctx: Context, record: Record) -> None:
        count = int(ctx.get_state() or b"0") + 1
        ctx.set_state(str(count).encode())
        ctx.produce("out", str(count).encode(), record.timestamp)


def test_the_per_key_protocol_is_exactly_once_on_cassandra(make_store: StoreFactory) -> None:
    clock = ManualClock(1_000_000)
    store, sink = make_store(clock=clock), TestingSink()
    spec = ComputationSpec(
        "counter",
        Counter(),
        (InputStream("in"),),
        ("out",),
        ComputationOptions(key_intervals=1),
    )
    deliveries = [
        Delivery(key, Record(key, b"", 10, rid(n))) for n, key in enumerate(["a", "b", "a"])
    ]
    first = IntervalWorker(spec, 0, store=store, sink=sink, clock=clock)
    assert first.process(deliveries, 0).processed == 3
    # A replay on a new worker (a retried task) finds every record a duplicate.
    replay = IntervalWorker(spec, 0, store=store, sink=sink, clock=clock).process(deliveries, 0)
    assert (replay.rescanned, replay.processed, replay.duplicates) == (True, 0, 3)
    lease = store.acquire("counter", 0)
    assert (store.read_state(lease, "a"), store.read_state(lease, "b")) == (b"2", b"1")
    assert sorted(p.record.value for p in sink.delivered()) == [b"1", b"1", b"2"]
    assert store.scan(lease).productions == ()


def test_a_takeover_reads_the_timer_index_from_the_floor_the_last_commit_kept(
    make_store: StoreFactory, cassandra: Any, table: StoreTable
) -> None:
    store = make_store()
    lease = store.acquire("c", 0)
    # The index rows of 100,001 timers fired before: tombstones for 10 days, more than the
    # node's tombstone_failure_threshold, in front of the one live timer.
    delete_index_entries(cassandra, str(table), "c")
    live = Timer("k", "t", 200_000)
    kept = TimerFloor(150_000, None)
    store.commit(lease, [KeyChanges("k", timers={"t": live})], dedup_ttl=TTL, timer_floor=kept)
    # Read from the start, the index fails on the node...
    with pytest.raises(ReadFailure):
        store.next_timers(lease)

    # ...and a worker taking over starts where the last commit kept the floor.
    other = make_store()
    taken = other.acquire("c", 0)
    assert other.kept_timer_floor(taken) == kept
    assert other.next_timers(taken, kept) == NextTimers(200_000, None)
    assert other.due_timers(taken, 250_000, 0, kept) == [live]
    # A commit that sets a timer below the floor, and keeps none of its own, keeps none.
    below = Timer("j", "t", 100)
    other.commit(taken, [KeyChanges("j", timers={"t": below})], dedup_ttl=TTL)
    assert make_store().kept_timer_floor(taken) == NO_FLOOR
    assert [row.kind for row in rows_of(cassandra, table, "timer_floor")] == ["timer_floor"]


def test_a_worker_taking_an_interval_over_passes_over_none_of_the_fired_timers(
    make_store: StoreFactory, cassandra: Any
) -> None:
    clock = ManualClock(1_000_000)
    spec = ComputationSpec(
        "windows",
        WindowTimers(),
        (InputStream("in"),),
        ("out",),
        ComputationOptions(key_intervals=1),
    )
    sink = TestingSink()
    first = IntervalWorker(spec, 0, store=make_store(clock=clock), sink=sink, clock=clock)
    # 300 windows of 20 keys, each closed by its timer as the watermark passes it.
    for window in range(1, 16):
        records = [
            Delivery(f"k{n}", Record(f"k{n}", b"", window * 100, rid(window * 100 + n)))
            for n in range(20)
        ]
        first.process(records, window * 100)
    assert len(sink.delivered()) == 14 * 20
    traced = Traced(cassandra)
    taking = IntervalWorker(
        spec, 0, store=make_store(session=traced, clock=clock), sink=sink, clock=clock
    )
    traced.futures.clear()
    result = taking.process([], 1_600)
    assert sorted(t.key for t in result.fired_timers) == sorted(f"k{n}" for n in range(20))
    assert result.rescanned
    # At most the production slots' (two, above), none of the 280 fired timers' index entries,
    # which a read from the start of the index passes over.
    assert traced.tombstones() <= 2
    make_store(session=traced).due_timers(result.lease, 1_600, 0)
    assert traced.tombstones() >= 280


class WindowTimers(Computation):
    """Sets a timer at the end of each record's window (tagged by it) and produces when it
    fires: a fresh index entry a window, a tombstone once fired."""

    def process_record(self, ctx: Context, record: Record) -> None:
        ctx.set_timer(f"w{record.timestamp}", record.timestamp + 99)

    def process_timer(self, ctx: Context, timer: Timer) -> None:
        ctx.produce("out", timer.tag.encode(), timer.timestamp)
