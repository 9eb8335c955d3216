"""An in-process :class:`~millstream.engine.store.IntervalStore` with injectable faults.

It has the semantics of the Cassandra backend, down to what a test can observe: sequencer
fencing of every write, one atomic batch per group of keys under a byte limit, dedup IDs that
expire against the injected clock, and a chain of ``last_commit`` markers. Every conditional
write (acquire, commit batch, delete, the fence of :meth:`~MemoryIntervalStore.was_applied`)
is one "Paxos round" on the partition; a write checks ``sequencer == token`` and that
``last_commit`` is still the marker it was issued after, then sets a fresh one.

A write that times out may really have applied, never apply, be completed by the next round
(an accepted Paxos proposal), or still be queued and be proposed rounds later with its original
condition (what a coordinator does with a client-timed-out write). The marker chain makes the
last one harmless: by then ``last_commit`` has moved and the condition fails.

Faults are armed one at a time and fire once, in the order armed:

* :meth:`MemoryIntervalStore.inject` runs an action at a :class:`FaultPoint` (by default it
  raises :class:`InjectedCrash`, a simulated process crash; any callable may stand in, e.g. one
  that lets a competing worker acquire the interval in the middle of a batch);
* :meth:`MemoryIntervalStore.inject_unknown_outcome` makes the next commit batch time out.
"""

from __future__ import annotations

import enum
import itertools
import struct
from collections import deque
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field

from millstream.engine.clock import Clock
from millstream.engine.errors import FencedError, RetiredIntervalError, UnknownOutcomeError
from millstream.engine.layout import IntervalLayout
from millstream.engine.productions import Production
from millstream.engine.sequencer import INITIAL_SEQUENCER, Lease
from millstream.engine.state import UNCHANGED, KeyChanges, effective_timers
from millstream.engine.store import (
    DEFAULT_MAX_BATCH_BYTES,
    NO_FLOOR,
    IntervalSnapshot,
    IntervalStore,
    KeySnapshot,
    NextTimers,
    TimerFloor,
    kept_floors,
    split_batches,
)
from millstream.engine.timers import TimeDomain, Timer, due_timers

__all__ = [
    "DEFAULT_MAX_BATCH_BYTES",
    "LATE_ROUNDS",
    "AppliedCommit",
    "FaultPoint",
    "InjectedCrash",
    "MemoryIntervalStore",
    "UnknownOutcome",
]


class FaultPoint(enum.Enum):
    """Where an injected fault fires."""

    BEFORE_ACQUIRE = "before_acquire"
    AFTER_ACQUIRE = "after_acquire"
    BEFORE_SCAN = "before_scan"
    BEFORE_READ = "before_read"
    BEFORE_COMMIT = "before_commit"
    AFTER_COMMIT = "after_commit"
    BEFORE_DELETE = "before_delete"
    AFTER_DELETE = "after_delete"


class UnknownOutcome(enum.Enum):
    """What really happens to a commit batch that timed out."""

    APPLIED = "applied"
    NOT_APPLIED = "not_applied"
    APPLIES_LATER = "applies_later"
    """Completed by the next round on the partition, before that round's own write."""
    PROPOSED_LATE = "proposed_late"
    """Still queued; proposed with its original condition after :data:`LATE_ROUNDS` rounds."""


# How many later rounds a PROPOSED_LATE write waits: past the caller's resolution and retry,
# into the writes of its next batch.
LATE_ROUNDS = 6


class InjectedCrash(Exception):  # noqa: N818 - it is a crash, not an error of the code under test
    """A simulated crash of the process at a fault point."""


@dataclass(frozen=True, slots=True)
class AppliedCommit:
    """One applied commit batch, for tests: who wrote it and what it touched."""

    computation: str
    interval: int
    token: int
    sequencer: int
    marker: bytes
    keys: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class _Write:
    """One conditional commit batch, as issued."""

    lease: Lease
    after: bytes
    marker: bytes
    changes: tuple[KeyChanges, ...]
    dedup_ttl: int
    deletes: tuple[bytes, ...] = ()  # production rows (their markers) deleted with it
    floor: TimerFloor | None = None  # the timer floor it keeps (None: leaves it as it was)


@dataclass
class _ProductionRow:
    productions: dict[bytes, Production]
    # What the owner's store instance learned was acknowledged (on Cassandra, instance memory).
    acknowledged: set[bytes] = field(default_factory=set)


@dataclass
class _Partition:
    sequencer: int = INITIAL_SEQUENCER
    last_commit: bytes = b""
    rounds: int = 0
    states: dict[str, bytes] = field(default_factory=dict)
    timers: dict[str, dict[str, Timer]] = field(default_factory=dict)
    dedup: dict[str, dict[bytes, int]] = field(default_factory=dict)
    # Like the Cassandra rows: one per commit batch, by its marker; and the time index.
    productions: dict[bytes, _ProductionRow] = field(default_factory=dict)
    index: dict[tuple[TimeDomain, int, str, str], Timer] = field(default_factory=dict)
    timer_floor: TimerFloor = NO_FLOOR  # as the latest commit kept it
    retired: bool = False

    def pending(self) -> list[Production]:
        return [p for row in self.productions.values() for p in row.productions.values()]

    def unexpired_ids(self, now: int) -> list[bytes]:
        """Every dedup ID of the partition whose TTL has not run out at ``now``."""
        return [rid for ids in self.dedup.values() for rid, expires in ids.items() if expires > now]

    delayed: list[tuple[int, _Write]] = field(default_factory=list)


class MemoryIntervalStore(IntervalStore):
    """Interval partitions in a dict; single-threaded."""

    def __init__(self, clock: Clock, *, max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES) -> None:
        if max_batch_bytes < 1:
            raise ValueError(f"max_batch_bytes must be positive, got {max_batch_bytes}")
        self.clock = clock
        self.max_batch_bytes = max_batch_bytes
        self.commit_log: list[AppliedCommit] = []
        self._partitions: dict[tuple[str, int], _Partition] = {}
        self._faults: dict[FaultPoint, deque[Callable[[], object]]] = {}
        self._unknown_outcomes: deque[UnknownOutcome] = deque()
        self._markers = itertools.count(1)
        self._layouts: dict[str, IntervalLayout] = {}

    # -- fault injection ------------------------------------------------------------------

    def inject(self, point: FaultPoint, action: Callable[[], object] | None = None) -> None:
        """Run ``action`` (default: raise :class:`InjectedCrash`) the next time ``point`` is hit."""
        self._faults.setdefault(point, deque()).append(action or _crash(point))

    def inject_unknown_outcome(self, outcome: UnknownOutcome) -> None:
        """Make the next commit batch time out, with ``outcome`` as what really happened."""
        self._unknown_outcomes.append(outcome)

    def clear_faults(self) -> None:
        self._faults.clear()
        self._unknown_outcomes.clear()

    # -- the contract ----------------------------------------------------------------------

    def acquire(self, computation: str, interval: int, previous: Lease | None = None) -> Lease:
        self._fault(FaultPoint.BEFORE_ACQUIRE)
        partition = self._round(computation, interval)
        if partition.retired:
            raise RetiredIntervalError(
                f"interval {interval} of {computation!r} was split or merged away; route by "
                "the computation's current layout"
            )
        same = previous is not None and (previous.computation, previous.interval) == (
            computation,
            interval,
        )
        cache_valid = same and previous is not None and previous.token == partition.sequencer
        partition.sequencer += 1
        partition.last_commit = self._marker()
        # As the Cassandra store counts: an attempt conditional on the previous lease that
        # another writer's acquire had overtaken.
        conflicts = int(same and not cache_valid)
        lease = Lease(computation, interval, partition.sequencer, cache_valid, conflicts)
        self._fault(FaultPoint.AFTER_ACQUIRE)
        return lease

    def holds(self, lease: Lease) -> bool:
        partition = self._partitions.get((lease.computation, lease.interval))
        return (
            partition is not None and not partition.retired and partition.sequencer == lease.token
        )

    def scan(self, lease: Lease) -> IntervalSnapshot:
        self._fault(FaultPoint.BEFORE_SCAN)
        partition = self._partition(lease.computation, lease.interval)
        now = self.clock.now()
        return IntervalSnapshot(
            timers=tuple(t for timers in partition.timers.values() for t in timers.values()),
            productions=tuple(partition.pending()),
            dedup_ids=tuple(partition.unexpired_ids(now)),
        )

    def dedup_ids(self, lease: Lease, limit: int) -> list[bytes] | None:
        self._fault(FaultPoint.BEFORE_SCAN)
        partition = self._partition(lease.computation, lease.interval)
        found = partition.unexpired_ids(self.clock.now())
        return found if len(found) <= limit else None

    def state_keys(self, lease: Lease, limit: int) -> Set[str] | None:
        self._fault(FaultPoint.BEFORE_READ)
        partition = self._partition(lease.computation, lease.interval)
        found = partition.states.keys() | {key for key, tags in partition.timers.items() if tags}
        return found if len(found) <= limit else None

    def read_keys(self, lease: Lease, keys: Collection[str]) -> dict[str, KeySnapshot]:
        self._fault(FaultPoint.BEFORE_READ)
        partition = self._partition(lease.computation, lease.interval)
        return {
            key: KeySnapshot(partition.states.get(key), dict(partition.timers.get(key, {})))
            for key in keys
        }

    def seen(
        self, lease: Lease, record_ids: Mapping[str, Collection[bytes]]
    ) -> Set[tuple[str, bytes]]:
        self._fault(FaultPoint.BEFORE_READ)
        partition = self._partition(lease.computation, lease.interval)
        now = self.clock.now()
        return {
            (key, record_id)
            for key, candidates in record_ids.items()
            for record_id in candidates
            if partition.dedup.get(key, {}).get(record_id, now) > now
        }

    def due_timers(
        self, lease: Lease, input_low_watermark: int, now: int, floor: TimerFloor = NO_FLOOR
    ) -> list[Timer]:
        self._fault(FaultPoint.BEFORE_READ)
        partition = self._partition(lease.computation, lease.interval)
        return due_timers(_above(partition.index.values(), floor), input_low_watermark, now)

    def next_timers(self, lease: Lease, floor: TimerFloor = NO_FLOOR) -> NextTimers:
        # Entries below the floor are left out, as the Cassandra store's range reads leave
        # them: a floor set too high loses timers here too, where the protocol's tests see it.
        timers = _above(self._partition(lease.computation, lease.interval).index.values(), floor)
        return NextTimers(
            event_time=min(
                (t.timestamp for t in timers if t.domain is TimeDomain.EVENT_TIME), default=None
            ),
            wall_time=min(
                (t.timestamp for t in timers if t.domain is TimeDomain.WALL_TIME), default=None
            ),
        )

    def pending_productions(self, lease: Lease) -> tuple[Production, ...]:
        self._fault(FaultPoint.BEFORE_SCAN)
        partition = self._partition(lease.computation, lease.interval)
        for row in partition.productions.values():
            row.acknowledged.clear()  # a new owner's instance knows of no acknowledgement
        return tuple(partition.pending())

    def commit(
        self,
        lease: Lease,
        changes: Sequence[KeyChanges],
        *,
        dedup_ttl: int,
        delivered: Collection[bytes] = (),
        timer_floor: TimerFloor | None = None,
    ) -> None:
        keys = [change.key for change in changes]
        if len(set(keys)) != len(keys):
            raise ValueError("each key may appear once per commit: merge its changes first")
        batches = split_batches(changes, self.max_batch_bytes)
        floors = kept_floors(batches, timer_floor)
        if delivered and len(batches) != 1:
            # As on Cassandra: a commit of several batches (or none) deletes on its own.
            self.delete_productions(lease, delivered)
            delivered = ()
        for number, batch in enumerate(batches):
            self._fault(FaultPoint.BEFORE_COMMIT)
            partition = self._fenced(lease)
            _check_timers_after(partition, batch)
            deletes = self._acknowledge(partition, delivered)
            write = _Write(
                lease,
                partition.last_commit,
                self._marker(),
                tuple(batch),
                dedup_ttl,
                deletes,
                floors[number],
            )
            outcome = self._unknown_outcomes.popleft() if self._unknown_outcomes else None
            if outcome is None or outcome is UnknownOutcome.APPLIED:
                self._land(partition, write)
            elif outcome is UnknownOutcome.APPLIES_LATER:
                partition.delayed.append((partition.rounds + 1, write))
            elif outcome is UnknownOutcome.PROPOSED_LATE:
                partition.delayed.append((partition.rounds + LATE_ROUNDS, write))
            if outcome is not None:
                raise UnknownOutcomeError(
                    f"commit to {lease.computation}/{lease.interval} timed out (injected)",
                    marker=write.marker,
                    uncertain_keys=tuple(c.key for c in batch),
                    unattempted_keys=tuple(c.key for later in batches[number + 1 :] for c in later),
                )
            self._fault(FaultPoint.AFTER_COMMIT)

    def kept_timer_floor(self, lease: Lease) -> TimerFloor:
        self._fault(FaultPoint.BEFORE_READ)
        return self._partition(lease.computation, lease.interval).timer_floor

    def was_applied(self, lease: Lease, marker: bytes) -> bool:
        partition = self._fenced(lease)
        if partition.last_commit == marker:
            return True
        # Move the chain on, so that the uncertain write, if still queued, can never apply.
        partition.last_commit = self._marker()
        return False

    def delete_productions(self, lease: Lease, record_ids: Collection[bytes]) -> None:
        self._fault(FaultPoint.BEFORE_DELETE)
        partition = self._fenced(lease)
        for marker in self._acknowledge(partition, record_ids):
            del partition.productions[marker]
        partition.last_commit = self._marker()
        self._fault(FaultPoint.AFTER_DELETE)

    def export(self, computation: str, interval: int) -> list[KeyChanges]:
        partition = self._partition(computation, interval)
        now = self.clock.now()
        keys = sorted(partition.states.keys() | partition.timers.keys() | partition.dedup.keys())
        changes = [
            KeyChanges(
                key,
                state=partition.states.get(key, UNCHANGED),
                timers=dict(partition.timers.get(key, {})),
                timers_after=dict(partition.timers[key]) if key in partition.timers else None,
                dedup_ids=[i for i, at in partition.dedup.get(key, {}).items() if at > now],
            )
            for key in keys
        ]
        pending = partition.pending()
        if pending:
            changes.append(KeyChanges("", productions=pending))
        return changes

    def retire(self, lease: Lease) -> None:
        partition = self._fenced(lease)
        partition.retired = True
        # As on Cassandra, the sequencer moves on: not even the retiring lease writes again.
        partition.sequencer += 1
        partition.last_commit = self._marker()

    def purge(self, computation: str, interval: int) -> None:
        partition = self._partition(computation, interval)
        if not partition.retired:
            raise FencedError(
                f"interval {interval} of {computation!r} is not retired: only a retired "
                "interval's rows are purged"
            )
        partition.states.clear()
        partition.timers.clear()
        partition.dedup.clear()
        partition.productions.clear()
        partition.index.clear()

    def read_layout(self, computation: str) -> IntervalLayout | None:
        return self._layouts.get(computation)

    def write_layout(
        self, computation: str, layout: IntervalLayout, expected: IntervalLayout | None
    ) -> bool:
        if self._layouts.get(computation) != expected:
            return False
        self._layouts[computation] = layout
        return True

    # -- inspection for tests ----------------------------------------------------------------

    def sequencer(self, computation: str, interval: int) -> int:
        return self._partition(computation, interval).sequencer

    def in_flight(self, computation: str, interval: int) -> int:
        """How many timed-out writes of the interval have not landed or failed yet."""
        return len(self._partition(computation, interval).delayed)

    def states(self, computation: str) -> dict[str, bytes]:
        """Committed state of every key of ``computation``, across its intervals."""
        return {
            key: value
            for (name, _), partition in sorted(self._partitions.items())
            if name == computation
            for key, value in partition.states.items()
        }

    def timers(self, computation: str) -> list[Timer]:
        return [
            timer
            for (name, _), partition in sorted(self._partitions.items())
            if name == computation
            for timers in partition.timers.values()
            for timer in timers.values()
        ]

    def productions(self, computation: str) -> list[Production]:
        """The pending productions of every interval of ``computation``."""
        return [
            production
            for (name, _), partition in sorted(self._partitions.items())
            if name == computation
            for production in partition.pending()
        ]

    # -- internals -------------------------------------------------------------------------

    def _partition(self, computation: str, interval: int) -> _Partition:
        return self._partitions.setdefault((computation, interval), _Partition())

    def _round(self, computation: str, interval: int) -> _Partition:
        """Start a Paxos round: delayed writes due by now are proposed first."""
        partition = self._partition(computation, interval)
        partition.rounds += 1
        due = [w for at, w in partition.delayed if at <= partition.rounds]
        partition.delayed = [(at, w) for at, w in partition.delayed if at > partition.rounds]
        for write in due:
            self._land(partition, write)
        return partition

    def _fenced(self, lease: Lease) -> _Partition:
        partition = self._round(lease.computation, lease.interval)
        if partition.sequencer != lease.token:
            raise FencedError(
                f"interval {lease.interval} of {lease.computation!r} was acquired by another "
                f"worker (sequencer {partition.sequencer}, this lease {lease.token}); stop work "
                "on it and drop its cached state"
            )
        return partition

    def _land(self, partition: _Partition, write: _Write) -> None:
        lease = write.lease
        if partition.sequencer != lease.token or partition.last_commit != write.after:
            return  # its condition no longer holds: the write does not apply
        expires = self.clock.now() + write.dedup_ttl
        for change in write.changes:
            _apply(partition, change, expires)
        for marker in write.deletes:
            partition.productions.pop(marker, None)
        if write.floor is not None:
            partition.timer_floor = write.floor
        productions = {p.record_id: p for c in write.changes for p in c.productions}
        if productions:
            partition.productions[write.marker] = _ProductionRow(productions)
        partition.last_commit = write.marker
        self.commit_log.append(
            AppliedCommit(
                lease.computation,
                lease.interval,
                lease.token,
                partition.sequencer,
                write.marker,
                tuple(c.key for c in write.changes),
            )
        )

    @staticmethod
    def _acknowledge(partition: _Partition, record_ids: Collection[bytes]) -> tuple[bytes, ...]:
        """Note ``record_ids`` acknowledged (the owner's instance memory, as on Cassandra);
        the markers of the production rows now wholly acknowledged."""
        acknowledged = set(record_ids)
        done: list[bytes] = []
        for marker, row in partition.productions.items():
            row.acknowledged |= acknowledged & row.productions.keys()
            if row.acknowledged >= row.productions.keys():
                done.append(marker)
        return tuple(done)

    def _marker(self) -> bytes:
        return struct.pack(">Q", next(self._markers))

    def _fault(self, point: FaultPoint) -> None:
        actions = self._faults.get(point)
        if actions:
            actions.popleft()()


def _check_timers_after(partition: _Partition, batch: Sequence[KeyChanges]) -> None:
    """Refuse a change whose ``timers_after`` is not what its timers make of the committed
    ones: a backend that keeps a key's timers in one row (Cassandra) writes that set as it is,
    so a wrong one would lose or revive timers there."""
    for change in batch:
        if change.timers and change.timers_after is not None:
            expected = effective_timers(partition.timers.get(change.key, {}), change)
            if change.timers_after != expected:
                raise ValueError(
                    f"the timers_after of key {change.key!r} ({sorted(change.timers_after)}) is "
                    f"not its committed timers with its changes applied ({sorted(expected)})"
                )


def _apply(partition: _Partition, change: KeyChanges, dedup_expires: int) -> None:
    key = change.key
    if change.state is None:
        partition.states.pop(key, None)
    elif change.state is not UNCHANGED:
        partition.states[key] = change.state
    indexed: set[tuple[TimeDomain, int, str, str]] = set()
    if change.timers:
        timers = partition.timers.setdefault(key, {})
        for tag, timer in change.timers.items():
            if timer is None:
                timers.pop(tag, None)
            else:
                timers[tag] = timer
                entry = (timer.domain, timer.timestamp, key, tag)
                partition.index[entry] = timer
                indexed.add(entry)
        if not timers:
            del partition.timers[key]
    # As on Cassandra: the index loses only the entries named, so an unnamed replaced timer
    # leaves a stale entry behind for the protocol to recognise.
    for previous in change.previous_timers:
        entry = (previous.domain, previous.timestamp, previous.key, previous.tag)
        if entry not in indexed:
            partition.index.pop(entry, None)
    if change.dedup_ids:
        ids = partition.dedup.setdefault(key, {})
        ids.update(dict.fromkeys(change.dedup_ids, dedup_expires))


def _crash(point: FaultPoint) -> Callable[[], None]:
    def crash() -> None:
        raise InjectedCrash(f"injected crash at {point.value}")

    return crash


def _above(timers: Iterable[Timer], floor: TimerFloor) -> list[Timer]:
    """The index entries at or above ``floor`` in their domain."""
    return [
        timer
        for timer in timers
        if (bound := floor.of(timer.domain)) is None or timer.timestamp >= bound
    ]
