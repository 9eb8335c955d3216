"""The interval store contract (:mod:`millstream.engine.store`), run against every backend.

One body of tests, one ``backend`` fixture parametrized over the backends: ``memory`` (a unit
test) and ``cassandra`` (an integration test on the real Cassandra, in a keyspace of its own).
Only the public contract is used here; fault injection and inspection that exist in one
backend alone are tested in that backend's own folder.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from millstream.engine.errors import FencedError
from millstream.engine.productions import Production
from millstream.engine.records import Record, injector_record_id
from millstream.engine.sequencer import Lease
from millstream.engine.state import UNCHANGED, KeyChanges
from millstream.engine.store import IntervalSnapshot, KeySnapshot, NextTimers, TimerFloor
from millstream.engine.timers import TimeDomain, Timer

if TYPE_CHECKING:
    from tests.engine.conftest import Backend

# Long enough that Cassandra's own TTL (real seconds) never fires during a test, so expiry is
# decided by the manual clock alone, as the contract says.
TTL = 60 * 1_000_000


def rid(n: int) -> bytes:
    return injector_record_id("t", 0, n)


def production(n: int, key: str = "k") -> Production:
    return Production("out", Record(key, f"v{n}".encode(), n, rid(n)))


def change(key: str, state: bytes | None = b"s", ids: tuple[int, ...] = ()) -> KeyChanges:
    return KeyChanges(key, state=state, dedup_ids=[rid(n) for n in ids])


def test_the_first_lease_of_an_interval_has_token_one(backend: Backend) -> None:
    lease = backend.store().acquire("c", 0)
    assert (lease.token, lease.cache_valid) == (1, False)


def test_acquire_moves_the_sequencer_and_reports_cache_validity(backend: Backend) -> None:
    store = backend.store()
    first = store.acquire("c", 0)
    mine = store.acquire("c", 0, previous=first)
    assert (mine.token, mine.cache_valid) == (2, True)

    other = store.acquire("c", 0)
    assert (other.token, other.cache_valid) == (3, False)
    after_other = store.acquire("c", 0, previous=mine)
    assert (after_other.token, after_other.cache_valid) == (4, False)
    # Its first attempt, conditional on its lease, lost to the other's acquire.
    assert [lease.conflicts for lease in (first, mine, other, after_other)] == [0, 0, 0, 1]
    # A lease of another interval or computation says nothing about this one.
    assert store.acquire("c", 1, previous=after_other) == Lease("c", 1, 1, False)
    assert not store.acquire("d", 0, previous=after_other).cache_valid


def test_holds_says_whether_a_lease_is_still_its_intervals_latest(backend: Backend) -> None:
    store = backend.store()
    first = store.acquire("c", 0)
    assert store.holds(first)
    taken = store.acquire("c", 0)  # another worker takes the interval over
    assert not store.holds(first)
    assert store.holds(taken)
    # An interval nobody acquired, and one retired by a split or merge, are held by nobody.
    assert not store.holds(Lease("c", 7, 1, False))
    store.retire(taken)
    assert not store.holds(taken)


def test_dedup_ids_are_the_intervals_unexpired_ids_of_every_key_up_to_a_bound(
    backend: Backend,
) -> None:
    store = backend.store()
    lease = store.acquire("c", 0)
    assert store.dedup_ids(lease, 10) == []
    store.commit(lease, [change("a", ids=(1, 2)), change("b", ids=(3,))], dedup_ttl=TTL)
    assert sorted(store.dedup_ids(lease, 3) or []) == sorted([rid(1), rid(2), rid(3)])
    assert store.dedup_ids(lease, 2) is None  # more than the bound
    assert store.dedup_ids(store.acquire("c", 1), 10) == []  # another interval's are not
    backend.clock.advance(TTL + 1)
    assert store.dedup_ids(lease, 10) == []


def test_state_keys_are_the_intervals_keys_with_state_or_timers_up_to_a_bound(
    backend: Backend,
) -> None:
    store = backend.store()
    lease = store.acquire("c", 0)
    assert store.state_keys(lease, 10) == set()
    timer = Timer("t", "x", 5, TimeDomain.EVENT_TIME, set_by=rid(7))
    store.commit(
        lease,
        [
            change("a"),
            change("b", None, ids=(1,)),  # dedup IDs, no state: nothing to read
            KeyChanges("t", timers={"x": timer}),
            change("gone"),
        ],
        dedup_ttl=TTL,
    )
    store.commit(lease, [change("gone", None)], dedup_ttl=TTL)
    assert store.state_keys(lease, 2) == {"a", "t"}
    assert store.state_keys(lease, 1) is None  # more than the bound
    assert store.state_keys(store.acquire("c", 1), 10) == set()  # another interval's are not


def test_commit_applies_state_timers_dedup_ids_and_productions(backend: Backend) -> None:
    store = backend.store()
    lease = store.acquire("c", 0)
    timer = Timer("k", "t", 5, TimeDomain.WALL_TIME, set_by=rid(7))
    store.commit(
        lease,
        [KeyChanges("k", b"s", {"t": timer}, [production(1)], [rid(9)])],
        dedup_ttl=TTL,
    )
    assert store.read_state(lease, "k") == b"s"
    assert store.read_state(lease, "other") is None
    assert store.has_seen(lease, "k", [rid(9), rid(8)]) == {rid(9)}
    assert store.has_seen(lease, "other", [rid(9)]) == set()
    snapshot = store.scan(lease)
    assert snapshot.timers == (timer,)
    assert snapshot.productions == (production(1),)
    assert snapshot.dedup_ids == (rid(9),)

    store.commit(lease, [KeyChanges("k", None, {"t": None})], dedup_ttl=TTL)
    assert store.read_state(lease, "k") is None
    assert store.scan(lease).timers == ()
    store.delete_productions(lease, [production(1).record_id])
    assert store.scan(lease).productions == ()


def test_deleted_state_can_be_written_again(backend: Backend) -> None:
    # On Cassandra this relies on Paxos ballots ordering the delete before the new write.
    store = backend.store()
    lease = store.acquire("c", 0)
    for state in (b"one", None, b"two", None, b"three"):
        store.commit(lease, [change("k", state)], dedup_ttl=TTL)
        assert store.read_state(lease, "k") == state


def test_timers_are_set_replaced_and_deleted_by_tag(backend: Backend) -> None:
    store = backend.store()
    lease = store.acquire("c", 0)
    early, late = Timer("k", "a", 10), Timer("k", "b", 20)
    store.commit(lease, [KeyChanges("k", timers={"a": early, "b": late})], dedup_ttl=TTL)
    replaced = Timer("k", "a", 30, TimeDomain.WALL_TIME, set_by=rid(1))
    other_key = Timer("j", "a", 40)
    store.commit(
        lease,
        [
            KeyChanges("k", timers={"a": replaced, "b": None, "never-set": None}),
            KeyChanges("j", timers={"a": other_key}),
        ],
        dedup_ttl=TTL,
    )
    assert set(store.scan(lease).timers) == {replaced, other_key}


def test_unchanged_state_is_left_alone(backend: Backend) -> None:
    store = backend.store()
    lease = store.acquire("c", 0)
    store.commit(lease, [change("k", b"s")], dedup_ttl=TTL)
    store.commit(lease, [KeyChanges("k", dedup_ids=[rid(1)])], dedup_ttl=TTL)
    assert store.read_state(lease, "k") == b"s"


def test_the_empty_key_is_a_key_like_any_other(backend: Backend) -> None:
    # Cassandra files productions under key ''; they must not mix with the state of key ''.
    store = backend.store()
    lease = store.acquire("c", 0)
    store.commit(
        lease,
        [KeyChanges("", b"empty", productions=[production(1, key="")], dedup_ids=[rid(2)])],
        dedup_ttl=TTL,
    )
    store.delete_productions(lease, [rid(1)])
    assert store.read_state(lease, "") == b"empty"
    assert store.has_seen(lease, "", [rid(1), rid(2)]) == {rid(2)}
    assert store.scan(lease).productions == ()


def test_dedup_ids_belong_to_their_key(backend: Backend) -> None:
    store = backend.store()
    lease = store.acquire("c", 0)
    store.commit(lease, [change("a", ids=(1, 2)), change("b", ids=(3,))], dedup_ttl=TTL)
    assert store.has_seen(lease, "a", [rid(1), rid(2), rid(3), rid(1)]) == {rid(1), rid(2)}
    assert store.has_seen(lease, "b", [rid(1), rid(3)]) == {rid(3)}
    assert store.has_seen(lease, "a", []) == set()
    assert set(store.scan(lease).dedup_ids) == {rid(1), rid(2), rid(3)}


def test_dedup_ids_expire_after_their_ttl(backend: Backend) -> None:
    store = backend.store()
    lease = store.acquire("c", 0)
    store.commit(lease, [change("k", ids=(1,))], dedup_ttl=TTL)
    backend.clock.advance(TTL - 1)
    assert store.has_seen(lease, "k", [rid(1)]) == {rid(1)}
    assert store.scan(lease).dedup_ids == (rid(1),)
    backend.clock.advance(1)
    assert store.has_seen(lease, "k", [rid(1)]) == set()
    assert store.scan(lease).dedup_ids == ()


def test_every_write_is_fenced_by_a_newer_lease(backend: Backend) -> None:
    store = backend.store()
    old = store.acquire("c", 0)
    store.commit(old, [change("k", b"old")], dedup_ttl=TTL)
    store.commit(old, [KeyChanges("p", productions=[production(1)])], dedup_ttl=TTL)
    new = store.acquire("c", 0)

    with pytest.raises(FencedError, match="acquired by another worker"):
        store.commit(old, [change("k", b"zombie", ids=(5,))], dedup_ttl=TTL)
    with pytest.raises(FencedError):
        store.delete_productions(old, [production(1).record_id])
    with pytest.raises(FencedError):
        store.delete_productions(old, [])
    with pytest.raises(FencedError):
        store.was_applied(old, b"marker")
    # Reads are not fenced; nothing of the zombie's writes is there.
    assert store.read_state(old, "k") == b"old"
    assert store.scan(old).productions == (production(1),)
    assert store.has_seen(new, "k", [rid(5)]) == set()
    store.commit(new, [change("k", b"new")], dedup_ttl=TTL)
    assert store.read_state(new, "k") == b"new"


def test_batches_split_between_keys_apply_every_key(backend: Backend) -> None:
    store = backend.store(max_batch_bytes=300)
    lease = store.acquire("c", 0)
    keys = ["a", "b", "big", "c", "d"]
    store.commit(
        lease,
        [
            change(k, b"x" * 1_000 if k == "big" else k.encode(), ids=(n,))
            for n, k in enumerate(keys)
        ],
        dedup_ttl=TTL,
    )
    assert {k: store.read_state(lease, k) for k in keys} == {
        "a": b"a",
        "b": b"b",
        "big": b"x" * 1_000,
        "c": b"c",
        "d": b"d",
    }
    assert set(store.scan(lease).dedup_ids) == {rid(n) for n in range(len(keys))}


def test_a_key_may_appear_once_per_commit(backend: Backend) -> None:
    store = backend.store()
    lease = store.acquire("c", 0)
    with pytest.raises(ValueError, match="once per commit"):
        store.commit(lease, [change("k"), change("k")], dedup_ttl=TTL)
    assert store.read_state(lease, "k") is None


def test_an_empty_commit_writes_nothing(backend: Backend) -> None:
    store = backend.store()
    lease = store.acquire("c", 0)
    store.commit(lease, [], dedup_ttl=TTL)
    store.commit(lease, [KeyChanges("k")], dedup_ttl=TTL)
    assert store.read_state(lease, "k") is None
    assert store.scan(lease) == IntervalSnapshot((), (), ())


def test_was_applied_is_false_for_a_marker_never_written(backend: Backend) -> None:
    store = backend.store()
    lease = store.acquire("c", 0)
    store.commit(lease, [change("k")], dedup_ttl=TTL)
    assert not store.was_applied(lease, b"\x00" * 16)


def test_intervals_and_computations_are_separate(backend: Backend) -> None:
    store = backend.store()
    leases = [store.acquire(c, i) for c in ("c", "d") for i in (0, 1)]
    for n, lease in enumerate(leases):
        store.commit(
            lease,
            [KeyChanges("k", str(n).encode(), productions=[production(n)], dedup_ids=[rid(n)])],
            dedup_ttl=TTL,
        )
    for n, lease in enumerate(leases):
        assert store.read_state(lease, "k") == str(n).encode()
        assert store.scan(lease).productions == (production(n),)
        assert store.scan(lease).dedup_ids == (rid(n),)
    # Acquiring one interval fences no other.
    store.acquire("c", 0)
    store.commit(leases[1], [change("k", b"still mine")], dedup_ttl=TTL)
    assert store.read_state(leases[1], "k") == b"still mine"


def test_deleting_productions_that_are_not_pending_is_harmless(backend: Backend) -> None:
    store = backend.store()
    lease = store.acquire("c", 0)
    store.commit(lease, [KeyChanges("k", productions=[production(1)])], dedup_ttl=TTL)
    store.delete_productions(lease, [rid(99), rid(99)])
    store.delete_productions(lease, [])
    assert store.scan(lease).productions == (production(1),)


# -- what a batch reads: in bulk, only what it touches -------------------------------------


def test_read_keys_returns_state_and_timers_of_many_keys_at_once(backend: Backend) -> None:
    store = backend.store()
    lease = store.acquire("c", 0)
    keys = [f"key-{n:04}" for n in range(450)]  # more than one read's worth
    store.commit(
        lease,
        [
            KeyChanges(
                key,
                state=key.encode() if n % 3 else UNCHANGED,
                timers={"t": Timer(key, "t", n)} if n % 2 else {},
            )
            for n, key in enumerate(keys)
        ],
        dedup_ttl=TTL,
    )
    read = store.read_keys(lease, [*keys, "absent", keys[0]])

    assert set(read) == {*keys, "absent"}
    assert read["absent"] == KeySnapshot()
    for n, key in enumerate(keys):
        assert read[key].state == (key.encode() if n % 3 else None)
        assert dict(read[key].timers) == ({"t": Timer(key, "t", n)} if n % 2 else {})
    assert store.read_keys(lease, []) == {}


def test_seen_answers_by_key_and_id_across_many_keys(backend: Backend) -> None:
    store = backend.store()
    lease = store.acquire("c", 0)
    store.commit(lease, [change(f"k{n}", ids=(n,)) for n in range(300)], dedup_ttl=TTL)
    asked = {f"k{n}": [rid(n), rid(n + 1_000)] for n in range(300)}
    asked["k0"].append(rid(1))  # committed, but under k1

    assert store.seen(lease, asked) == {(f"k{n}", rid(n)) for n in range(300)}
    assert store.seen(lease, {}) == set()
    backend.clock.advance(TTL)
    assert store.seen(lease, asked) == set()


def test_read_batch_answers_as_read_keys_and_seen_do(backend: Backend) -> None:
    store = backend.store()
    lease = store.acquire("c", 0)
    store.commit(
        lease,
        [change(f"k{n}", state=f"s{n}".encode(), ids=(n,)) for n in range(300)],
        dedup_ttl=TTL,
    )
    keys = [f"k{n}" for n in range(0, 300, 2)] + ["absent"]
    asked = {f"k{n}": [rid(n), rid(n + 1_000)] for n in range(1, 300, 2)}

    read, seen = store.read_batch(lease, keys, asked)
    assert read == store.read_keys(lease, keys)
    assert read["k0"].state == b"s0"
    assert seen == store.seen(lease, asked) == {(f"k{n}", rid(n)) for n in range(1, 300, 2)}
    assert store.read_batch(lease, [], asked) == ({}, seen)
    assert store.read_batch(lease, keys, {}) == (read, set())


def test_due_and_next_timers_follow_the_firing_rule(backend: Backend) -> None:
    store = backend.store()
    lease = store.acquire("c", 0)
    assert store.due_timers(lease, 10**15, 10**15) == []
    assert store.next_timers(lease) == NextTimers()
    timers = [
        Timer("a", "x", 5),
        Timer("b", "y", 7),
        Timer("a", "z", 20),
        Timer("c", "w", 6, TimeDomain.WALL_TIME, set_by=rid(1)),
        Timer("c", "v", 30, TimeDomain.WALL_TIME),
    ]
    by_key: dict[str, dict[str, Timer | None]] = {}
    for timer in timers:
        by_key.setdefault(timer.key, {})[timer.tag] = timer
    store.commit(lease, [KeyChanges(k, timers=t) for k, t in sorted(by_key.items())], dedup_ttl=TTL)

    # Event time is due strictly below the watermark, wall time at or below now; in
    # timestamp order.
    assert store.due_timers(lease, 7, 6) == [timers[0], timers[3]]
    assert store.due_timers(lease, 21, 5) == [timers[0], timers[1], timers[2]]
    assert store.next_timers(lease) == NextTimers(event_time=5, wall_time=6)
    store.commit(
        lease,
        [KeyChanges("a", timers={"x": None}, previous_timers=[timers[0]])],
        dedup_ttl=TTL,
    )
    assert store.due_timers(lease, 21, 0) == [timers[1], timers[2]]
    assert store.next_timers(lease) == NextTimers(event_time=7, wall_time=6)


def test_timer_reads_start_at_the_floor(backend: Backend) -> None:
    store = backend.store()
    lease = store.acquire("c", 0)
    early, late = Timer("a", "x", 5), Timer("b", "y", 20)
    wall = Timer("c", "w", 6, TimeDomain.WALL_TIME)
    store.commit(
        lease,
        [KeyChanges(t.key, timers={t.tag: t}) for t in (early, late, wall)],
        dedup_ttl=TTL,
    )
    # The floor is the caller's word that no entry lies below it: entries below are not read.
    floor = TimerFloor(event_time=6, wall_time=None)
    assert store.due_timers(lease, 30, 10, floor) == [wall, late]
    assert store.next_timers(lease, floor) == NextTimers(event_time=20, wall_time=6)
    assert store.due_timers(lease, 30, 10, TimerFloor(5, 7)) == [early, late]
    assert store.next_timers(lease, TimerFloor(21, 6)) == NextTimers(None, 6)
    # A floor at or above the bound reads nothing of its domain.
    assert store.due_timers(lease, 20, 10, TimerFloor(20, 11)) == []
    # At the first entries found, the floor reads what a read from the start reads.
    first = store.next_timers(lease)
    assert store.due_timers(lease, 30, 10, TimerFloor.at(first)) == [early, wall, late]
    assert store.next_timers(lease, TimerFloor.at(first)) == first


def test_a_commit_deletes_the_rows_its_delivered_productions_complete(backend: Backend) -> None:
    store = backend.store()
    lease = store.acquire("c", 0)
    store.commit(lease, [KeyChanges("k", productions=[production(1)])], dedup_ttl=TTL)
    two = [production(2, "j"), production(3, "i")]
    halves = [KeyChanges("j", productions=[two[0]]), KeyChanges("i", productions=[two[1]])]
    store.commit(lease, halves, dedup_ttl=TTL)

    # The first row, wholly delivered, goes with the next commit; the second, half
    # delivered, stays whole.
    store.commit(lease, [change("k", ids=(9,))], dedup_ttl=TTL, delivered=[rid(1), rid(2)])
    assert store.read_state(lease, "k") == b"s"
    assert set(store.scan(lease).productions) == set(two)
    # Without changes, the delivered rows go all the same.
    store.commit(lease, [], dedup_ttl=TTL, delivered=[rid(3)])
    assert store.scan(lease).productions == ()
    # A stale lease's commit deletes nothing.
    store.commit(lease, [KeyChanges("k", productions=[production(4)])], dedup_ttl=TTL)
    stale, _ = lease, store.acquire("c", 0)
    with pytest.raises(FencedError):
        store.commit(stale, [change("k")], dedup_ttl=TTL, delivered=[rid(4)])
    assert store.scan(stale).productions == (production(4),)


def test_pending_productions_are_those_not_deleted(backend: Backend) -> None:
    store = backend.store()
    lease = store.acquire("c", 0)
    store.commit(lease, [KeyChanges("k", productions=[production(1)])], dedup_ttl=TTL)
    store.commit(lease, [KeyChanges("j", productions=[production(2, "j")])], dedup_ttl=TTL)
    store.delete_productions(lease, [rid(1)])

    # What a worker taking the interval over reads back.
    assert store.pending_productions(store.acquire("c", 0)) == (production(2, "j"),)
