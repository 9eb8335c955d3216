"""The interval store: the contract every backend of MillWheel's persistent state fulfils.

Everything a computation persists for one key interval lives in one *partition* that only
sequencer-guarded writes touch (paper 6.2): the interval's sequencer, and rows of four kinds,
per key: state, timers, dedup IDs, and pending productions. A backend implements
:class:`IntervalStore`; ``stores/memory`` holds an in-process one, ``stores/cassandra`` mirrors
it on Cassandra. On Cassandra the mapping is one to one:

* one table, partition key ``(computation, interval)``; a static ``sequencer`` column and a
  static ``last_commit`` marker column;
* clustering rows ``(kind, key, item)``: ``state`` (``item`` empty), ``timers`` (a key's
  timers in one row, rewritten whole: :attr:`~millstream.engine.state.KeyChanges.timers_after`)
  and a time-ordered index of the timers (``key`` the timestamp, so due timers are a range),
  dedup rows (a key's record IDs of a commit, in buckets of their expiry, written ``USING
  TTL``), ``production`` (``key`` empty, one row per commit batch holding its productions);
* :meth:`~IntervalStore.acquire` is an LWT ``UPDATE ... SET sequencer = s + 1 IF sequencer = s``
  (read ``s`` at SERIAL, retry on contention); every other write is an LWT conditional batch
  on that one partition ``IF sequencer = token AND last_commit = <the marker before>``,
  setting ``last_commit`` to a fresh marker. The markers form a chain, so a write that timed
  out and is proposed late (still queued at a coordinator) fails once anything was written
  after it;
* reads run after the acquiring LWT, whose Paxos round completes or supersedes any write still
  in flight from an earlier owner, so a read cannot miss one (paper figure 12);
* an LWT timeout raises :class:`~millstream.engine.errors.UnknownOutcomeError`, resolved by
  :meth:`~IntervalStore.was_applied`, which either finds the write's marker or moves the chain
  past it (a SERIAL read alone would not stop a late proposal).

**Cost grows with the batch, not with the interval.** A batch reads only what it touches, in
bulk: the state and timers of its keys (:meth:`~IntervalStore.read_keys`), its dedup candidates
(:meth:`~IntervalStore.seen`), its due timers (:meth:`~IntervalStore.due_timers`, a range of
the time-ordered index), and, when a worker takes the interval over, the pending productions
(:meth:`~IntervalStore.pending_productions`, bounded by what was not acknowledged yet). Only
:meth:`~IntervalStore.scan`, for tests and tools, reads the whole interval.

Times are integer microseconds from the store's injected clock.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Collection, Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from typing import Final

from millstream.engine.layout import LayoutStore
from millstream.engine.productions import Production
from millstream.engine.sequencer import Lease
from millstream.engine.state import KeyChanges
from millstream.engine.timers import TimeDomain, Timer

__all__ = [
    "DEFAULT_MAX_BATCH_BYTES",
    "NO_FLOOR",
    "IntervalSnapshot",
    "IntervalStore",
    "KeySnapshot",
    "NextTimers",
    "TimerFloor",
    "kept_floors",
    "split_batches",
]

# What a backend's commit batch holds at most by default (approximate bytes; see
# :func:`split_batches`). Cassandra's reason for the figure is in its backend's docstring.
DEFAULT_MAX_BATCH_BYTES: Final = 1024 * 1024


@dataclass(frozen=True, slots=True)
class IntervalSnapshot:
    """Everything but the states of an interval, read by :meth:`IntervalStore.scan` (tests,
    tools): all timers, the pending productions and the unexpired dedup IDs."""

    timers: tuple[Timer, ...]
    productions: tuple[Production, ...]
    dedup_ids: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class KeySnapshot:
    """The committed state (``None``: none) and timers (by tag) of one key."""

    state: bytes | None = None
    timers: Mapping[str, Timer] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class NextTimers:
    """The earliest timer of each domain in an interval (``None``: none); for watermarks."""

    event_time: int | None = None
    wall_time: int | None = None


# A floor above every timestamp: the domain's index holds no entry at all.
_NO_ENTRY: Final = 2**63 - 1


@dataclass(frozen=True, slots=True)
class TimerFloor:
    """Per time domain, a timestamp below which the caller knows the interval's timer index
    holds no entry (``None``: it knows nothing; read from the start).

    An interval's owner knows it from its own reads and commits, while nobody else writes the
    interval: the first entry :meth:`IntervalStore.next_timers` found, raised past the due
    timers a commit deleted (:meth:`raised`), and lowered to every timer it set
    (:meth:`lowered`). Reads of the index start there, stepping over the
    entries of the timers it fired and deleted: Cassandra keeps those as tombstones for
    ``gc_grace_seconds``, and a read from the start goes through every one of them.
    """

    event_time: int | None = None
    wall_time: int | None = None

    @classmethod
    def at(cls, first: NextTimers) -> TimerFloor:
        """The floor of an index whose first entries are ``first`` (a domain without any has
        a floor above every timestamp, until a timer is set in it)."""
        return cls(
            _NO_ENTRY if first.event_time is None else first.event_time,
            _NO_ENTRY if first.wall_time is None else first.wall_time,
        )

    def of(self, domain: TimeDomain) -> int | None:
        return self.event_time if domain is TimeDomain.EVENT_TIME else self.wall_time

    def raised(self, read_below: TimerFloor, left: Iterable[Timer]) -> TimerFloor:
        """This floor once a read took every entry from it up to ``read_below`` (excluded),
        and a commit deleted all of them but ``left``: at ``read_below``, or at the first of
        ``left``, and never below this floor (nothing lies below it either)."""
        raised = read_below.lowered(left)
        return TimerFloor(
            _higher(self.event_time, raised.event_time), _higher(self.wall_time, raised.wall_time)
        )

    def lowered(self, timers: Iterable[Timer]) -> TimerFloor:
        """This floor once ``timers`` are set: at most each one's timestamp."""
        event_time, wall_time = self.event_time, self.wall_time
        for timer in timers:
            if timer.domain is TimeDomain.EVENT_TIME:
                if event_time is not None:
                    event_time = min(event_time, timer.timestamp)
            elif wall_time is not None:
                wall_time = min(wall_time, timer.timestamp)
        return TimerFloor(event_time, wall_time)


def _higher(known: int | None, learned: int | None) -> int | None:
    if known is None or learned is None:
        return learned if known is None else known
    return max(known, learned)


NO_FLOOR: Final = TimerFloor()
"""The floor of a caller that knows nothing of the timer index: reads start at its beginning."""


class IntervalStore(LayoutStore):
    """Per-interval persistent state, written only under the interval's sequencer, and each
    computation's :class:`~millstream.engine.layout.IntervalLayout`.

    Reads may be served to a stale lease (they are not fenced); every write is conditional on
    ``sequencer == lease.token`` and raises :class:`~millstream.engine.errors.FencedError`,
    without applying anything, once another worker has acquired the interval. A ``FencedError``
    means: this worker no longer owns the interval, its soft state for it is void, and it must
    stop and leave its inputs unacknowledged for the new owner.
    """

    @abstractmethod
    def acquire(self, computation: str, interval: int, previous: Lease | None = None) -> Lease:
        """Move the interval's sequencer forward and return the new lease.

        The write is linearizable: afterwards no write under an earlier token can apply, and
        any such write that was in flight has either applied before it or never will.
        ``previous`` is the caller's lease from its last batch on this interval, if any; the
        new lease's ``cache_valid`` is true exactly when the sequencer still held
        ``previous.token``, i.e. nobody else acquired the interval since.
        """

    @abstractmethod
    def holds(self, lease: Lease) -> bool:
        """Whether ``lease`` is still the interval's latest, by a read that is cheap rather
        than linearizable (no consensus round, no write): how an owner that keeps its lease
        across batches learns that someone else took the interval over meanwhile.

        A stale ``True`` (another worker's acquire in flight, or not yet visible) costs
        nothing but a failed batch: every write under ``lease`` is conditional on it and fails
        with :class:`~millstream.engine.errors.FencedError`. ``False`` for a retired interval.
        """

    @abstractmethod
    def dedup_ids(self, lease: Lease, limit: int) -> list[bytes] | None:
        """Every unexpired dedup ID of the interval, of any key, or ``None`` if it holds more
        than ``limit`` (read no further). What a worker that takes the interval over loads
        into its Bloom filter (:class:`~millstream.engine.dedup.IdFilter`)."""

    def state_keys(self, lease: Lease, limit: int) -> Set[str] | None:
        """Every key of the interval with state or timers, or ``None`` if it holds more than
        ``limit`` (read no further) or the backend cannot list them cheaply. What a worker
        that takes the interval over loads once, so that its batches read no key the interval
        does not hold: a key new to it has nothing to read. This default knows nothing
        (``None``): every uncached key is read."""
        return None

    @abstractmethod
    def read_keys(self, lease: Lease, keys: Collection[str]) -> dict[str, KeySnapshot]:
        """The committed state and timers of each of ``keys`` (a key with neither maps to an
        empty :class:`KeySnapshot`), read in bulk: a few concurrent round trips per call,
        never one per key."""

    @abstractmethod
    def seen(
        self, lease: Lease, record_ids: Mapping[str, Collection[bytes]]
    ) -> Set[tuple[str, bytes]]:
        """The ``(key, record ID)`` pairs among ``record_ids`` (IDs by key) committed as dedup
        IDs of that key and not expired; one bulk read for all keys."""

    def read_batch(
        self, lease: Lease, keys: Collection[str], record_ids: Mapping[str, Collection[bytes]]
    ) -> tuple[dict[str, KeySnapshot], Set[tuple[str, bytes]]]:
        """What a batch reads before its user code: :meth:`read_keys` of ``keys`` and
        :meth:`seen` of ``record_ids`` (either skipped when empty). A store that can overlaps
        the two reads' round trips; this default makes one after the other."""
        snapshots = self.read_keys(lease, keys) if keys else {}
        return snapshots, self.seen(lease, record_ids) if record_ids else frozenset()

    @abstractmethod
    def due_timers(
        self, lease: Lease, input_low_watermark: int, now: int, floor: TimerFloor = NO_FLOOR
    ) -> list[Timer]:
        """The timers due under ``input_low_watermark`` and ``now`` (see
        :meth:`~millstream.engine.timers.Timer.is_due`), in timestamp order, read as a range of
        the time-ordered index from ``floor`` on: the cost grows with the due timers only.

        An entry may be stale (its timer since replaced or deleted by a commit that did not
        name it in :attr:`~millstream.engine.state.KeyChanges.previous_timers`): callers
        compare it with the key's timers from :meth:`read_keys` and drop it by naming it in
        ``previous_timers`` of the key's next commit.
        """

    @abstractmethod
    def next_timers(self, lease: Lease, floor: TimerFloor = NO_FLOOR) -> NextTimers:
        """The earliest timer of each domain at or above ``floor`` (possibly a stale index
        entry, which only makes it earlier: safe for a low watermark)."""

    @abstractmethod
    def pending_productions(self, lease: Lease) -> tuple[Production, ...]:
        """The committed productions not yet deleted as acknowledged, for a worker that takes
        the interval over to resend (it may include acknowledged ones that share a stored row
        with unacknowledged ones; resending them is harmless)."""

    @abstractmethod
    def scan(self, lease: Lease) -> IntervalSnapshot:
        """All timers, pending productions and unexpired dedup IDs of the interval.

        Reads the whole interval: for tests and tools, never on a batch's path.
        """

    def read_state(self, lease: Lease, key: str) -> bytes | None:
        """The committed state of ``key``, or ``None`` if it has none."""
        return self.read_keys(lease, [key])[key].state

    def has_seen(self, lease: Lease, key: str, record_ids: Collection[bytes]) -> Set[bytes]:
        """The IDs among ``record_ids`` committed as dedup IDs of ``key`` and not expired."""
        return {record_id for _, record_id in self.seen(lease, {key: record_ids})}

    @abstractmethod
    def commit(
        self,
        lease: Lease,
        changes: Sequence[KeyChanges],
        *,
        dedup_ttl: int,
        delivered: Collection[bytes] = (),
        timer_floor: TimerFloor | None = None,
    ) -> None:
        """Apply the changes of several keys, conditionally on the lease.

        Each key appears at most once in ``changes`` and its changes are applied atomically:
        all of them or none, never split across writes. Keys are grouped into as few
        conditional batches as the backend's batch size limit allows; a key larger than the
        limit goes alone. Batches apply in order, so when a call fails, a prefix of the keys
        is committed. Dedup IDs expire ``dedup_ttl`` µs after the commit.

        Raises :class:`~millstream.engine.errors.FencedError` if the sequencer moved (the
        failing batch and all after it did not apply) and
        :class:`~millstream.engine.errors.UnknownOutcomeError` if a batch timed out. After an
        unknown outcome the caller must not assume either result: it calls
        :meth:`was_applied` with the error's ``marker``, then commits again the keys that did
        not apply (``uncertain_keys`` if it returned false, plus ``unattempted_keys``).
        Re-committing applied changes would also be harmless (every write is an idempotent
        put or delete), but resolving first keeps soft state exact.

        ``delivered``: IDs of pending productions the sink acknowledged since they were
        committed. The production rows they complete (see :meth:`delete_productions`) are
        deleted in the commit's own conditional write where it has room (paper 6.1.1: the
        acknowledged productions are cleaned up lazily, in a later commit), else by a write
        of their own, as without ``changes``. A delete that did not apply (a fence, an unknown
        outcome) leaves rows a later owner finds pending and resolves as any others.

        ``timer_floor``: the caller's :class:`TimerFloor` of the interval's timer index once
        this commit applies. The store keeps it with the commit (lowered to every timer the
        commit sets) for :meth:`kept_timer_floor`; a commit without one that sets a timer
        leaves no floor kept, and one that sets none leaves the kept floor as it was (deleting
        a timer never makes a floor wrong). A commit split in several writes keeps the floor
        with its last; the ones before that set timers leave none kept.
        """

    def kept_timer_floor(self, lease: Lease) -> TimerFloor:
        """The timer floor the interval's latest commit kept (:meth:`commit`), or
        :data:`NO_FLOOR`: where the index reads of an owner that knows nothing of the
        interval (a worker taking it over) start, past the entries of every timer fired before,
        which a read from the start would pass over (on Cassandra, tombstones for ten days,
        enough to fail the read). This default keeps nothing."""
        return NO_FLOOR

    @abstractmethod
    def was_applied(self, lease: Lease, marker: bytes) -> bool:
        """Whether the write identified by ``marker``, the lease's latest, applied.

        Linearizable, and final: once this returns false the write can never apply later (a
        backend makes sure of it, e.g. by moving the marker chain on). Call it before any
        other write with the lease. Raises ``FencedError`` if the lease is stale, since the
        outcome then no longer matters to the caller: the new owner rescans whatever landed.
        """

    @abstractmethod
    def delete_productions(self, lease: Lease, record_ids: Collection[bytes]) -> None:
        """Delete pending productions the sink acknowledged (conditional, like a commit)."""

    @abstractmethod
    def export(self, computation: str, interval: int) -> list[KeyChanges]:
        """Everything the interval holds, as change sets that recreate it: per key its state,
        timers and unexpired dedup IDs; the pending productions under the key ``""``.
        Committed to other intervals (by each key's new interval), they move the keys whole
        (:mod:`millstream.engine.rebalance`). Reads the whole interval; never on a batch's path.
        Exported once retired, an interval's rows are final: nothing can write them any more.
        """

    @abstractmethod
    def retire(self, lease: Lease) -> None:
        """Retire the interval for good, conditionally on the lease (``FencedError`` if
        someone acquired it since): no one can acquire it again
        (:class:`~millstream.engine.errors.RetiredIntervalError`), so no write of a worker
        that still thinks it owns it can land. Its rows stay, frozen, for :meth:`export`,
        until :meth:`purge`."""

    @abstractmethod
    def purge(self, computation: str, interval: int) -> None:
        """Delete the rows of a retired interval (its keys copied elsewhere); ``FencedError``
        if the interval is not retired. Deleting them again is harmless."""


def split_batches(changes: Sequence[KeyChanges], max_batch_bytes: int) -> list[list[KeyChanges]]:
    """Group consecutive keys into batches of at most ``max_batch_bytes`` (approximately).

    A key is never split; one larger than the limit forms a batch alone.
    """
    batches: list[list[KeyChanges]] = []
    size = 0
    for change in changes:
        change_size = change.approximate_size()
        if not batches or size + change_size > max_batch_bytes:
            batches.append([])
            size = 0
        batches[-1].append(change)
        size += change_size
    return batches


def kept_floors(
    batches: Sequence[Sequence[KeyChanges]], timer_floor: TimerFloor | None
) -> list[TimerFloor | None]:
    """The timer floor each of a commit's ``batches`` keeps, as :meth:`IntervalStore.commit`
    says (``None``: the floor kept stays as it was): one true after every batch, should the
    next never apply. ``timer_floor`` is the caller's floor once all of them applied."""
    sets = [[t for c in batch for t in c.timers.values() if t is not None] for batch in batches]
    kept: list[TimerFloor | None] = [NO_FLOOR if timers else None for timers in sets]
    if kept and timer_floor is not None:
        kept[-1] = timer_floor.lowered(t for timers in sets for t in timers)
    return kept
