"""The Cassandra :class:`~millstream.engine.store.IntervalStore`: one partition per key interval.

The mapping is the one :mod:`millstream.engine.store` describes, on one table::

    CREATE TABLE <keyspace>.<table> (
        computation     text,
        interval        int,
        kind            text,    -- 'state' | 'timers' | 'timer_event' | 'timer_wall'
                                 -- | 'timer_floor' | 'dedup@<bucket end>' | 'production'
                                 -- | '' (the anchor)
                                 -- | 'dedup', 'timer' (rows of earlier versions)
        key             text,    -- the key; the timestamp in the timer index; '' for
                                 -- productions
        item            blob,    -- '' for state and timers, the key and tag in the timer
                                 -- index, the expiry and the commit batch's marker for
                                 -- dedup, a slot for productions
        sequencer       bigint static,
        last_commit     blob static,
        value           blob,    -- state; a key's timers, packed; a production row's tag
        timer_timestamp bigint,  -- the timer index
        timer_domain    text,
        timer_set_by    blob,
        expires         bigint,  -- dedup: injected-clock µs; the row also has a TTL
        stream          text,    -- unused (rows of earlier versions)
        record          blob,    -- production: the batch's productions, packed; dedup: the
                                 -- key's record IDs of the batch, packed
        PRIMARY KEY ((computation, interval), kind, key, item))

Beside it, one counter table per keyspace (``FENCES_TABLE``, ``millstream_fences``) counts the
operations refused to a worker holding an old lease, per table, computation and interval
(``refused``), for people looking at it: a fenced zombie cannot say so anywhere else.

Rows a batch touches, and how it reads them (paper 6.1.1: the checkpoint is coalesced):

* **State and timers of the batch's keys**: one ``kind IN ('state', 'timer', 'timers') AND
  key IN ?`` query per :data:`_KEYS_PER_READ` keys, all in flight at once: a key's state row
  and its one ``timers`` row (an earlier version's ``timer`` rows, one a timer, if any).
* **The interval's keys**, once, by a worker that takes it over (``state_keys``): the ``key``
  of every ``state`` and timers row, a page at a time, until more than the worker's bound
  (10,000): a key the list lacks is not read. This read passes over the rows of keys whose
  state or timers were deleted (tombstones for ``gc_grace_seconds``); where a page meets more
  than ``tombstone_failure_threshold`` of them the node fails it, and the worker goes without
  the list (it reads every key it is given, as for more than 10,000 keys) and says so in a
  warning.
* **Dedup candidates**: one ``kind IN <live buckets> AND key IN ? AND item > <now>`` query
  per :data:`_KEYS_PER_READ` keys with candidate IDs, all in flight at once; it reads each
  key's live dedup rows, one per commit of the key within the dedup TTL, each holding the
  IDs that commit processed (16 bytes each, in ``record``). A row per ID would make a commit
  write one row per record, and each row of a Paxos batch is written twice; packed, a key
  with 20 records in a batch writes one. The price is on the lookup side, paid only for IDs
  the worker's Bloom filter may have seen: a key committed in every batch has a row per
  batch of the TTL to read. A row's ``kind`` is the bucket of expiry times it falls in
  (``dedup@`` and the bucket's end, buckets an eighth of the TTL wide:
  :func:`.rows.dedup_kind`), its ``item`` starts with its expiry: so the query names the
  buckets that end after now, and within the earliest of them starts at now's expiry, and
  no expired row (a tombstone for ``gc_grace_seconds``, ten days, not one TTL) is read. A
  lease finds the live buckets once (whatever TTL wrote them): from the rows of the Bloom
  filter's load, or else one read a bucket from the newest down; a worker's first acquire
  of an interval knows there are none. The Bloom
  filter's load at a takeover (``dedup_ids``) reads the buckets ending after now, newest
  first: it meets the expired rows of the earliest bucket only, an eighth of a TTL's, and
  only if it has not stopped at its bound of IDs before. Rows of earlier versions (kind
  ``dedup``, rows of one ID each without ``record`` too) are read beside them, by a lease
  that found any live; an earlier version does not read the buckets, so every worker of a
  topology must run this one (a driver restart upgrades them all).
* **Due timers**: every timer is also a row of the time-ordered index ``timer_event`` or
  ``timer_wall`` whose ``key`` is its timestamp as a fixed-width decimal (so text order is
  time order); the due ones are the range ``key < <watermark>``, the next one the first row.
  An index row is written and deleted in the same conditional batch as its key's timers
  row. Both reads start at the owner's :class:`~millstream.engine.store.TimerFloor`, past the
  fired timers' index rows, which stay as tombstones for ``gc_grace_seconds``; each commit
  keeps its floor in the interval's ``timer_floor`` row, where a worker taking the interval
  over starts (``kept_timer_floor``, one read by the row's key).
* **Pending productions**: one row per commit batch holds all its productions (``record``:
  per production a 2-byte stream length, the stream, a 4-byte record length, the record
  envelope), deleted once all of them were acknowledged; only a worker taking the interval
  over reads them. A transactional commit's row has the commit's tag in its ``value``
  (``T``, the lease token and commit number as two 8-byte integers; rows of earlier versions
  have it in front of their marker in ``item``), so a worker taking over knows which pending
  productions the Kafka transaction marker covers. A row's ``item`` is a *slot* (``#`` and a
  4-byte number), the first one free: holding no row of the interval, and not one the same
  commit deletes (a delete and a write of one row in one conditional batch share a
  timestamp, and the delete wins). A deleted row's slot is written again later, so an
  interval's production rows, live or deleted, are as many as it ever had pending at once
  (two, when each commit acknowledges the one before), and a takeover's read of them passes
  over as many tombstones at most. A store knows the free slots only while it knows all the
  rows: after a first acquire, or a takeover's read, and through the leases that followed
  its own with nobody in between; otherwise a commit's row gets a unique marker as ``item``.

Rules that make the contract hold:

* **Only LWTs write.** Acquiring is ``UPDATE ... SET sequencer = s + 1, last_commit = m0
  IF sequencer = s`` (``INSERT ... IF NOT EXISTS`` for an interval nobody ever acquired;
  a store's first acquire of an interval also writes the partition's anchor row in the same
  conditional batch: ``schema.ANCHOR_KIND`` says why);
  every commit and delete is an UNLOGGED batch on the one partition whose guard statement
  is ``UPDATE ... SET last_commit = <fresh marker> IF sequencer = <token> AND last_commit =
  <the marker before>``. A plain write would take a client timestamp that can lose against
  (or beat) the ballot timestamps of Paxos writes, and would not be ordered by the
  sequencer at all.
* **Markers form a chain.** Each write names the ``last_commit`` it expects, so a write
  with an unknown outcome can be *fenced* by the next one (:mod:`.chain`, which also says
  which errors leave an outcome unknown and how
  :meth:`~CassandraIntervalStore.was_applied` resolves one).
* **Consistency:** Paxos at ``SERIAL`` and its commit at ``QUORUM``; reads at ``QUORUM``;
  the sequencer reads at ``SERIAL``. With ``datacenter_local=True``
  these become ``LOCAL_SERIAL``/``LOCAL_QUORUM``: faster in a multi-datacenter cluster, but
  Paxos then only orders writers *within* one datacenter, so two workers in two datacenters
  could both hold an interval. Use it only if every worker of a computation runs in the
  datacenter its driver sessions treat as local.
* **Batch size:** Cassandra's ``batch_size_warn_threshold`` (5 KiB) and
  ``batch_size_fail_threshold`` (50 KiB) are checked only for non-conditional batches that
  span several partitions; a conditional batch on one partition is exempt (``BatchStatement
  .executeWithConditions`` never calls ``verifyBatchSize``; verified on 5.0). Commits are
  split at :data:`DEFAULT_MAX_BATCH_BYTES` (1 MiB): each batch is one Paxos round, and an
  interval's batches are sequential (each is chained on the one before), so the limit sets
  how many rounds a large commit waits for. At the fail threshold's 48 KiB a commit of 625
  counted keys took 5 LWTs and 70-85 ms at p50; at 1 MiB one LWT and 35-40 ms, while past
  that the time per byte dominates (``bench/core_commits.py --max-batch-bytes``). The
  limit still keeps a proposal (written to ``system.paxos`` and then to the table) far
  from the hard limits, ``max_mutation_size`` (16 MiB by default) and the driver's 65,535
  statements per batch; a single key may exceed the byte limit (it goes alone) but not those.
* **Dedup IDs** carry both an ``expires`` time from the injected clock, which decides
  whether they count as seen (so expiry is testable with a manual clock, like the memory
  backend), and ``USING TTL``, which makes Cassandra delete them (MillWheel's garbage
  collection). The TTL is the duration rounded up to whole seconds, plus one: Cassandra
  counts it from the current whole second, so a TTL of ``n`` lives between ``n - 1`` and
  ``n`` seconds. On a real clock (in step with the servers') the TTL thus never removes an
  ID before its ``expires``.

Tombstones: deleted timers and acknowledged productions leave tombstones, and expired dedup
IDs turn into them, until ``gc_grace_seconds`` (10 days by default) after which compaction
drops them. A read that meets more than ``tombstone_failure_threshold`` (100,000) fails
(``READ_TOO_MANY_TOMBSTONES``), so no read on a batch's path may pass over many: an LWT's
read of the partition stops at the anchor row, which sorts first and is never deleted; the
due-timer reads start at the owner's floor; the dedup reads at the live buckets; the
production rows reuse their slots. Also left: the rows of earlier versions (dedup IDs of
the one ``dedup`` kind, production rows of unique items), which no new row joins, until
compaction drops them. A key's timers are one row (``timers``), overwritten by each commit
that changes them, so a fired timer leaves no tombstone where the key's reads pass (earlier
versions' rows of one timer each are read beside it until a commit of the key replaces
them; 200 keys with 520 fired timers each made ``read_keys`` and ``state_keys`` fail on the
local node with those). Lower ``gc_grace_seconds`` on the table only together with a
repair schedule shorter than it, or deleted timers could come back on a replica that missed
the delete.
"""

from __future__ import annotations

import itertools
import logging
import random
import time
import uuid
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence, Set
from typing import Any, Final, TypeVar

from cassandra import ConsistencyLevel, ReadFailure
from cassandra.cluster import ResponseFuture

from millstream.engine.clock import Clock
from millstream.engine.errors import FencedError, RetiredIntervalError, StoreError
from millstream.engine.layout import IntervalLayout
from millstream.engine.productions import CommitTag, Production
from millstream.engine.sequencer import INITIAL_SEQUENCER, Lease
from millstream.engine.state import KeyChanges, effective_timers
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
from millstream.engine.stores.cassandra.chain import (
    MarkerChains,
    StoreStats,
    conditional_batch,
    is_too_many_tombstones,
    is_uncertain,
    new_marker,
)
from millstream.engine.stores.cassandra.rows import (
    TIMER_INDEX,
    TIMESTAMP_OFFSET,
    change_rows,
    dedup_bucket_end,
    dedup_item,
    dedup_item_floor,
    dedup_kind,
    dedup_kinds_after,
    dedup_row_ids,
    dedup_ttl_seconds,
    index_floor,
    index_time,
    indexed_timer,
    one_row,
    one_row_or_none,
    pack_productions,
    pack_timer_floor,
    production_row_tag,
    production_slot,
    production_tag_value,
    result_rows,
    row_count,
    row_timer,
    unpack_productions,
    unpack_timer_floor,
    unpack_timers,
)
from millstream.engine.stores.cassandra.schema import (
    DEDUP_BUCKETS_END,
    DEFAULT_TABLE,
    LEGACY_DEDUP_KIND,
    LEGACY_TIMER_KIND,
    TIMER_FLOOR_KIND,
    TIMERS_KIND,
    Statements,
    check_identifier,
    table_id,
)
from millstream.engine.timers import TimeDomain, Timer, due_bound, firing_order

__all__ = [
    "DEFAULT_ACQUIRE_ATTEMPTS",
    "DEFAULT_MAX_BATCH_BYTES",
    "MAX_BATCH_STATEMENTS",
    "RETIRED_SEQUENCER",
    "CassandraIntervalStore",
    "StoreStats",
]

# Enough for a handful of workers racing for one interval (a lost race costs one LWT, and
# retries back off with jitter); more contention than that is a deployment error.
DEFAULT_ACQUIRE_ATTEMPTS: Final = 20
# The native protocol counts a batch's statements in an unsigned short.
MAX_BATCH_STATEMENTS: Final = 0xFFFF

# Keys (or record IDs) per SELECT ... IN: large enough that a batch needs few round trips,
# small enough that one read stays cheap for the coordinator (about 68k keys/s at 200 here).
_KEYS_PER_READ = 200

_T = TypeVar("_T")
_log = logging.getLogger(__name__)
# Approximate bytes one production delete adds to a batch (row overhead plus a 16-byte ID),
# so delete batches obey the same byte limit as commits.
_DELETE_BYTES = 64
# The sequencer of a retired interval (split or merged away): no acquire moves past it.
RETIRED_SEQUENCER = 2**63 - 1
# The partition holding a computation's interval layout, one LWT-written row.
_LAYOUT_INTERVAL = -1
_DATA_KINDS = (
    "state",
    TIMERS_KIND,
    LEGACY_TIMER_KIND,
    "timer_event",
    "timer_wall",
    TIMER_FLOOR_KIND,
    LEGACY_DEDUP_KIND,
    "production",
)


class _Learnt:
    """What a store learnt of an interval's rows under its lease ``token``: the kinds of the
    live dedup buckets (``None``: not found yet) and whether rows of an earlier version's one
    dedup kind live; whether it knows all the production rows (so their free slots)."""

    __slots__ = ("dedup_kinds", "legacy_dedup", "productions", "token")

    def __init__(self, token: int) -> None:
        self.token = token
        self.dedup_kinds: set[str] | None = None
        self.legacy_dedup = False
        self.productions = False


class CassandraIntervalStore(IntervalStore):
    """Interval partitions in one Cassandra table, written only by LWTs.

    ``session`` is a cassandra-driver ``Session`` (any row factory); the table must exist
    (:func:`create_schema`). ``clock`` is the injected clock that decides dedup expiry.
    ``request_timeout`` (seconds, default: the session's; also an attribute) bounds each
    request on the client; keep it above the server's ``write_request_timeout`` plus
    ``cas_contention_timeout``, or slow but healthy LWTs turn into unknown outcomes.
    ``acquire_attempts`` bounds the LWTs one :meth:`acquire` sends before it gives up on a
    contended or failing interval.

    One instance per worker (thread), and one per lease: the instance remembers the head of
    each lease's marker chain and its latest uncertain write (:class:`.chain.MarkerChains`),
    which :meth:`was_applied` needs to fence it. The driver session is thread-safe and may
    be shared. All statements are prepared here, once.

    Give the session's ``Cluster`` ``sockopts=[(IPPROTO_TCP, TCP_NODELAY, 1)]``: the Python
    driver does not set it, and then every request over a few KB (most commits) waits about
    40 ms for the server's delayed ACK (``bench/core_commits.py`` shows 3-11x throughput).
    """

    def __init__(
        self,
        session: Any,
        keyspace: str,
        clock: Clock,
        *,
        table: str = DEFAULT_TABLE,
        max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
        datacenter_local: bool = False,
        request_timeout: float | None = None,
        acquire_attempts: int = DEFAULT_ACQUIRE_ATTEMPTS,
    ) -> None:
        if max_batch_bytes < 1:
            raise ValueError(f"max_batch_bytes must be positive, got {max_batch_bytes}")
        if request_timeout is not None and request_timeout <= 0:
            raise ValueError(f"request_timeout must be positive seconds, got {request_timeout}")
        if acquire_attempts < 1:
            raise ValueError(f"acquire_attempts must be at least 1, got {acquire_attempts}")
        check_identifier("keyspace", keyspace)
        check_identifier("table", table)
        self.clock = clock
        self.max_batch_bytes = max_batch_bytes
        self.acquire_attempts = acquire_attempts
        self.stats = StoreStats()
        self.request_timeout: float = (
            request_timeout if request_timeout is not None else session.default_timeout
        )
        self._session = session
        self._name = f"{keyspace}.{table}"
        self._table_id: uuid.UUID | None = None
        # The intervals whose anchor row this store wrote (``schema.ANCHOR_KIND``).
        self._anchored: set[tuple[str, int]] = set()
        # Per interval: the production rows (by item) and the IDs in them not yet acknowledged.
        self._production_rows: dict[tuple[str, int], dict[bytes, set[bytes]]] = {}
        # Per interval: what this store learnt of its rows under its latest lease of it.
        self._learnt: dict[tuple[str, int], _Learnt] = {}
        # Per interval and key: the tags of the key's timer rows of an earlier version, as last
        # read; its next commit that changes its timers deletes them.
        self._legacy_timers: dict[tuple[str, int], dict[str, set[str]]] = {}
        if datacenter_local:
            self._serial, self._quorum = (
                ConsistencyLevel.LOCAL_SERIAL,
                ConsistencyLevel.LOCAL_QUORUM,
            )
        else:
            self._serial, self._quorum = ConsistencyLevel.SERIAL, ConsistencyLevel.QUORUM
        self._statements = Statements(session, self._name, serial=self._serial, quorum=self._quorum)
        self._chains = MarkerChains(
            session,
            self._name,
            self._statements,
            serial=self._serial,
            quorum=self._quorum,
            stats=self.stats,
            timeout=lambda: self.request_timeout,
        )

    # -- the contract ----------------------------------------------------------------------

    def acquire(self, computation: str, interval: int, previous: Lease | None = None) -> Lease:
        """Move the sequencer forward by one LWT (two for a worker without a previous lease).

        With a previous lease of this interval, the first attempt is conditional on its token
        and succeeds exactly when nobody acquired in between (``cache_valid``). Otherwise the
        current value is read at SERIAL, or taken from the failed LWT's result (a
        linearizable read too), and the attempt repeats. An attempt with an unknown outcome
        is resolved the same way; since the sequencer then cannot tell whose advance it saw,
        such a lease is never ``cache_valid``, which costs a rescan and nothing else. The
        same LWT sets ``last_commit`` to a fresh marker, the head of the lease's chain.
        """
        statements = self._statements
        expected: int | None
        if previous is not None and (previous.computation, previous.interval) == (
            computation,
            interval,
        ):
            expected, valid = previous.token, True
        else:
            expected, valid = self._chains.serial_read(computation, interval)[0], False
        last_error: BaseException | None = None
        self.stats.acquires += 1
        for attempt in range(self.acquire_attempts):
            if expected == RETIRED_SEQUENCER:
                raise RetiredIntervalError(
                    f"interval {interval} of {computation!r} in {self._name} was split or "
                    "merged away; route by the computation's current layout"
                )
            self.stats.acquire_attempts += 1
            token = INITIAL_SEQUENCER + 1 if expected is None else expected + 1
            head = new_marker()
            acquire, values = (
                (statements.acquire_first, (computation, interval, token, head))
                if expected is None
                else (statements.acquire_next, (token, head, computation, interval, expected))
            )
            try:
                if (computation, interval) in self._anchored:
                    result = self._execute(acquire, values)
                else:
                    batch = conditional_batch(self._quorum, self._serial)
                    batch.add(acquire, values)
                    batch.add(statements.put_anchor, (computation, interval))
                    result = self._session.execute(batch, timeout=self.request_timeout)
            except Exception as exc:
                if not is_uncertain(exc):
                    raise
                last_error = exc
                valid = False
                _backoff(attempt)
                expected = self._chains.serial_read(computation, interval)[0]
                continue
            row = one_row(result)
            if row["[applied]"]:
                self._anchored.add((computation, interval))
                if expected is None:  # nobody acquired it before: it holds no rows
                    learnt = self._learnt[(computation, interval)] = _Learnt(token)
                    learnt.dedup_kinds, learnt.productions = set(), True
                    self._production_rows[(computation, interval)] = {}
                lease = Lease(computation, interval, token, cache_valid=valid, conflicts=attempt)
                self._chains.started(lease, head)
                return lease
            # Someone else moved the sequencer (or created the partition) first: their value
            # came back with the failed condition, so the next attempt needs no extra read.
            valid = False
            expected = row.get("sequencer")
            if attempt:
                _backoff(attempt)
        raise StoreError(
            f"could not acquire interval {interval} of {computation!r} in {self._name} after "
            f"{self.acquire_attempts} attempts (last error: {last_error!r}): other workers keep "
            "acquiring it, or its LWTs keep timing out. Check that one worker runs per "
            "interval and that Cassandra is healthy, then retry the batch"
        )

    def scan(self, lease: Lease) -> IntervalSnapshot:
        statements = self._statements
        partition = (lease.computation, lease.interval)
        timers, productions = (
            self._session.execute_async(statement, partition, timeout=self.request_timeout)
            for statement in (statements.scan_timers, statements.scan_productions)
        )
        now = self.clock.now()
        dedup = self._dedup_scans(partition, now, legacy=True)
        by_key = _key_timers(result_rows(timers.result()))[0]
        return IntervalSnapshot(
            timers=tuple(timer for held in by_key.values() for timer in held.values()),
            productions=tuple(
                production
                for row in result_rows(productions.result())
                for production in unpack_productions(row["record"], production_row_tag(row))
            ),
            dedup_ids=tuple(_live_ids(self._rows(dedup), now)),
        )

    def dedup_ids(self, lease: Lease, limit: int) -> list[bytes] | None:
        """The dedup IDs of the interval, a page of rows at a time, until more than ``limit``:
        those of the live buckets, newest first, then any of an earlier version's rows. A
        lease that has not found its live buckets yet finds them here, from the rows read, if
        it reads them all."""
        now = self.clock.now()
        learnt = self._learnt_under(lease)
        found_kinds = learnt.dedup_kinds is None
        legacy = found_kinds or learnt.legacy_dedup
        scans = self._dedup_scans((lease.computation, lease.interval), now, legacy=legacy)
        kinds: set[str] = set()

        def noted(rows: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
            for row in rows:
                kinds.add(row["kind"])
                yield row

        found = list(itertools.islice(_live_ids(noted(self._rows(scans)), now), limit + 1))
        if len(found) > limit:
            return None
        if found_kinds:
            learnt.legacy_dedup = LEGACY_DEDUP_KIND in kinds
            kinds.discard(LEGACY_DEDUP_KIND)
            learnt.dedup_kinds = kinds
        return found

    def state_keys(self, lease: Lease, limit: int) -> Set[str] | None:
        """The keys of the interval's state and timer rows, a page of rows at a time, until
        more than ``limit``; ``None`` too if a page met more deleted rows than the node's
        ``tombstone_failure_threshold`` (keys whose state or timers were deleted, for
        ``gc_grace_seconds``): the worker then reads every key it is given, as it does for an
        interval of more than ``limit`` keys, and the interval's batches go on."""
        partition = (lease.computation, lease.interval)
        found: set[str] = set()
        try:
            for row in result_rows(self._execute(self._statements.scan_keys, partition)):
                found.add(row["key"])
                if len(found) > limit:
                    return None
        except ReadFailure as exc:
            if not is_too_many_tombstones(exc):
                raise
            self.stats.unlisted += 1
            _log.warning(
                "the keys of interval %d of %r in %s were not listed: more deleted rows than "
                "the node's tombstone_failure_threshold lie among them (%s); its batches read "
                "every key they are given instead",
                lease.interval,
                lease.computation,
                self._name,
                exc,
            )
            return None
        return found

    def holds(self, lease: Lease) -> bool:
        """One QUORUM read of the sequencer (no Paxos round): it sees every acquire that
        completed; one still in flight it may miss, which the lease's next conditional write
        then finds."""
        result = self._execute(self._statements.peek_sequencer, (lease.computation, lease.interval))
        rows = list(result_rows(result))
        return bool(rows) and rows[0]["sequencer"] == lease.token

    def read_keys(self, lease: Lease, keys: Collection[str]) -> dict[str, KeySnapshot]:
        distinct = list(dict.fromkeys(keys))
        return self._snapshots(lease, distinct, self._rows(self._key_reads(lease, distinct)))

    def seen(
        self, lease: Lease, record_ids: Mapping[str, Collection[bytes]]
    ) -> Set[tuple[str, bytes]]:
        return _seen(self._rows(self._dedup_reads(lease, record_ids)), record_ids, self.clock.now())

    def read_batch(
        self, lease: Lease, keys: Collection[str], record_ids: Mapping[str, Collection[bytes]]
    ) -> tuple[dict[str, KeySnapshot], Set[tuple[str, bytes]]]:
        # Every read of both is sent before any is awaited: one round trip, not two.
        distinct = list(dict.fromkeys(keys))
        key_reads = self._key_reads(lease, distinct)
        dedup_reads = self._dedup_reads(lease, record_ids)
        seen = _seen(self._rows(dedup_reads), record_ids, self.clock.now())
        return self._snapshots(lease, distinct, self._rows(key_reads)), seen

    def _snapshots(
        self, lease: Lease, distinct: list[str], rows: Iterable[dict[str, Any]]
    ) -> dict[str, KeySnapshot]:
        """Each of ``distinct`` keys' committed state and timers, from its ``read_keys`` rows;
        notes the tags of the keys' timer rows of an earlier version (or that they have none)."""
        states: dict[str, bytes] = {}
        timer_rows: list[dict[str, Any]] = []
        for row in rows:
            if row["kind"] == "state":
                states[row["key"]] = row["value"]
            else:
                timer_rows.append(row)
        timers, legacy = _key_timers(timer_rows)
        known = self._legacy_timers.setdefault((lease.computation, lease.interval), {})
        for key in distinct:
            if key in legacy:
                known[key] = legacy[key]
            else:
                known.pop(key, None)
        return {key: KeySnapshot(states.get(key), timers.get(key, {})) for key in distinct}

    def _key_reads(self, lease: Lease, distinct: list[str]) -> list[ResponseFuture]:
        partition = (lease.computation, lease.interval)
        reads = [(*partition, chunk) for chunk in _chunks(distinct)]
        return self._send(self._statements.read_keys, reads)

    def _dedup_reads(
        self, lease: Lease, record_ids: Mapping[str, Collection[bytes]]
    ) -> list[ResponseFuture]:
        """The reads of the live dedup rows of the keys with IDs in ``record_ids``: in the
        interval's live buckets, from the expiry of now on, and an earlier version's rows."""
        keys = [key for key, ids in record_ids.items() if ids]
        if not keys:
            return []
        live, legacy_live = self._live_buckets(lease)
        partition = (lease.computation, lease.interval)
        futures: list[ResponseFuture] = []
        if live:
            kinds, floor = sorted(live), dedup_item_floor(self.clock.now())
            reads = [(*partition, kinds, chunk, floor) for chunk in _chunks(keys)]
            futures += self._send(self._statements.read_dedup, reads)
        if legacy_live:
            legacy = [(*partition, chunk) for chunk in _chunks(keys)]
            futures += self._send(self._statements.read_legacy_dedup, legacy)
        return futures

    def _dedup_scans(
        self, partition: tuple[str, int], now: int, *, legacy: bool
    ) -> list[ResponseFuture]:
        """The scans of the interval's live dedup buckets (and of an earlier version's rows)."""
        statements = self._statements
        scans: list[tuple[Any, tuple[Any, ...]]] = [
            (statements.scan_dedup, (*partition, dedup_kinds_after(now)))
        ]
        if legacy:
            scans.append((statements.scan_legacy_dedup, partition))
        return [
            self._session.execute_async(statement, values, timeout=self.request_timeout)
            for statement, values in scans
        ]

    def _live_buckets(self, lease: Lease) -> tuple[set[str], bool]:
        """The kinds of the interval's live dedup buckets, and whether rows of an earlier
        version's kind live: found once a lease, then kept as it commits."""
        learnt = self._learnt_under(lease)
        if learnt.dedup_kinds is None:
            learnt.dedup_kinds, learnt.legacy_dedup = self._find_buckets(lease)
        now = self.clock.now()
        learnt.dedup_kinds = {k for k in learnt.dedup_kinds if dedup_bucket_end(k) > now}
        return learnt.dedup_kinds, learnt.legacy_dedup

    def _learnt_under(self, lease: Lease) -> _Learnt:
        """What this store learnt of the interval under ``lease``, or under the lease of it
        that ``lease`` followed with nobody in between; afresh otherwise."""
        partition = (lease.computation, lease.interval)
        learnt = self._learnt.get(partition)
        if learnt is None or not _follows(learnt.token, lease):
            learnt = self._learnt[partition] = _Learnt(lease.token)
        learnt.token = lease.token
        return learnt

    def _find_buckets(self, lease: Lease) -> tuple[set[str], bool]:
        """Read which dedup buckets of the interval live: one read a bucket, newest first, each
        one row (whatever the dedup TTL of the rows, so a changed one finds them all)."""
        partition = (lease.computation, lease.interval)
        legacy = self._session.execute_async(
            self._statements.first_legacy_dedup, partition, timeout=self.request_timeout
        )
        kinds: set[str] = set()
        after, below = dedup_kinds_after(self.clock.now()), DEDUP_BUCKETS_END
        while True:
            result = self._execute(self._statements.next_dedup_bucket, (*partition, after, below))
            row = one_row_or_none(result)
            if row is None:
                break
            below = row["kind"]
            kinds.add(below)
        return kinds, one_row_or_none(legacy.result()) is not None

    def due_timers(
        self, lease: Lease, input_low_watermark: int, now: int, floor: TimerFloor = NO_FLOOR
    ) -> list[Timer]:
        partition = (lease.computation, lease.interval)
        bounds = ((d, due_bound(d, input_low_watermark, now)) for d in TIMER_INDEX)
        reads = [
            (*partition, TIMER_INDEX[domain], index_floor(floor, domain), index_time(bound))
            for domain, bound in bounds
            if _below(floor, domain, bound)
        ]
        rows = self._rows_at_once(self._statements.read_due, reads)
        return sorted((indexed_timer(row) for row in rows), key=firing_order)

    def next_timers(self, lease: Lease, floor: TimerFloor = NO_FLOOR) -> NextTimers:
        futures = {
            domain: self._session.execute_async(
                self._statements.read_first_timer,
                (lease.computation, lease.interval, kind, index_floor(floor, domain)),
                timeout=self.request_timeout,
            )
            for domain, kind in TIMER_INDEX.items()
        }
        first = {
            domain: next(
                (int(row["key"]) - TIMESTAMP_OFFSET for row in result_rows(f.result())), None
            )
            for domain, f in futures.items()
        }
        return NextTimers(first[TimeDomain.EVENT_TIME], first[TimeDomain.WALL_TIME])

    def pending_productions(self, lease: Lease) -> tuple[Production, ...]:
        result = self._execute(
            self._statements.scan_productions, (lease.computation, lease.interval)
        )
        rows: dict[bytes, set[bytes]] = {}
        productions: list[Production] = []
        for row in result_rows(result):
            unpacked = unpack_productions(row["record"], production_row_tag(row))
            rows[row["item"]] = {p.record_id for p in unpacked}
            productions.extend(unpacked)
        # What this instance knows of the interval's production rows starts over from here.
        self._production_rows[(lease.computation, lease.interval)] = rows
        self._learnt_under(lease).productions = True
        return tuple(productions)

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
        ttl_seconds = dedup_ttl_seconds(dedup_ttl)
        for change in changes:
            # A key's IDs are one row, but their limit stays what it was with a row each (a
            # pack of 1 MiB at most, far below Cassandra's largest mutation).
            count = max(row_count(change), len(set(change.dedup_ids)))
            if count + 2 > MAX_BATCH_STATEMENTS:
                raise ValueError(
                    f"key {change.key!r} carries {count} row changes or record IDs, more than "
                    f"one Cassandra batch can hold ({MAX_BATCH_STATEMENTS - 2} besides its "
                    "guard and timer floor) and one key's changes are never split; give this "
                    "key fewer records per batch"
                )
        partition = (lease.computation, lease.interval)
        timers = self._timers_after(lease, changes)
        legacy = self._legacy_timers.get(partition, {})
        legacy_rows = {c.key: len(legacy.get(c.key, ())) for c in changes if c.timers}
        batches = _cap_statements(split_batches(changes, self.max_batch_bytes), legacy_rows)
        floors = kept_floors(batches, timer_floor)
        done = self._acknowledge(partition, delivered) if delivered else []
        # The rows of delivered productions go in the commit's one batch when it has room (a
        # commit split in several batches is large enough not to miss a write of its own).
        folded = done if len(batches) == 1 and _room(batches[0], done, legacy_rows) else []
        if done and not folded:
            self._delete_rows(lease, done)
        learnt = self._learnt_under(lease)
        slots = self._free_slots(partition, done) if learnt.productions else None
        for number, batch in enumerate(batches):
            expires = self.clock.now() + dedup_ttl
            kind = dedup_kind(expires, dedup_ttl)
            if learnt.dedup_kinds is not None:
                learnt.dedup_kinds.add(kind)
            dedup = (kind.encode("utf-8"), dedup_item(expires, new_marker()))
            rows = [
                row
                for change in batch
                for row in change_rows(
                    self._statements,
                    lease,
                    change,
                    dedup,
                    expires,
                    ttl_seconds,
                    timers.get(change.key),
                    legacy.get(change.key, ()) if change.timers else (),
                )
            ]
            by_tag: dict[CommitTag | None, list[Production]] = {}
            for change in batch:
                for production in change.productions:
                    by_tag.setdefault(production.tag, []).append(production)
            for tag, productions in by_tag.items():
                # One row for all of the batch's productions of one commit (paper 6.1.1's
                # coalesced checkpoint). Known before the write, so that deleting it later is
                # possible whatever the outcome: deleting a row that never landed is harmless.
                item = new_marker() if slots is None else next(slots)
                values = (*partition, item, production_tag_value(tag))
                rows.append(
                    (self._statements.put_productions, (*values, pack_productions(productions)))
                )
                self._production_rows.setdefault(partition, {})[item] = {
                    p.record_id for p in productions
                }
            delete = self._statements.delete_row
            rows += [(delete, (*partition, "production", "", item)) for item in folded]
            if (floor := floors[number]) is not None:
                rows.append(
                    (self._statements.put_timer_floor, (*partition, pack_timer_floor(floor)))
                )
            self._chains.write(
                lease,
                rows,
                sum(change.approximate_size() for change in batch) + _DELETE_BYTES * len(folded),
                what=f"commit of {len(batch)} key(s)",
                uncertain_keys=tuple(change.key for change in batch),
                unattempted_keys=tuple(c.key for later in batches[number + 1 :] for c in later),
            )
            for change in batch:
                if change.timers:
                    legacy.pop(change.key, None)  # deleted with the write

    def _timers_after(
        self, lease: Lease, changes: Sequence[KeyChanges]
    ) -> dict[str, dict[str, Timer]]:
        """The whole set of timers after ``changes`` of each key whose timers they change:
        its ``timers_after``, or else its committed timers, read (one round trip for all),
        with the changes applied."""
        after = {c.key: c.timers_after for c in changes if c.timers and c.timers_after is not None}
        unknown = [c for c in changes if c.timers and c.timers_after is None]
        if unknown:
            read = self.read_keys(lease, [change.key for change in unknown])
            for change in unknown:
                after[change.key] = effective_timers(read[change.key].timers, change)
        return after

    def _free_slots(self, partition: tuple[str, int], done: list[bytes]) -> Iterator[bytes]:
        """The interval's production slots holding no row it knows, none of ``done`` (a delete
        and a write of one row in one batch share a timestamp, and the delete would win),
        first the lowest; a slot taken is a row known before the next is asked for. Only for
        a store that knows all the interval's production rows; without, a commit writes rows
        of unique items. Slots are reused: an interval's production rows, live or deleted,
        are as many as it ever had pending, and a takeover's read of them passes over no more
        tombstones than that."""
        rows, deleted = self._production_rows.setdefault(partition, {}), set(done)
        free = (production_slot(n) for n in itertools.count())
        return (slot for slot in free if slot not in rows and slot not in deleted)

    def kept_timer_floor(self, lease: Lease) -> TimerFloor:
        """One read of the interval's ``TIMER_FLOOR_KIND`` row, by its whole key."""
        read = self._statements.read_timer_floor
        row = one_row_or_none(self._execute(read, (lease.computation, lease.interval)))
        return unpack_timer_floor(None if row is None else row["value"])

    def was_applied(self, lease: Lease, marker: bytes) -> bool:
        """Resolve an unknown outcome, linearizably and for good
        (:meth:`.chain.MarkerChains.was_applied` says how)."""
        return self._chains.was_applied(lease, marker)

    def delete_productions(self, lease: Lease, record_ids: Collection[bytes]) -> None:
        """Delete the production rows all of whose productions are now acknowledged.

        A row holds one commit batch's productions; it stays while any of them is not
        acknowledged (a worker taking over resends the whole row, harmlessly). This instance
        knows the rows it wrote and the ones :meth:`pending_productions` read; IDs of other
        rows are ignored. Conditional batches under the byte limit, like a commit; with
        nothing to delete it still runs the guard, so a stale lease is reported as for any
        write. An unknown outcome carries the marker and no keys (deletes are idempotent:
        repeating them is the whole recovery).
        """
        partition = (lease.computation, lease.interval)
        self._delete_rows(lease, self._acknowledge(partition, record_ids))

    def _acknowledge(
        self, partition: tuple[str, int], record_ids: Collection[bytes]
    ) -> list[bytes]:
        """Note ``record_ids`` acknowledged; the items of the rows now wholly acknowledged."""
        rows = self._production_rows.get(partition, {})
        acknowledged = set(record_ids)
        done: list[bytes] = []
        for item, ids in list(rows.items()):
            ids -= acknowledged
            if not ids:
                done.append(item)
                del rows[item]
        return done

    def _delete_rows(self, lease: Lease, done: list[bytes]) -> None:
        """Delete the production rows ``done`` (with none, still the guard: a fence check)."""
        partition = (lease.computation, lease.interval)
        per_batch = max(1, min(self.max_batch_bytes // _DELETE_BYTES, MAX_BATCH_STATEMENTS - 1))
        chunks = [done[start : start + per_batch] for start in range(0, len(done), per_batch)]
        delete = self._statements.delete_row
        for chunk in chunks or [[]]:
            self._chains.write(
                lease,
                [(delete, (*partition, "production", "", item)) for item in chunk],
                _DELETE_BYTES * len(chunk),
                what=f"deletion of {len(chunk)} acknowledged production row(s)",
                uncertain_keys=(),
                unattempted_keys=(),
            )

    # -- inspection ------------------------------------------------------------------------

    @property
    def table_id(self) -> uuid.UUID:
        """Cassandra's ID of the table (read once): it changes when the table is dropped and
        created again, so whatever outlives the store elsewhere can tell its incarnation."""
        if self._table_id is None:
            keyspace, _, table = self._name.partition(".")
            self._table_id = table_id(self._session, keyspace, table)
        return self._table_id

    def sequencer(self, computation: str, interval: int) -> int | None:
        """The interval's current sequencer (SERIAL read); ``None`` if never acquired."""
        return self._chains.serial_read(computation, interval)[0]

    def intervals(self) -> dict[str, list[int]]:
        """Every computation in the table with its acquired intervals, in order.

        A scan of the whole table's partition keys (one row each), not of their rows: for
        tools that know a computation's name but not its ``key_intervals``; never on a
        batch's path.
        """
        found: dict[str, list[int]] = {}
        for row in result_rows(self._execute(self._statements.list_intervals, ())):
            if row["interval"] != _LAYOUT_INTERVAL:
                found.setdefault(row["computation"], []).append(row["interval"])
        return {name: sorted(intervals) for name, intervals in found.items()}

    def export(self, computation: str, interval: int) -> list[KeyChanges]:
        try:
            return self._export(computation, interval)
        except ReadFailure as exc:
            if not is_too_many_tombstones(exc):
                raise
            raise StoreError(
                f"interval {interval} of {computation!r} in {self._name} cannot be read whole "
                "for a split or merge: a read of its rows met more deleted rows (tombstones, "
                "kept for the table's gc_grace_seconds) than the nodes' "
                "tombstone_failure_threshold. Raise that threshold on the nodes for the change "
                "(cassandra.yaml) and finish it again; the change stays journaled until then "
                f"({exc})"
            ) from exc

    def _export(self, computation: str, interval: int) -> list[KeyChanges]:
        statements = self._statements
        partition = (computation, interval)
        states, timers, productions = (
            self._session.execute_async(statement, partition, timeout=self.request_timeout)
            for statement in (
                statements.scan_states,
                statements.scan_timers,
                statements.scan_productions,
            )
        )
        now = self.clock.now()
        dedup = self._dedup_scans(partition, now, legacy=True)
        by_key: dict[str, KeyChanges] = {}
        for row in result_rows(states.result()):
            by_key.setdefault(row["key"], KeyChanges(row["key"])).state = row["value"]
        for key, held in _key_timers(result_rows(timers.result()))[0].items():
            # Every timer of the key: its whole set, whatever the target held of it before.
            moved = by_key.setdefault(key, KeyChanges(key))
            moved.timers, moved.timers_after = dict(held), dict(held)
        for row in _unexpired(self._rows(dedup), now):
            by_key.setdefault(row["key"], KeyChanges(row["key"])).dedup_ids.extend(
                dedup_row_ids(row)
            )
        changes = [by_key[key] for key in sorted(by_key)]
        pending = [
            production
            for row in result_rows(productions.result())
            # With their commit's tag: a split or merge leaves out what the source's
            # transaction marker says was delivered (finish_change), and an untagged
            # production never counts as delivered.
            for production in unpack_productions(row["record"], production_row_tag(row))
        ]
        if pending:
            changes.append(KeyChanges("", productions=pending))
        return changes

    def retire(self, lease: Lease) -> None:
        # The LWT fences every holder of an older lease and refuses every later acquire.
        result = self._execute(
            self._statements.acquire_next,  # moving the sequencer to the retired value
            (RETIRED_SEQUENCER, new_marker(), lease.computation, lease.interval, lease.token),
        )
        if not one_row(result)["[applied]"]:
            raise FencedError(
                f"interval {lease.interval} of {lease.computation!r} was acquired by another "
                f"worker before it could be retired (lease {lease.token})"
            )

    def purge(self, computation: str, interval: int) -> None:
        # The rows of a partition no one can write any more go by plain range deletes; the
        # SERIAL read sees the retiring LWT, so no live interval's rows are ever deleted.
        if self._chains.serial_read(computation, interval)[0] != RETIRED_SEQUENCER:
            raise FencedError(
                f"interval {interval} of {computation!r} is not retired: only a retired "
                "interval's rows are purged"
            )
        for kind in _DATA_KINDS:
            self._execute(self._statements.delete_kind, (computation, interval, kind))
        self._execute(self._statements.delete_dedup_buckets, (computation, interval))

    def fenced(self, computation: str) -> dict[int, int]:
        """Per key interval of ``computation``, how many operations this table refused to
        workers holding an old lease (zombies fenced), as counted in ``FENCES_TABLE``."""
        rows = self._execute(self._statements.read_fences, (self._name, computation))
        return {row["interval"]: row["refused"] for row in result_rows(rows)}

    def read_layout(self, computation: str) -> IntervalLayout | None:
        row = one_row_or_none(
            self._execute(self._statements.read_layout, (computation, _LAYOUT_INTERVAL))
        )
        return None if row is None else IntervalLayout.decode(row["value"].decode("utf-8"))

    def write_layout(
        self, computation: str, layout: IntervalLayout, expected: IntervalLayout | None
    ) -> bool:
        value = layout.encode().encode("utf-8")
        if expected is None:
            result = self._execute(
                self._statements.create_layout, (computation, _LAYOUT_INTERVAL, value)
            )
        else:
            result = self._execute(
                self._statements.change_layout,
                (value, computation, _LAYOUT_INTERVAL, expected.encode().encode("utf-8")),
            )
        return bool(one_row(result)["[applied]"])

    # -- internals -------------------------------------------------------------------------

    def _execute(self, statement: Any, parameters: tuple[Any, ...]) -> Any:
        return self._session.execute(statement, parameters, timeout=self.request_timeout)

    def _rows_at_once(
        self, statement: Any, reads: Sequence[tuple[Any, ...]]
    ) -> Iterator[dict[str, Any]]:
        """The rows of ``statement`` run with each of ``reads``, all sent before any is
        awaited (one round trip, not one per read)."""
        return self._rows(self._send(statement, reads))

    def _send(self, statement: Any, reads: Sequence[tuple[Any, ...]]) -> list[ResponseFuture]:
        """``statement`` run with each of ``reads``, sent now; awaited by :meth:`_rows`."""
        return [
            self._session.execute_async(statement, parameters, timeout=self.request_timeout)
            for parameters in reads
        ]

    @staticmethod
    def _rows(futures: list[ResponseFuture]) -> Iterator[dict[str, Any]]:
        for future in futures:
            yield from result_rows(future.result())


def _follows(token: int, lease: Lease) -> bool:
    """Whether what a store learnt of an interval under its lease ``token`` holds under
    ``lease``: the same lease, or the next one, acquired with nobody in between."""
    return token == lease.token or (lease.cache_valid and token == lease.token - 1)


def _key_timers(
    rows: Iterable[dict[str, Any]],
) -> tuple[dict[str, dict[str, Timer]], dict[str, set[str]]]:
    """Each key's timers by tag, from its timers row, or else from its timer rows of an
    earlier version (which a key's first commit of a timers row deletes, and a row holds all
    they held); and the tags of each key's rows of an earlier version."""
    packed: dict[str, dict[str, Timer]] = {}
    legacy: dict[str, dict[str, Timer]] = {}
    for row in rows:
        if row["kind"] == TIMERS_KIND:
            packed[row["key"]] = unpack_timers(row["key"], row["value"])
        else:
            timer = row_timer(row)
            legacy.setdefault(timer.key, {})[timer.tag] = timer
    timers = {**legacy, **packed}
    return timers, {key: set(held) for key, held in legacy.items()}


def _chunks(items: list[_T]) -> list[list[_T]]:
    """``items`` in lists of :data:`_KEYS_PER_READ`, for ``IN`` queries."""
    return [items[start : start + _KEYS_PER_READ] for start in range(0, len(items), _KEYS_PER_READ)]


def _cap_statements(
    batches: list[list[KeyChanges]], legacy_timers: Mapping[str, int]
) -> list[list[KeyChanges]]:
    """Split batches further, between keys, so none exceeds the driver's statement limit
    (a key with ``legacy_timers`` rows to delete makes as many statements more)."""
    capped: list[list[KeyChanges]] = []
    for batch in batches:
        current: list[KeyChanges] = []
        count = 2  # the guard, and the timer floor a batch may keep
        for change in batch:
            rows = row_count(change, legacy_timers.get(change.key, 0))
            if current and count + rows > MAX_BATCH_STATEMENTS:
                capped.append(current)
                current, count = [], 2
            current.append(change)
            count += rows
        capped.append(current)
    return capped


def _room(batch: list[KeyChanges], deletes: list[bytes], legacy_timers: Mapping[str, int]) -> bool:
    """Whether a commit batch of ``batch`` can take ``deletes`` production rows besides."""
    rows = sum(row_count(change, legacy_timers.get(change.key, 0)) for change in batch)
    statements = 2 + rows + len(deletes)  # the guard and the timer floor besides
    return statements <= MAX_BATCH_STATEMENTS and len(deletes) <= 1_000


def _backoff(attempt: int) -> None:
    # Competing acquirers (lost races, contention timeouts) retry after a random, growing
    # pause, so that they do not keep colliding in lockstep.
    time.sleep(random.uniform(0, min(0.5, 0.01 * 2**attempt)))


def _unexpired(rows: Iterable[dict[str, Any]], now: int) -> Iterator[dict[str, Any]]:
    """The dedup ``rows`` whose ``expires`` is after ``now``: Cassandra's own TTL runs in
    real seconds, so the store's clock decides."""
    return (row for row in rows if row["expires"] > now)


def _live_ids(rows: Iterable[dict[str, Any]], now: int) -> Iterator[bytes]:
    """The record IDs of the unexpired dedup ``rows``."""
    return (record_id for row in _unexpired(rows, now) for record_id in dedup_row_ids(row))


def _seen(
    rows: Iterable[dict[str, Any]], asked: Mapping[str, Collection[bytes]], now: int
) -> Set[tuple[str, bytes]]:
    """Which ``(key, ID)`` of ``asked`` the unexpired dedup ``rows`` of its keys hold."""
    held = {
        (row["key"], record_id) for row in _unexpired(rows, now) for record_id in dedup_row_ids(row)
    }
    return {
        (key, record_id)
        for key, ids in asked.items()
        for record_id in ids
        if (key, record_id) in held
    }


def _below(floor: TimerFloor, domain: TimeDomain, bound: int) -> bool:
    """Whether the range from ``floor`` up to ``bound`` (excluded) can hold an entry."""
    start = floor.of(domain)
    return start is None or start < bound
