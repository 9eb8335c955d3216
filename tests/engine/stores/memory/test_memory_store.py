from __future__ import annotations

import pytest

from millstream.engine.clock import ManualClock
from millstream.engine.errors import FencedError, UnknownOutcomeError
from millstream.engine.productions import Production
from millstream.engine.records import Record, injector_record_id
from millstream.engine.state import KeyChanges
from millstream.engine.store import NO_FLOOR, TimerFloor
from millstream.engine.stores.memory.store import (
    LATE_ROUNDS,
    FaultPoint,
    InjectedCrash,
    MemoryIntervalStore,
    UnknownOutcome,
)
from millstream.engine.timers import Timer

pytestmark = pytest.mark.unit

TTL = 1_000


def rid(n: int) -> bytes:
    return injector_record_id("t", 0, n)


def production(n: int) -> Production:
    return Production("out", Record("k", b"v", 1, rid(n)))


def change(key: str, state: bytes | None = b"s", ids: tuple[int, ...] = ()) -> KeyChanges:
    return KeyChanges(key, state=state, dedup_ids=[rid(n) for n in ids])


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(0)


@pytest.fixture
def store(clock: ManualClock) -> MemoryIntervalStore:
    return MemoryIntervalStore(clock)


def test_fenced_writes_leave_no_entry_in_the_commit_log(store: MemoryIntervalStore) -> None:
    # What they leave in the store is the contract tests' business (tests/engine/stores).
    old = store.acquire("c", 0)
    store.commit(old, [change("k", b"old")], dedup_ttl=TTL)
    store.commit(old, [KeyChanges("p", productions=[production(1)])], dedup_ttl=TTL)
    store.acquire("c", 0)
    with pytest.raises(FencedError):
        store.commit(old, [change("k", b"zombie")], dedup_ttl=TTL)
    with pytest.raises(FencedError):
        store.delete_productions(old, [production(1).record_id])
    assert [c.token for c in store.commit_log] == [1, 1]


def test_a_fenced_commit_applies_no_later_batch(clock: ManualClock) -> None:
    store = MemoryIntervalStore(clock, max_batch_bytes=1)
    lease = store.acquire("c", 0)

    def competitor_acquires() -> None:
        store.acquire("c", 0)

    store.inject(FaultPoint.AFTER_COMMIT, competitor_acquires)
    with pytest.raises(FencedError):
        store.commit(lease, [change("a"), change("b"), change("c")], dedup_ttl=TTL)
    assert store.states("c") == {"a": b"s"}


def test_batches_split_between_keys_under_the_byte_limit(clock: ManualClock) -> None:
    store = MemoryIntervalStore(clock, max_batch_bytes=300)
    lease = store.acquire("c", 0)
    store.commit(
        lease,
        [change("a"), change("b"), change("big", b"x" * 1_000), change("c"), change("d")],
        dedup_ttl=TTL,
    )
    batches = [c.keys for c in store.commit_log]
    assert ("big",) in batches
    assert [k for keys in batches for k in keys] == ["a", "b", "big", "c", "d"]
    assert all(len(keys) <= 2 for keys in batches)
    assert len({c.marker for c in store.commit_log}) == len(batches)


def test_unknown_outcome_that_applied(store: MemoryIntervalStore) -> None:
    lease = store.acquire("c", 0)
    store.inject_unknown_outcome(UnknownOutcome.APPLIED)
    with pytest.raises(UnknownOutcomeError) as raised:
        store.commit(lease, [change("k")], dedup_ttl=TTL)
    assert raised.value.uncertain_keys == ("k",)
    assert store.read_state(lease, "k") == b"s"
    assert store.was_applied(lease, raised.value.marker)


def test_unknown_outcome_that_did_not_apply(clock: ManualClock) -> None:
    store = MemoryIntervalStore(clock, max_batch_bytes=1)
    lease = store.acquire("c", 0)
    store.inject_unknown_outcome(UnknownOutcome.NOT_APPLIED)
    with pytest.raises(UnknownOutcomeError) as raised:
        store.commit(lease, [change("a"), change("b"), change("c")], dedup_ttl=TTL)
    assert (raised.value.uncertain_keys, raised.value.unattempted_keys) == (("a",), ("b", "c"))
    assert not store.was_applied(lease, raised.value.marker)
    assert store.states("c") == {}


def test_unknown_outcome_that_lands_at_the_next_paxos_round(store: MemoryIntervalStore) -> None:
    lease = store.acquire("c", 0)
    store.inject_unknown_outcome(UnknownOutcome.APPLIES_LATER)
    with pytest.raises(UnknownOutcomeError) as raised:
        store.commit(lease, [change("k")], dedup_ttl=TTL)
    assert store.read_state(lease, "k") is None  # plain reads do not complete Paxos
    assert store.was_applied(lease, raised.value.marker)
    assert store.read_state(lease, "k") == b"s"


def test_an_in_flight_write_lands_before_the_next_owner_acquires(
    store: MemoryIntervalStore,
) -> None:
    lease = store.acquire("c", 0)
    store.inject_unknown_outcome(UnknownOutcome.APPLIES_LATER)
    with pytest.raises(UnknownOutcomeError):
        store.commit(lease, [change("k")], dedup_ttl=TTL)
    successor = store.acquire("c", 0)
    assert store.read_state(successor, "k") == b"s"
    assert [c.token for c in store.commit_log] == [lease.token]


def test_a_late_proposal_is_fenced_by_the_resolution(store: MemoryIntervalStore) -> None:
    lease = store.acquire("c", 0)
    store.inject_unknown_outcome(UnknownOutcome.PROPOSED_LATE)
    with pytest.raises(UnknownOutcomeError) as raised:
        store.commit(lease, [change("k", b"late")], dedup_ttl=TTL)
    assert not store.was_applied(lease, raised.value.marker)
    for _ in range(LATE_ROUNDS):
        store.delete_productions(lease, [])
    assert store.in_flight("c", 0) == 0
    assert store.read_state(lease, "k") is None


def test_a_late_proposal_cannot_overwrite_newer_commits(store: MemoryIntervalStore) -> None:
    lease = store.acquire("c", 0)
    store.inject_unknown_outcome(UnknownOutcome.PROPOSED_LATE)
    with pytest.raises(UnknownOutcomeError):
        store.commit(lease, [change("k", b"old")], dedup_ttl=TTL)
    store.commit(lease, [change("k", b"new")], dedup_ttl=TTL)  # a blind retry, then more
    for _ in range(LATE_ROUNDS):
        store.delete_productions(lease, [])
    assert store.in_flight("c", 0) == 0
    assert store.read_state(lease, "k") == b"new"


def every_operation(store: MemoryIntervalStore) -> None:
    lease = store.acquire("c", 0)
    store.scan(lease)
    store.read_state(lease, "k")
    store.commit(lease, [change("k")], dedup_ttl=TTL)
    store.delete_productions(lease, [])


@pytest.mark.parametrize("point", list(FaultPoint))
def test_crashes_can_be_injected_at_every_point(
    store: MemoryIntervalStore, point: FaultPoint
) -> None:
    store.inject(point)
    with pytest.raises(InjectedCrash, match=point.value):
        every_operation(store)
    every_operation(store)  # a fault fires once


def test_crash_before_commit_applies_nothing_and_after_commit_everything(
    store: MemoryIntervalStore,
) -> None:
    lease = store.acquire("c", 0)
    store.inject(FaultPoint.BEFORE_COMMIT)
    with pytest.raises(InjectedCrash):
        store.commit(lease, [change("a")], dedup_ttl=TTL)
    store.inject(FaultPoint.AFTER_COMMIT)
    with pytest.raises(InjectedCrash):
        store.commit(lease, [change("b")], dedup_ttl=TTL)
    assert store.states("c") == {"b": b"s"}


def test_clear_faults(store: MemoryIntervalStore) -> None:
    store.inject(FaultPoint.BEFORE_ACQUIRE)
    store.inject_unknown_outcome(UnknownOutcome.NOT_APPLIED)
    store.clear_faults()
    lease = store.acquire("c", 0)
    store.commit(lease, [change("k")], dedup_ttl=TTL)
    assert store.states("c") == {"k": b"s"}


def test_batch_limit_must_be_positive(clock: ManualClock) -> None:
    with pytest.raises(ValueError, match="max_batch_bytes"):
        MemoryIntervalStore(clock, max_batch_bytes=0)


def test_a_whole_timer_set_that_disagrees_with_the_committed_timers_is_refused(
    store: MemoryIntervalStore,
) -> None:
    # The Cassandra store writes a key's timers_after as its one timers row: a wrong one
    # would lose a timer there (or revive a fired one), so the reference store refuses it.
    lease = store.acquire("c", 0)
    a, b = Timer("k", "a", 1), Timer("k", "b", 2)
    store.commit(lease, [KeyChanges("k", timers={"a": a}, timers_after={"a": a})], dedup_ttl=TTL)
    with pytest.raises(ValueError, match=r"timers_after of key 'k' \(\['b'\]\) is not"):
        store.commit(
            lease, [KeyChanges("k", timers={"b": b}, timers_after={"b": b})], dedup_ttl=TTL
        )
    assert store.read_keys(lease, ["k"])["k"].timers == {"a": a}
    store.commit(
        lease, [KeyChanges("k", timers={"b": b}, timers_after={"a": a, "b": b})], dedup_ttl=TTL
    )
    assert store.read_keys(lease, ["k"])["k"].timers == {"a": a, "b": b}
    exported = store.export("c", 0)
    assert [(c.key, c.timers_after) for c in exported] == [("k", {"a": a, "b": b})]


def test_a_commit_keeps_the_timer_floor_and_one_cut_short_keeps_none_its_timers_would_break(
    clock: ManualClock,
) -> None:
    store = MemoryIntervalStore(clock, max_batch_bytes=1)  # a batch a key
    lease = store.acquire("c", 0)
    assert store.kept_timer_floor(lease) == NO_FLOOR
    store.commit(lease, [change("a")], dedup_ttl=TTL, timer_floor=TimerFloor(40, None))
    assert store.kept_timer_floor(lease) == TimerFloor(40, None)
    store.commit(lease, [change("b")], dedup_ttl=TTL)  # sets no timer: the floor holds
    assert store.kept_timer_floor(lease) == TimerFloor(40, None)
    # A timer below it, in the first of two batches, and a crash before the second: the
    # floor the second would have kept (lowered to 30) never lands, and 40 would hide it.
    early = KeyChanges("c", timers={"t": Timer("c", "t", 30)})
    store.inject(FaultPoint.BEFORE_COMMIT, lambda: None)
    store.inject(FaultPoint.BEFORE_COMMIT, _crash_now)
    with pytest.raises(InjectedCrash):
        store.commit(lease, [early, change("d")], dedup_ttl=TTL, timer_floor=TimerFloor(40, None))
    assert store.kept_timer_floor(lease) == NO_FLOOR
    store.commit(lease, [change("d")], dedup_ttl=TTL, timer_floor=TimerFloor(30, None))
    assert store.kept_timer_floor(lease) == TimerFloor(30, None)
    assert store.due_timers(lease, 31, 0, store.kept_timer_floor(lease)) == [Timer("c", "t", 30)]


def _crash_now() -> None:
    raise InjectedCrash("crash between the commit's batches")
