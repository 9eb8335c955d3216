"""The per-key protocol: exactly-once processing of one key interval (paper 6.1, 6.2).

An :class:`IntervalWorker` owns the work of one computation on one key interval and handles
one batch of input at a time (a Spark micro-batch's share of the interval):

1. **Acquire** the interval's sequencer. If nobody else acquired it since this worker's last
   batch, its soft state (the cached state and timers of keys, the pending productions) is
   still exact; otherwise it drops the cache and reads the pending productions back.
   A worker with strong productions keeps its lease from one batch to the next instead
   (MillWheel's long-lived owners) as long as a cheap read of the sequencer says it still
   holds it (:meth:`~millstream.engine.store.IntervalStore.holds`): every write of the batch
   is conditional on the lease anyway, so a stale answer costs a fenced batch, never a wrong
   write. A fenced batch is never retried here: a zombie must stay fenced. Weak productions
   leave before the commit, so a worker with them acquires every batch: a batch must not send
   what a stale view made.
2. **Resend** committed productions not yet acknowledged (its own, or a previous owner's).
3. **Read what the batch touches, in bulk** (the cost grows with the batch, not with the
   interval): the due timers (a range of the store's time-ordered index), the state and
   timers of the batch's keys missing from the cache, and (exactly-once computations) which
   of the batch's record IDs the store holds as dedup IDs, but for those the worker's Bloom
   filter of the interval's IDs proves fresh (:mod:`millstream.engine.dedup`).
4. For each key, in key order, with its records in delivery order:

   * drop duplicates: repeats within the batch, and IDs the store holds for the key;
   * run ``process_record`` (``process_deletion`` for a deletion), collecting its state,
     timer and production changes; a call that raises contributes nothing but a dead letter;
   * fire the key's due timers in timestamp order (event time against the input low
     watermark, wall time against the injected clock), each a call like a record's.

5. **Weak productions** only: send them and wait ``weak_production_delay``; checkpoint the
   stragglers. A large batch starts sending them while its later keys still run (every
   :data:`~millstream.engine.weak_productions.WEAK_SEND_CHUNK` of them, on a thread of the
   batch's, :mod:`millstream.engine.weak_productions`), so that this step waits only for the
   last ones' acknowledgements, and downstream gets them as they are made.
6. **Commit** every key's changes with the dedup IDs of its records, conditionally on the
   sequencer; one key's changes never split. An unknown outcome is resolved by reading the
   commit marker back before committing again what did not apply.
7. **Send** the checkpointed productions and delete those the sink acknowledged.

With transactional productions (``ComputationOptions.transactional_productions``) steps 2 and
7 go through a :class:`~millstream.engine.productions.TransactionalSink`: the commit of step 6
tags its productions with the lease token; the interval's pending productions leave in one
transaction whose marker is the highest tag it delivers; a worker whose view of the interval
is new (a takeover, a transaction whose outcome is unknown) first opens the interval's
producer, fencing every earlier one, and drops the pending productions the marker says were
delivered, without a resend. A plain ``read_committed`` reader then sees each once. A worker
whose view is resolved stages that transaction while step 6 runs (begun, productions and
marker sent, not committed: nobody reads it yet) and step 7 commits it, or aborts it if the
commit failed; so does a takeover whose background open finished in time with nothing
pending, which takes the open before step 6 (its commit is then the lease check after it).
A transaction counts as delivered only once its marker reads back as committed (settled):
Kafka may answer a commit it then never completes.

If anything fails (a fenced write, a crash, an unresolved outcome) the exception propagates
and the worker forgets its soft state; the batch's inputs must not be acknowledged, so they
come again and, being duplicates of whatever was committed, are harmless.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import time
from collections.abc import Callable, Iterable, Sequence, Set
from concurrent.futures import Future
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

from millstream.engine.cache import StateCache
from millstream.engine.calls import KeyRun
from millstream.engine.clock import Clock
from millstream.engine.deadletters import DeadLetter, Origin
from millstream.engine.dedup import IdFilter, first_occurrences, unseen
from millstream.engine.errors import UnknownOutcomeError
from millstream.engine.layout import IntervalLayout
from millstream.engine.outages import first_line, is_outage
from millstream.engine.pause_points import pause_point
from millstream.engine.productions import (
    CommitTag,
    DeliveryOutcome,
    Production,
    ProductionSink,
    StagedTransaction,
    TransactionalSink,
    TransactionUnavailableError,
    delivered_by,
)
from millstream.engine.records import Deletion, Record, clamp_event_time
from millstream.engine.sequencer import Lease
from millstream.engine.slots import slot_constructor
from millstream.engine.state import UNCHANGED, KeyChanges, effective_timers
from millstream.engine.store import NO_FLOOR, IntervalStore, KeySnapshot, NextTimers, TimerFloor
from millstream.engine.timers import (
    TimeDomain,
    Timer,
    due_bound,
    is_due_at,
)
from millstream.engine.topology import ComputationSpec
from millstream.engine.watermarks import IntervalProgress
from millstream.engine.weak_productions import WEAK_SEND_CHUNK, WeakSends

__all__ = [
    "STEPS",
    "WEAK_SEND_CHUNK",
    "BatchResult",
    "Delivery",
    "IntervalWorker",
    "Rejected",
    "StepClock",
    "StepTime",
    "make_delivery",
    "thread_step_clock",
]

_log = logging.getLogger(__name__)

# After this many unknown outcomes in a row the batch fails; the store is too unhealthy to wait.
_MAX_COMMIT_ATTEMPTS = 5
# The Bloom filter of an interval's dedup IDs (engine.dedup): loaded by a worker that takes
# the interval over unless it holds more IDs than this (then every ID is looked up, and on
# Cassandra a lookup reads all of its key's dedup rows), and sized for this many more than
# it loaded. Loading stalls the takeover's batch: on Cassandra, on 2 cores, about 0.6 s per
# 100,000 dedup rows (a key's IDs of one commit are one row): 0.4 s for a million IDs
# committed 20 a key, 6 s if each was its key's only one.
_FILTER_MOST_IDS = 1_000_000
_FILTER_HEADROOM = 50_000

# The most keys a worker that takes an interval over lists (IntervalStore.state_keys), so that
# its batches read none the interval does not hold; an interval with more has its uncached
# keys read, new ones too. On Cassandra, listing them takes at most three pages of rows.
_KNOWN_KEYS_MOST = 10_000

STEPS: Final = (
    "lease",
    "resend",
    "reads",
    "user_code",
    "weak_sends",
    "staging",
    "commit",
    "delivery",
    "finish",
)
"""The steps of a batch on an interval, in order (:attr:`BatchResult.steps`): acquiring or
keeping the lease, sending what an earlier batch left pending, reading the keys' state and
dedup IDs, running user code, sending weak productions, staging the Kafka transaction,
committing to the store, delivering the productions, and bookkeeping."""

StepClock = Callable[[], tuple[float, float]]
"""Seconds elapsed and CPU seconds of the calling thread, each from any fixed origin: what a
worker times its steps with."""


def thread_step_clock() -> tuple[float, float]:
    """The default :data:`StepClock`: ``time.perf_counter()`` and ``time.thread_time()``."""
    return time.perf_counter(), time.thread_time()


@dataclass(frozen=True, slots=True)
class StepTime:
    """How long one step of a batch took, and how much of it the worker's thread ran (the
    rest it waited: on the store, on Kafka, on another thread holding the interpreter, or
    for a core)."""

    seconds: float
    cpu_seconds: float

    def __add__(self, other: StepTime) -> StepTime:
        return StepTime(self.seconds + other.seconds, self.cpu_seconds + other.cpu_seconds)


@dataclass(frozen=True, slots=True)
class Delivery:
    """An input record for the interval, under the key the consumer's extractor gave it; or
    a :class:`~millstream.engine.records.Deletion` (a tombstone the computation takes),
    under the deletion's key."""

    key: str
    record: Record | Deletion
    origin: Origin = field(default_factory=Origin)


make_delivery: Callable[[str, Record | Deletion, Origin], Delivery] = slot_constructor(Delivery)
"""``make_delivery(key, record, origin)``: ``Delivery(key, record, origin)`` at about half the
cost (:mod:`~millstream.engine.slots`), for a router, which makes one for every message."""


@dataclass(frozen=True, slots=True)
class Rejected:
    """Input that could not be decoded; it becomes a dead letter.

    ``origin`` must locate it (stream, partition, offset), since that is its only identity;
    ``timestamp`` is the best event time known for it, e.g. the Kafka message timestamp.
    """

    origin: Origin
    raw: bytes
    error: Exception
    timestamp: int


_Input = TypeVar("_Input", Delivery, Rejected)


@dataclass
class BatchResult:
    """What a committed batch did: records ``processed`` (duplicates and late ones counted
    apart), timers fired, dead letters, keys committed, productions the sink acknowledged
    (resends included) and those still ``pending`` after it, and what the interval has left to
    do (``progress``, for watermarks and for running it without input).

    ``resent`` counts checkpointed productions sent again as the batch began (left
    unacknowledged by this worker or by a previous owner of the interval), and
    ``unknown_outcomes`` the commits whose outcome was unknown, since the worker's last
    finished batch (read back, or settled by this batch's takeover of the interval).
    ``expired``: keys whose state expired (``ComputationOptions.state_ttl``).
    ``unlooked``: record IDs the interval's Bloom filter proved fresh, so not looked up.

    Transactional productions: ``transactions`` committed; ``transaction_failures``
    transactions aborted or of unknown outcome, and opens the coordinator did not answer in
    time (the productions stay pending); ``fenced_producers`` transactions refused because
    another producer of the interval was opened since (this worker was a zombie);
    ``marker_resolved`` pending productions an open found delivered by the marker, dropped
    without a resend; ``aborted_commits`` earlier owners' commits an open found undelivered
    (their transaction aborted by the open or by its timeout, or never begun: while open, it
    held ``read_committed`` readers back), sent again; ``unsettled_commits`` commits the sink
    answered whose marker did not then read as committed (counted as failures too: their
    productions stay pending until an open resolves them)."""

    lease: Lease
    rescanned: bool
    processed: int = 0
    duplicates: int = 0
    late: int = 0
    fired_timers: list[Timer] = field(default_factory=list)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    committed_keys: int = 0
    acknowledged: int = 0
    pending: int = 0
    resent: int = 0
    unknown_outcomes: int = 0
    expired: int = 0
    unlooked: int = 0
    transactions: int = 0
    transaction_failures: int = 0
    fenced_producers: int = 0
    marker_resolved: int = 0
    aborted_commits: int = 0
    unsettled_commits: int = 0
    # Attempts this batch's acquire lost to another writer (or could not tell).
    sequencer_conflicts: int = 0
    progress: IntervalProgress = field(default_factory=IntervalProgress)
    # Each of STEPS the batch went through, timed by the worker's step clock.
    steps: dict[str, StepTime] = field(default_factory=dict)


@dataclass
class _SoftState:
    lease: Lease
    scope: int  # of the worker's entries in the state cache
    pending: dict[bytes, Production]
    next_timers: NextTimers | None = None  # None: read it after the next commit
    # Where the interval's timer index has its first entries, as far as this view knows
    # (reads of the index start there, past the fired timers' tombstones).
    timer_floor: TimerFloor = NO_FLOOR
    # Transactional productions: whether the interval's producer must be opened (and the
    # pending productions resolved by its marker) before the next delivery, and the marker
    # the last committed transaction recorded.
    unresolved: bool = True
    marker: CommitTag | None = None
    commits: int = 0  # under this lease: numbers its commits' tags
    # Exactly-once: the interval's dedup IDs, loaded as the worker took it over (None: not
    # yet, or "too many" when ``unfiltered``), then every commit's.
    ids: IdFilter | None = None
    unfiltered: bool = False
    # Every key the interval holds state or timers of (listed as the worker took it over,
    # then every commit's keys; None: not yet, or "too many" when ``unlisted``): a key not
    # in it has nothing to read.
    keys: set[str] | None = None
    unlisted: bool = False
    # Transactional productions delivered whose rows the next commit deletes (paper 6.1.1:
    # cleaned up lazily, not by a write of their own).
    delivered: list[bytes] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class _Staging:
    """A transaction staged while the store commit that checkpoints its productions runs."""

    transaction: StagedTransaction
    productions: list[Production]
    marker: CommitTag


@dataclass(frozen=True, slots=True)
class _Batch:
    """What one batch touches (step 3): its keys in order, the fresh records of each, the fresh
    rejected input, the due timers, and the committed state and timers of the keys."""

    keys: list[str]
    records: dict[str, list[Delivery]]
    rejected: list[Rejected]
    due: list[Timer]
    committed: dict[str, KeySnapshot]
    # Where the due timers' read ended (it took every entry of the index from the soft
    # state's floor up to there); None: not read, none could be due.
    due_read_below: TimerFloor | None = None


class IntervalWorker:
    """Runs one computation's per-key protocol on one key interval, batch by batch.

    A worker is single-threaded. Several workers may be pointed at one interval (retries,
    speculation, failover); the sequencer makes sure only the latest one commits. ``cache``
    keeps the committed state and timers of keys between batches (soft state) within its
    byte budget; the workers of one process share one (default: one of its own).
    ``user_code`` is held while the batch's user code runs: workers of one process running on
    several threads share a lock there, so a computation is called by one thread at a time
    while their reads, commits and sends overlap. ``layout`` is the computation's current
    :class:`~millstream.engine.layout.IntervalLayout` once its intervals split or merged
    (default: the ``key_intervals`` it started with). ``transactions`` delivers the
    productions of a computation whose options make them transactional; without it they go
    to ``sink`` like any other.
    """

    def __init__(
        self,
        spec: ComputationSpec,
        interval: int,
        *,
        store: IntervalStore,
        sink: ProductionSink,
        clock: Clock,
        cache: StateCache | None = None,
        user_code: AbstractContextManager[Any] | None = None,
        layout: IntervalLayout | None = None,
        transactions: TransactionalSink | None = None,
        step_clock: StepClock = thread_step_clock,
    ) -> None:
        self.layout = layout or IntervalLayout.initial(spec.options.starting_intervals())
        if interval not in self.layout.ids:
            raise ValueError(
                f"interval {interval} is outside the intervals {list(self.layout.ids)} "
                f"of computation {spec.name!r}"
            )
        self.spec = spec
        self.interval = interval
        self._store = store
        self._sink = sink
        self._transactions = transactions if spec.options.transactional else None
        self._clock = clock
        self._step_clock = step_clock
        self._cache = cache if cache is not None else StateCache()
        self._user_code = user_code if user_code is not None else nullcontext()
        self._soft: _SoftState | None = None
        # Transactional productions: the tag of the commit that will checkpoint this batch's
        # productions, which they carry from the start (None: not transactional).
        self._batch_tag: CommitTag | None = None
        # Unknown commit outcomes met since the last batch that finished: a batch that failed
        # on one (its resolution failing too, the store down) reports it once a later batch,
        # which resolves it by taking the interval over, has committed.
        self._unknown_outcomes = 0
        # What a take() ahead of the batch found as it took the interval, which the next
        # batch reports as its own (it kept the lease the take acquired).
        self._taken: BatchResult | None = None

    def process(
        self,
        inputs: Iterable[Delivery | Rejected],
        input_low_watermark: int,
        *,
        timer_watermark: int | None = None,
        held: Future[bool] | None = None,
    ) -> BatchResult:
        """Process one batch; returns only once everything in it is committed.

        Records see ``input_low_watermark``, the watermark before this batch's input was
        consumed (a record older than it is late). Event-time timers fire against
        ``timer_watermark`` when given: the watermark once this batch's input is consumed,
        which may be higher, since a key's timers fire only after its records of the batch.
        ``held``: the answer of :meth:`lease_check`'s read, made ahead of this batch, which
        step 1 then takes instead of reading.
        """
        timers = input_low_watermark if timer_watermark is None else timer_watermark
        try:
            return self._process(
                list(inputs), input_low_watermark, max(timers, input_low_watermark), held
            )
        except BaseException:
            # The store may now differ from the soft state (a fenced or uncertain write, a
            # crash between steps); only a rescan can tell what it holds.
            self._soft = None
            raise

    def take(self) -> None:
        """Step 1 of the next batch, and the reads its view of the interval makes once, ahead
        of that batch: acquire the sequencer (or keep the lease this worker still holds),
        read back the pending productions, list the keys the interval holds, load its dedup
        IDs' Bloom filter (exactly-once) and its earliest timers, and begin opening its
        transactional producer.
        For a worker with strong productions only (one with weak ones acquires every batch),
        which keeps the lease to its next batch as it would from one batch to the next: that
        batch then finds it held, with the soft state it makes. A query's start takes the
        intervals of its first batch so (:class:`millstream.spark.executor.WarmTask`)."""
        if not self.spec.options.strong_productions:
            raise ValueError(
                f"computation {self.spec.name!r} has weak productions: a worker of it "
                "acquires the interval at every batch, so taking it ahead does nothing"
            )
        try:
            soft, result = self._begin()
            self._prepare_producer(soft)
            self._held_keys(soft)
            if self.spec.options.exactly_once:
                self._id_filter(soft)
            self._next_timers(soft)  # then the batch reads due timers only if some are
        except BaseException:
            self._soft = None
            self._taken = None
            raise
        if result.rescanned:
            self._taken = result

    def _process(
        self,
        inputs: list[Delivery | Rejected],
        watermark: int,
        timer_watermark: int,
        held: Future[bool] | None = None,
    ) -> BatchResult:
        steps = _Steps(self._step_clock)
        now = self._clock.now()
        soft, result = self._begin(held)
        if self._transactions is not None:
            # Known before the calls, so that a production is made tagged, not copied to
            # tag it after them (see _tag).
            self._batch_tag = CommitTag(soft.lease.token, soft.commits + 1)
        if inputs:
            self._prepare_producer(soft)
        steps.end("lease")
        self._resend(soft, result)
        steps.end("resend")
        batch = self._gather(soft, inputs, timer_watermark, now, result)
        steps.end("reads")
        weak = WeakSends(self._sink, self.spec.options.weak_production_delay)
        try:
            changes = self._run_keys(batch, (watermark, timer_watermark), now, result, weak)
        except BaseException:
            weak.abandon()
            raise
        steps.end("user_code")
        self._flush_weak(weak, result)
        steps.end("weak_sends")
        to_commit = self._tag(soft, changes)
        staging = self._stage(soft, to_commit)
        steps.end("staging")
        try:
            committed = self._commit(soft, to_commit, batch, result)
        except BaseException:
            if staging is not None:
                staging.transaction.abort()
            raise
        steps.end("commit")
        self._send(soft, committed, result, staging)
        steps.end("delivery")
        finished = self._finish(soft, result)
        steps.end("finish")
        finished.steps = steps.times
        return finished

    def _prepare_producer(self, soft: _SoftState) -> None:
        """Begin opening the interval's transactional producer for this view's lease if the
        view is unresolved (a takeover): the open (a few round trips, more while librdkafka
        finds the coordinator) then overlaps the batch's reads, user code and commit."""
        if self._transactions is not None and soft.unresolved:
            self._transactions.prepare(
                self.spec.name, self.interval, self.spec.options.send_timeout, soft.lease.token
            )

    def lease_check(self) -> Callable[[], bool] | None:
        """The read that tells whether this worker still holds the lease it keeps, to run
        ahead of its next batch on another thread (while the batch's input is read) and hand
        to :meth:`process` as ``held``; None if that batch acquires anyway (no lease kept, or
        weak productions). A stale answer costs what a stale read at the batch's start
        would: a fenced batch, never a wrong write."""
        soft = self._soft
        if soft is None or not self.spec.options.strong_productions:
            return None
        lease, store = soft.lease, self._store
        return lambda: store.holds(lease)

    def _begin(self, held: Future[bool] | None = None) -> tuple[_SoftState, BatchResult]:
        """Step 1: acquire the sequencer, unless this worker keeps the lease it still holds
        (see the module docstring; ``held``: that read, made ahead); keep the soft state if
        it is still exact, else start it again from the pending productions the store
        holds."""
        store = self._store
        soft = self._soft
        taken, self._taken = self._taken, None
        if (
            soft is not None
            and self.spec.options.strong_productions
            and (held.result() if held is not None else store.holds(soft.lease))
        ):
            if taken is not None:  # acquired by take(): that is this batch's acquire
                taken.resent = len(soft.pending)
                return soft, taken
            return soft, BatchResult(lease=soft.lease, rescanned=False, resent=len(soft.pending))
        previous = soft.lease if soft is not None else None
        lease = store.acquire(self.spec.name, self.interval, previous)
        rescan = soft is None or not lease.cache_valid
        if soft is None or rescan:
            pending = store.pending_productions(lease)
            soft = _SoftState(lease, self._cache.new_scope(), {p.record_id: p for p in pending})
            # Where the last owner's reads of the timer index started, as its last commit
            # kept it: a read from the start passes over every timer fired before.
            soft.timer_floor = store.kept_timer_floor(lease)
        else:
            soft.lease = lease
        self._soft = soft
        return soft, BatchResult(
            lease=lease,
            rescanned=rescan,
            resent=len(soft.pending),
            sequencer_conflicts=lease.conflicts,
        )

    def _resend(self, soft: _SoftState, result: BatchResult) -> None:
        """Step 2: send the committed productions not yet acknowledged."""
        if self._transactions is not None:
            if soft.pending:
                self._deliver(soft, result, resending=True)
            return
        self._send_productions(soft, list(soft.pending.values()), result)

    def _gather(
        self,
        soft: _SoftState,
        inputs: list[Delivery | Rejected],
        timer_watermark: int,
        now: int,
        result: BatchResult,
    ) -> _Batch:
        """Step 3: read what the batch touches, in bulk, and drop the duplicates it holds."""
        records: dict[str, list[Delivery]] = {}
        rejected: list[Rejected] = []
        for item in inputs:
            if isinstance(item, Rejected):
                rejected.append(item)
            else:
                records.setdefault(item.key, []).append(item)
        for key in records:  # once a key, not once a record
            self._check_interval(key)
        due, due_read_below = self._due_timers(soft, timer_watermark, now)
        keys = sorted(records.keys() | {timer.key for timer in due})
        committed, missing = self._cached(soft, keys)
        exactly_once = self.spec.options.exactly_once
        firsts, rejects, candidates = _dedup_candidates(records, rejected, exactly_once)
        if candidates and (ids := self._id_filter(soft)) is not None:
            candidates, result.unlooked = _maybe_seen(ids, candidates)
        seen: Set[tuple[str, bytes]] = frozenset()
        if missing or candidates:
            # One round trip for the keys the cache lacks and the dedup lookups.
            read, seen = self._store.read_batch(soft.lease, missing, candidates)
            committed.update(read)
        if exactly_once:
            records = unseen(firsts, seen)
            rejected = [r for items in unseen(rejects, seen).values() for r in items]
        result.duplicates += len(inputs) - len(rejected)
        result.duplicates -= sum(len(deliveries) for deliveries in records.values())
        return _Batch(keys, records, rejected, due, committed, due_read_below)

    def _run_keys(
        self,
        batch: _Batch,
        watermarks: tuple[int, int],
        now: int,
        result: BatchResult,
        weak: WeakSends,
    ) -> dict[str, KeyChanges]:
        """Step 4: the rejected input's dead letters, then each key's records and due timers,
        in key order; returns every key's changes. The weak productions go to ``weak``, which
        starts sending them once they make a chunk."""
        changes: dict[str, KeyChanges] = {}
        for item in batch.rejected:
            self._reject(item, changes, result)
        stale = _stale_index_entries(batch.due, batch.committed)
        spec, clock, tag = self.spec, self._clock, self._batch_tag
        with self._user_code:
            for key in batch.keys:
                key_changes = changes.setdefault(key, KeyChanges(key))
                key_changes.previous_timers.extend(stale.get(key, ()))
                committed = batch.committed[key]
                KeyRun(
                    spec,
                    clock,
                    tag,
                    committed,
                    key_changes,
                    watermarks,
                    now,
                    result,
                    weak.outbox,
                ).run(batch.records.get(key, []))
                if key_changes.timers:
                    # The store rewrites the key's timers whole, from this.
                    key_changes.timers_after = effective_timers(committed.timers, key_changes)
                weak.key_done()
        return changes

    def _flush_weak(self, weak: WeakSends, result: BatchResult) -> None:
        """Step 5: send the weak productions not sent yet, waiting ``weak_production_delay``;
        those not acknowledged by then join their key's changes, to be checkpointed."""
        if weak.outbox:
            acked = weak.finish()
            for key_changes, production in weak.outbox:
                if production.record_id in acked:
                    result.acknowledged += 1
                else:
                    key_changes.productions.append(production)

    def _tag(self, soft: _SoftState, changes: dict[str, KeyChanges]) -> list[KeyChanges]:
        """The keys that changed, their productions tagged with this commit's tag
        (transactional productions)."""
        to_commit = [c for c in changes.values() if not c.is_empty()]
        if self._transactions is not None:
            # A kept lease commits once per batch: its tags order by their number.
            soft.commits += 1
            tag = self._batch_tag  # set as the batch began: the object its productions carry
            assert tag == CommitTag(soft.lease.token, soft.commits)
            for change in to_commit:
                # Only the productions the calls did not make (late records, dead letters,
                # weak stragglers) are copied: this would otherwise run for every one.
                if any(p.tag is not tag for p in change.productions):
                    change.productions = [
                        p if p.tag is tag else Production(p.stream, p.record, p.encoded, tag)
                        for p in change.productions
                    ]
        return to_commit

    def _stage(self, soft: _SoftState, to_commit: list[KeyChanges]) -> _Staging | None:
        """Stage the transaction that will deliver the interval's pending productions and
        those of this commit, so that its round trips (beginning it, sending them, adding
        the marker) overlap the commit. Nobody reads it before step 7 commits it, which
        happens only once the store commit landed: a checkpoint still comes before the
        productions are visible (paper 6.1.1).

        A view still unresolved (a takeover) stages only if the open prepared as the batch
        began has finished, nothing is pending (so the marker has nothing to resolve) and
        the batch commits: it takes the open now, and the commit is then the conditional
        write after the open that fences a lease superseded before it (see
        :meth:`_deliver`). Otherwise it opens and delivers after its commit."""
        transactions = self._transactions
        if transactions is None:
            return None
        if soft.unresolved:
            name, token = self.spec.name, soft.lease.token
            if not to_commit or soft.pending or not transactions.ready(name, self.interval, token):
                return None
            try:
                soft.marker = transactions.open(
                    name, self.interval, self.spec.options.send_timeout, token
                )
            except TransactionUnavailableError:
                return None  # the delivery after the commit opens again, and counts it
            soft.unresolved = False
        productions = [*soft.pending.values(), *(p for c in to_commit for p in c.productions)]
        if not productions:
            return None
        marker = _marker(soft, productions)
        staged = transactions.stage(
            self.spec.name, self.interval, productions, marker, self.spec.options.send_timeout
        )
        return None if staged is None else _Staging(staged, productions, marker)

    def _commit(
        self,
        soft: _SoftState,
        to_commit: list[KeyChanges],
        batch: _Batch,
        result: BatchResult,
    ) -> list[KeyChanges]:
        """Step 6: commit the keys that changed, and bring the soft state up to the commit;
        returns the committed changes."""
        if to_commit:
            pause_point("executor.commit", self.spec.name)
        floor = soft.timer_floor
        if batch.due_read_below is not None:
            # The due timers this commit deletes leave no entry between the floor and the
            # read's end: the next reads start past their tombstones.
            deleted = {timer for change in to_commit for timer in change.previous_timers}
            left = [timer for timer in batch.due if timer not in deleted]
            floor = floor.raised(batch.due_read_below, left)
        # The floor once the commit applied, kept with it for the interval's next owner.
        floor = floor.lowered(t for c in to_commit for t in c.timers.values() if t is not None)
        self._commit_resolving(soft.lease, to_commit, soft.delivered, floor)
        soft.delivered = []
        result.unknown_outcomes, self._unknown_outcomes = self._unknown_outcomes, 0
        result.committed_keys = len(to_commit)
        soft.timer_floor = floor
        self._remember(soft, batch.committed, to_commit)
        return to_commit

    def _send(
        self,
        soft: _SoftState,
        committed: list[KeyChanges],
        result: BatchResult,
        staging: _Staging | None = None,
    ) -> None:
        """Step 7: send the productions just checkpointed (commit their staged transaction)."""
        checkpointed = [p for c in committed for p in c.productions]
        if checkpointed:
            pause_point("executor.send", self.spec.name)
        if self._transactions is not None:
            if soft.pending:
                self._deliver(soft, result, resending=False, staging=staging)
            elif staging is not None:  # its productions' commit did not keep them pending
                staging.transaction.abort()
            return
        self._send_productions(soft, checkpointed, result)

    def _finish(self, soft: _SoftState, result: BatchResult) -> BatchResult:
        """What the interval has left to do once the batch is committed."""
        result.pending = len(soft.pending)
        result.progress = _progress(soft, self._next_timers(soft))
        return result

    def _next_timers(self, soft: _SoftState) -> NextTimers:
        """The interval's earliest timers, read if the soft state does not know them."""
        if soft.next_timers is None:
            soft.next_timers = self._store.next_timers(soft.lease, soft.timer_floor)
            soft.timer_floor = TimerFloor.at(soft.next_timers)
        return soft.next_timers

    def _due_timers(
        self, soft: _SoftState, timer_watermark: int, now: int
    ) -> tuple[list[Timer], TimerFloor | None]:
        """The interval's due timers, read only when its earliest timers may be due: the soft
        state's are exact while it is valid (the acquire says nobody else wrote since it read
        them, and it reads them again after every commit that changed a timer). The read
        starts at the soft state's floor: below it are only the timers this view fired.
        Also where the read ended (None: not read)."""
        first = soft.next_timers
        if first is not None and not _any_due(first, timer_watermark, now):
            return [], None
        read_below = TimerFloor(
            event_time=due_bound(TimeDomain.EVENT_TIME, timer_watermark, now),
            wall_time=due_bound(TimeDomain.WALL_TIME, timer_watermark, now),
        )
        due = self._store.due_timers(soft.lease, timer_watermark, now, soft.timer_floor)
        return due, read_below

    def _id_filter(self, soft: _SoftState) -> IdFilter | None:
        """The soft state's Bloom filter of the interval's dedup IDs, loaded the first time a
        batch of this view of the interval asks; None if the interval holds too many."""
        if soft.ids is None and not soft.unfiltered:
            loaded = self._store.dedup_ids(soft.lease, _FILTER_MOST_IDS)
            if loaded is None:
                soft.unfiltered = True
                return None
            soft.ids = IdFilter(2 * len(loaded) + _FILTER_HEADROOM)
            soft.ids.add(loaded)
        return soft.ids

    def _cached(
        self, soft: _SoftState, keys: list[str]
    ) -> tuple[dict[str, KeySnapshot], list[str]]:
        """The committed state and timers of those of ``keys`` the cache holds or the interval
        does not (nothing), and the rest (read in bulk with the batch's dedup lookups)."""
        cache = self._cache
        committed: dict[str, KeySnapshot] = {}
        missing: list[str] = []
        for key in keys:
            snapshot = cache.get(soft.scope, key)
            if snapshot is None:
                missing.append(key)
            else:
                committed[key] = snapshot
        if not missing or (held := self._held_keys(soft)) is None:
            return committed, missing
        unread: list[str] = []
        for key in missing:
            if key in held:
                unread.append(key)
            else:
                committed[key] = KeySnapshot()  # nothing to read: new to the interval
        return committed, unread

    def _held_keys(self, soft: _SoftState) -> set[str] | None:
        """Every key the interval holds state or timers of, listed the first time a batch of
        this view of the interval asks; None if it holds too many."""
        if soft.keys is None and not soft.unlisted:
            listed = self._store.state_keys(soft.lease, _KNOWN_KEYS_MOST)
            if listed is None:
                soft.unlisted = True
                return None
            soft.keys = set(listed)
        return soft.keys

    def _check_interval(self, key: str) -> None:
        actual = self.layout.interval_of(key)
        if actual != self.interval:
            raise ValueError(
                f"key {key!r} belongs to interval {actual} of {self.spec.name!r}, not "
                f"{self.interval}; route deliveries by the computation's IntervalLayout"
            )

    def _reject(
        self, rejected: Rejected, changes: dict[str, KeyChanges], result: BatchResult
    ) -> None:
        dead_letter = DeadLetter.from_error(
            self.spec.name, rejected.origin, rejected.error, rejected.raw
        )
        key = rejected.origin.key or ""
        record = dead_letter.to_record(
            rejected.origin.cause_id(), clamp_event_time(rejected.timestamp)
        )
        key_changes = changes.setdefault(key, KeyChanges(key))
        key_changes.productions.append(Production(self.spec.dead_letter_stream, record))
        if self.spec.options.exactly_once:
            key_changes.dedup_ids.append(rejected.origin.cause_id())
        result.dead_letters.append(dead_letter)

    def _commit_resolving(
        self,
        lease: Lease,
        changes: list[KeyChanges],
        delivered: Sequence[bytes] = (),
        timer_floor: TimerFloor | None = None,
    ) -> None:
        """Commit ``changes`` and delete the rows of the ``delivered`` productions; an
        unknown outcome is read back, and what did not apply is committed again (a delete
        that did not apply leaves rows a later owner resolves). ``timer_floor``, the floor
        once all of them applied, is kept with the last write that applies them."""
        if not changes and delivered:
            self._store.delete_productions(lease, delivered)
        remaining = changes
        unknown = 0
        while remaining:
            try:
                self._store.commit(
                    lease,
                    remaining,
                    dedup_ttl=self.spec.options.dedup_ttl,
                    delivered=delivered,
                    timer_floor=timer_floor,
                )
            except UnknownOutcomeError as outcome:
                delivered = ()
                unknown += 1
                self._unknown_outcomes += 1
                # Said at once: an attempt that fails on it reports no count, and the next
                # one may run the interval in another process.
                _log.warning(
                    "computation %r interval %d: %s; reading it back",
                    self.spec.name,
                    self.interval,
                    outcome,
                )
                applied = self._resolve(lease, outcome)
                left = set(outcome.unattempted_keys)
                if not applied:
                    left.update(outcome.uncertain_keys)
                remaining = [c for c in remaining if c.key in left]
                if remaining and unknown >= _MAX_COMMIT_ATTEMPTS:
                    raise
            else:
                return

    def _resolve(self, lease: Lease, outcome: UnknownOutcomeError) -> bool:
        """Whether the uncertain commit of ``outcome`` applied. If the store cannot be asked
        (an outage), the commit's outcome stays unknown, and the error says so: the attempt
        fails as an outage and the interval's next takeover settles the commit."""
        try:
            return self._store.was_applied(lease, outcome.marker)
        except UnknownOutcomeError:
            raise
        except Exception as exc:
            if not is_outage(exc):
                raise
            raise UnknownOutcomeError(
                f"{outcome} (reading its outcome back failed: {first_line(exc)})",
                marker=outcome.marker,
                uncertain_keys=outcome.uncertain_keys,
                unattempted_keys=outcome.unattempted_keys,
            ) from exc

    def _remember(
        self, soft: _SoftState, before: dict[str, KeySnapshot], committed: list[KeyChanges]
    ) -> None:
        """Bring the soft state up to the commit: the keys' cache entries, the pending
        productions, and whether the interval's next timers must be read again."""
        after = dict(before)
        if soft.keys is not None:
            soft.keys.update(change.key for change in committed)
            if len(soft.keys) > _KNOWN_KEYS_MOST:
                soft.keys, soft.unlisted = None, True
        if soft.ids is not None:
            soft.ids.add([record_id for change in committed for record_id in change.dedup_ids])
            if soft.ids.full:
                soft.ids = None  # loaded again, twice the size, when next asked
        for change in committed:
            if change.timers or change.previous_timers:
                soft.next_timers = None  # the floor is lowered to its timers already
            known = before.get(change.key)
            if known is not None and (change.state is not UNCHANGED or change.timers):
                state = known.state if change.state is UNCHANGED else change.state
                timers = change.timers_after
                if timers is None:
                    timers = effective_timers(known.timers, change)
                after[change.key] = KeySnapshot(state, timers)
            for production in change.productions:
                soft.pending[production.record_id] = production
        for key, snapshot in after.items():
            self._cache.put(soft.scope, key, snapshot)

    def _deliver(
        self,
        soft: _SoftState,
        result: BatchResult,
        *,
        resending: bool,
        staging: _Staging | None = None,
    ) -> None:
        """Deliver every pending production in one transaction (transactional productions).

        An interval whose producer is not open here yet, or whose last transaction ended
        unknown, is opened first: that fences every earlier producer of it, and its marker
        says which pending productions were delivered already (dropped without a resend).
        The transaction's marker is the highest tag it delivers or the interval delivered
        before, so it never goes back, even when a zombie's stale view delivers. A second
        unknown outcome, a fenced producer or an unanswered open leaves the productions
        pending for the next batch.

        ``staging``, a transaction staged during the commit (:meth:`_stage`), is committed
        in place of a new one if it holds exactly the pending productions; otherwise it is
        aborted.
        """
        transactions = self._transactions
        assert transactions is not None
        name, timeout = self.spec.name, self.spec.options.send_timeout
        if staging is not None and (
            soft.unresolved or {p.record_id for p in staging.productions} != soft.pending.keys()
        ):
            staging.transaction.abort()
            staging = None
        for _ in range(2):
            if soft.unresolved:
                try:
                    marker = transactions.open(name, self.interval, timeout, soft.lease.token)
                except TransactionUnavailableError:
                    result.transaction_failures += 1
                    return
                soft.unresolved, soft.marker = False, marker
                delivered = [
                    p.record_id for p in soft.pending.values() if delivered_by(p.tag, marker)
                ]
                # A conditional write (even of nothing) after the open: a lease superseded
                # before it is fenced here, before it delivers anything. Whoever superseded
                # it opened the producer after that (an owner, or a split's driver that
                # copied the pending productions elsewhere without moving this marker), so
                # from here on this producer's transactions are fenced by theirs.
                self._drop_delivered(soft, delivered)
                result.marker_resolved += len(delivered)
                if resending:
                    result.resent -= len(delivered)
                result.aborted_commits += len(
                    {
                        p.tag
                        for p in soft.pending.values()
                        if p.tag is not None and p.tag.token < soft.lease.token
                    }
                )
            if staging is not None:
                productions, marker = staging.productions, staging.marker
                outcome = staging.transaction.commit()
                staging = None
            else:
                productions = list(soft.pending.values())
                if not productions:
                    return
                marker = _marker(soft, productions)
                outcome = transactions.deliver(name, self.interval, productions, marker, timeout)
            if outcome is DeliveryOutcome.COMMITTED:
                if not transactions.settled(name, self.interval, marker, timeout):
                    # Answered but not settled (see millstream.engine.productions): they stay
                    # pending, and the next delivery's open resolves them by the marker.
                    soft.unresolved = True
                    result.transaction_failures += 1
                    result.unsettled_commits += 1
                    return
                soft.marker = marker
                result.transactions += 1
                pause_point("executor.delivered", name)
                # Their rows go with the next commit: the marker says they were delivered
                # to whoever finds them before that.
                for production in productions:
                    soft.pending.pop(production.record_id, None)
                    soft.delivered.append(production.record_id)
                result.acknowledged += len(productions)
                return
            soft.unresolved = True
            result.transaction_failures += 1
            if outcome is DeliveryOutcome.FENCED:
                result.fenced_producers += 1
                return

    def _drop_delivered(self, soft: _SoftState, record_ids: list[bytes]) -> None:
        self._store.delete_productions(soft.lease, record_ids)
        for record_id in record_ids:
            soft.pending.pop(record_id, None)

    def _send_productions(
        self, soft: _SoftState, productions: list[Production], result: BatchResult
    ) -> None:
        """Send ``productions`` and delete those the sink acknowledged."""
        if not productions:
            return
        acked = self._sink.send(productions, self.spec.options.send_timeout)
        done = [p.record_id for p in productions if p.record_id in acked]
        if done:
            self._drop_delivered(soft, done)
            result.acknowledged += len(done)


class _Steps:
    """Times a batch's steps one after another, each from the end of the one before."""

    def __init__(self, clock: StepClock) -> None:
        self._clock = clock
        self._last = clock()
        self.times: dict[str, StepTime] = {}

    def end(self, step: str) -> None:
        seconds, cpu_seconds = now = self._clock()
        self.times[step] = StepTime(seconds - self._last[0], cpu_seconds - self._last[1])
        self._last = now


def _marker(soft: _SoftState, productions: Sequence[Production]) -> CommitTag:
    """The marker of a transaction delivering ``productions``: the highest tag it delivers
    or the interval delivered before, so that it never goes back, even when a zombie's stale
    view delivers."""
    return max(
        (t for t in (soft.marker, *(p.tag for p in productions)) if t is not None),
        default=CommitTag(soft.lease.token, 0),  # untagged productions only
    )


def _by_key(items: Iterable[_Input], key: Callable[[_Input], str]) -> dict[str, list[_Input]]:
    grouped: dict[str, list[_Input]] = {}
    for item in items:
        grouped.setdefault(key(item), []).append(item)
    return grouped


def _stale_index_entries(
    due: list[Timer], committed: dict[str, KeySnapshot]
) -> dict[str, list[Timer]]:
    """Due index entries whose timer the key no longer holds as indexed (a commit replaced or
    deleted it without naming it): dropped from the index in the key's next commit."""
    stale: dict[str, list[Timer]] = {}
    for timer in due:
        current = committed[timer.key].timers.get(timer.tag)
        if current is None or (current.timestamp, current.domain) != (
            timer.timestamp,
            timer.domain,
        ):
            stale.setdefault(timer.key, []).append(timer)
    return stale


def _maybe_seen(
    ids: IdFilter, candidates: dict[str, set[bytes]]
) -> tuple[dict[str, set[bytes]], int]:
    """The ``candidates`` (IDs by key) that ``ids`` may hold, and how many it proved fresh.
    Most are fresh: the IDs go to the filter in one flat list, and only those it may hold
    are traced back to their key (by where each key's IDs end in the list)."""
    keys = list(candidates)
    flat = [record_id for key_ids in candidates.values() for record_id in key_ids]
    held = ids.held_at(flat)
    kept: dict[str, set[bytes]] = {}
    if held:
        ends = list(itertools.accumulate(len(key_ids) for key_ids in candidates.values()))
        for at in held:
            kept.setdefault(keys[bisect.bisect_right(ends, at)], set()).add(flat[at])
    return kept, len(flat) - len(held)


def _dedup_candidates(
    records: dict[str, list[Delivery]], rejected: list[Rejected], exactly_once: bool
) -> tuple[
    dict[str, dict[bytes, Delivery]], dict[str, dict[bytes, Rejected]], dict[str, set[bytes]]
]:
    """Per key, the first delivery of each record ID and of each rejected input's origin
    (a repeat within the batch counts at its first; rejected input by its origin or record
    ID, since a replayed batch repeats it too), and the IDs to look up in the store; nothing
    without exactly-once."""
    if not exactly_once:
        return {}, {}, {}
    firsts = first_occurrences(records, lambda d: d.record.record_id)
    rejects = first_occurrences(
        _by_key(rejected, lambda r: r.origin.key or ""), lambda r: r.origin.cause_id()
    )
    candidates: dict[str, set[bytes]] = {}
    for by_key in (firsts, rejects):
        for key, items in by_key.items():
            candidates.setdefault(key, set()).update(items)
    return firsts, rejects, candidates


def _any_due(first: NextTimers, input_low_watermark: int, now: int) -> bool:
    """Whether a timer of an interval whose earliest timers are ``first`` is due."""
    return any(
        timestamp is not None and is_due_at(domain, timestamp, input_low_watermark, now)
        for domain, timestamp in (
            (TimeDomain.EVENT_TIME, first.event_time),
            (TimeDomain.WALL_TIME, first.wall_time),
        )
    )


def _progress(soft: _SoftState, timers: NextTimers) -> IntervalProgress:
    oldest_production = min((p.record.timestamp for p in soft.pending.values()), default=None)
    oldest = [t for t in (timers.event_time, oldest_production) if t is not None]
    return IntervalProgress(
        oldest_work=min(oldest) if oldest else None,
        next_event_timer=timers.event_time,
        next_wall_timer=timers.wall_time,
        pending=len(soft.pending),
    )
