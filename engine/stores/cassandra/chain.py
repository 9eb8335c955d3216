"""The marker chain: how the Cassandra store writes an interval, fenced by its sequencer.

Every write to an interval's partition after the acquire is one UNLOGGED conditional batch
whose guard statement is ``UPDATE ... SET last_commit = <fresh marker> IF sequencer =
<token> AND last_commit = <the marker before>``. So each write names the ``last_commit`` it
expects, and the writes of a lease form a chain of markers:

* **Fencing.** A write under an old lease finds another sequencer and is refused
  (:class:`~millstream.engine.errors.FencedError`, counted in ``FENCES_TABLE``).
* **Unknown outcomes.** A write that fails in a way after which it may have been (or may
  still be) applied raises :class:`~millstream.engine.errors.UnknownOutcomeError`: a
  ``WriteTimeout`` of any write type (Paxos phases report ``CAS``; a commit-phase timeout may
  report ``SIMPLE``), a ``WriteFailure``, protocol v5's ``CAS_WRITE_UNKNOWN`` (0x1700, which
  the driver does not name), a client-side ``OperationTimedOut``, a connection lost with the
  request in flight and a coordinator ``ServerError``. The driver never retries these
  statements by itself (their retry policy rethrows everything), so each error reaches this
  code exactly once. Errors that prove the write was not attempted (``Unavailable``,
  ``NoHostAvailable``, ``InvalidRequest``) propagate unchanged.
* **Resolving one.** :meth:`MarkerChains.was_applied` moves ``last_commit`` past the uncertain
  write's predecessor, after which it can never apply, even if it is still queued on a
  coordinator or in the network (a SERIAL read alone would let such a late write overtake
  it: on the local node, 299 of 300 client-timed-out commits applied after a SERIAL read on
  another connection had found them absent). The instance knows the head of its chain (it
  set it), so the extra condition costs no round trip.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from cassandra import OperationTimedOut, ReadFailure, WriteFailure, WriteTimeout
from cassandra.connection import ConnectionException
from cassandra.policies import FallthroughRetryPolicy
from cassandra.protocol import ErrorMessage, ServerError
from cassandra.query import BatchStatement, BatchType

from millstream.engine.errors import FencedError, StoreError, UnknownOutcomeError
from millstream.engine.sequencer import Lease
from millstream.engine.stores.cassandra.rows import Bound, Row, one_row, result_rows
from millstream.engine.stores.cassandra.schema import Statements

__all__ = [
    "MarkerChains",
    "StoreStats",
    "conditional_batch",
    "is_too_many_tombstones",
    "is_uncertain",
    "new_marker",
]

_log = logging.getLogger(__name__)
# Protocol v5 error code of CasWriteUnknownResultException; the Python driver surfaces it
# as a bare ErrorMessage.
_CAS_WRITE_UNKNOWN: Final = 0x1700
# A write that finds another head than expected under its own lease learns it and retries.
_STALE_HEAD_ATTEMPTS: Final = 3


def conditional_batch(quorum: Any, serial: Any) -> BatchStatement:
    """An empty conditional batch on one partition, with the lone LWTs' settings: its first
    statement's condition guards it; never retried by the driver (an uncertain outcome is
    resolved, not sent again)."""
    return BatchStatement(
        batch_type=BatchType.UNLOGGED,  # one partition: atomic without the batchlog
        retry_policy=FallthroughRetryPolicy(),
        consistency_level=quorum,
        serial_consistency_level=serial,
    )


@dataclass
class StoreStats:
    """Counters of the conditional writes one store instance sent (for tuning and benchmarks).

    ``acquire_attempts`` above ``acquires`` means contention or uncertain acquires; ``batches``
    counts every conditional batch sent by
    :meth:`~millstream.engine.stores.cassandra.store.CassandraIntervalStore.commit` and
    :meth:`~millstream.engine.stores.cassandra.store.CassandraIntervalStore.delete_productions`,
    applied or not. ``unlisted`` counts the intervals whose keys a takeover could not list
    for the deleted rows among them
    (:meth:`~millstream.engine.stores.cassandra.store.CassandraIntervalStore.state_keys`).
    """

    acquires: int = 0
    acquire_attempts: int = 0
    batches: int = 0
    statements: int = 0
    largest_batch_bytes: int = 0
    unlisted: int = 0


@dataclass
class _Uncertain:
    """A write whose outcome is unknown: its marker and the head it was chained on."""

    token: int
    marker: bytes
    predecessor: bytes | None
    outcome: bool | None = None  # set once a linearizable read or write shows it


# A replica's reason for a failed read (RequestFailureReason): it met more tombstones than
# tombstone_failure_threshold.
_READ_TOO_MANY_TOMBSTONES: Final = 0x0001


def is_too_many_tombstones(exc: BaseException) -> bool:
    """Whether ``exc`` is a read a replica failed for the tombstones it met (native protocol 5
    says why; an earlier one does not, and nothing is assumed)."""
    codes = getattr(exc, "error_code_map", None) or {}
    return isinstance(exc, ReadFailure) and _READ_TOO_MANY_TOMBSTONES in codes.values()


def is_uncertain(exc: BaseException) -> bool:
    """Whether a conditional write that raised ``exc`` may have applied, or may still."""
    if isinstance(
        exc, WriteTimeout | WriteFailure | OperationTimedOut | ConnectionException | ServerError
    ):
        return True
    return isinstance(exc, ErrorMessage) and exc.code == _CAS_WRITE_UNKNOWN


def new_marker() -> bytes:
    """A fresh ``last_commit`` marker."""
    # Random, not a counter: markers must be unique across every worker that ever writes.
    return uuid.uuid4().bytes


class MarkerChains:
    """The chains of one store instance's leases, one per interval it writes.

    The instance remembers the head of each lease's chain and its latest uncertain write,
    which :meth:`was_applied` needs to fence it. (Another instance writing with the same
    lease is detected and followed, but then only a SERIAL read resolves its markers.)
    ``timeout`` gives the client-side bound of each request, read at every request.
    """

    def __init__(
        self,
        session: Any,
        name: str,
        statements: Statements,
        *,
        serial: Any,
        quorum: Any,
        stats: StoreStats,
        timeout: Callable[[], float],
    ) -> None:
        self._session = session
        self._name = name
        self._statements = statements
        self._serial = serial
        self._quorum = quorum
        self._stats = stats
        self._timeout = timeout
        # Per interval: the token and last_commit ("head") this instance's writes chain on,
        # and its latest write with an unknown outcome.
        self._heads: dict[tuple[str, int], tuple[int, bytes | None]] = {}
        self._uncertain: dict[tuple[str, int], _Uncertain] = {}

    def started(self, lease: Lease, head: bytes) -> None:
        """``lease`` was just acquired with ``head`` as its ``last_commit``: anything this
        instance left uncertain on the interval is fenced for good."""
        partition = (lease.computation, lease.interval)
        self._uncertain.pop(partition, None)
        self._heads[partition] = (lease.token, head)

    def write(
        self,
        lease: Lease,
        rows: list[Row],
        approximate_bytes: int,
        *,
        what: str,
        uncertain_keys: tuple[str, ...],
        unattempted_keys: tuple[str, ...],
    ) -> None:
        """One conditional batch: ``rows`` behind the guard, chained on the known head."""
        partition = (lease.computation, lease.interval)
        stats = self._stats
        for _ in range(_STALE_HEAD_ATTEMPTS):
            predecessor = self._head(lease)
            marker = new_marker()
            batch = conditional_batch(self._quorum, self._serial)
            batch.add(
                self._statements.guard,
                (marker, lease.computation, lease.interval, lease.token, predecessor),
            )
            # The driver's own append, which its add calls once it has bound a row: bound
            # rows skip the bind (their routing is the guard's, the one partition's).
            append = batch._add_statement_and_params
            for statement_row in rows:
                if isinstance(statement_row, Bound):
                    append(True, statement_row.statement.query_id, statement_row.values)
                else:
                    batch.add(*statement_row)
            stats.batches += 1
            stats.statements += len(batch)
            stats.largest_batch_bytes = max(stats.largest_batch_bytes, approximate_bytes)
            try:
                result = self._session.execute(batch, timeout=self._timeout())
            except Exception as exc:
                if not is_uncertain(exc):
                    raise
                self._heads.pop(partition, None)
                self._uncertain[partition] = _Uncertain(lease.token, marker, predecessor)
                raise UnknownOutcomeError(
                    f"{what} to interval {lease.interval} of {lease.computation!r} in "
                    f"{self._name} has an unknown outcome ({type(exc).__name__}: {exc}); it "
                    "may have applied or may still apply. Resolve it with "
                    "was_applied(lease, error.marker), then write again what did not apply",
                    marker=marker,
                    uncertain_keys=uncertain_keys,
                    unattempted_keys=unattempted_keys,
                ) from exc
            row = one_row(result)
            if row["[applied]"]:
                self._heads[partition] = (lease.token, marker)
                return
            self._check_fence(lease, row.get("sequencer"))
            # Same token, another head: a write this instance had not seen (its own uncertain
            # write that landed, or another instance writing with the same lease).
            self._learn(lease, row.get("last_commit"))
        raise StoreError(
            f"{what} to interval {lease.interval} of {lease.computation!r} in {self._name} "
            f"lost {_STALE_HEAD_ATTEMPTS} times to other writes under the same lease: some "
            "other store instance or process is writing with this lease. Use one store "
            "instance per worker and do not share leases"
        )

    def was_applied(self, lease: Lease, marker: bytes) -> bool:
        """Resolve an unknown outcome, linearizably and for good.

        For this instance's latest uncertain write it is one LWT that moves ``last_commit``
        from the write's predecessor to a fresh marker: if it applies, the uncertain write
        (conditional on that predecessor) had not applied and now never can, even if it is
        still queued on a coordinator or in the network; if it does not, ``last_commit``
        tells. A SERIAL read could not promise that: it only completes proposals already in
        Paxos, and a request that has not reached Paxos yet (a client-side timeout, a lost
        connection) may overtake it and apply afterwards. For any other marker, the answer
        is a SERIAL read of ``last_commit``, exact for writes that can no longer be in flight.
        """
        partition = (lease.computation, lease.interval)
        entry = self._uncertain.get(partition)
        if entry is None or (entry.token, entry.marker) != (lease.token, marker):
            return self._read_head(lease) == marker
        if entry.outcome is None:
            resolution = new_marker()
            try:
                result = self._execute(
                    self._statements.guard,
                    (resolution, lease.computation, lease.interval, lease.token, entry.predecessor),
                )
            except Exception as exc:
                if not is_uncertain(exc):
                    raise
                self._heads.pop(partition, None)
                raise UnknownOutcomeError(
                    f"resolving the outcome of a write to interval {lease.interval} of "
                    f"{lease.computation!r} timed out too ({type(exc).__name__}: {exc}); call "
                    "was_applied again with the same marker once Cassandra responds",
                    marker=marker,
                ) from exc
            row = one_row(result)
            if row["[applied]"]:
                self._heads[partition] = (lease.token, resolution)
                entry.outcome = False
            else:
                self._check_fence(lease, row.get("sequencer"))
                self._learn(lease, row.get("last_commit"))
                # Markers never repeat: once last_commit left the predecessor for anything
                # but this write, this write's condition can never hold again.
                entry.outcome = row.get("last_commit") == marker
        else:
            self._read_head(lease)
        del self._uncertain[partition]
        return entry.outcome

    def serial_read(self, computation: str, interval: int) -> tuple[int | None, bytes | None]:
        """The interval's sequencer and ``last_commit``, read at SERIAL (``None`` for an
        interval never acquired)."""
        result = self._execute(self._statements.read_sequencer, (computation, interval))
        rows = list(result_rows(result))
        if not rows:
            return None, None
        return rows[0]["sequencer"], rows[0]["last_commit"]

    def _check_fence(self, lease: Lease, sequencer: int | None) -> None:
        """Raise :class:`~millstream.engine.errors.FencedError` unless ``sequencer`` is the
        lease's own token."""
        if sequencer == lease.token:
            return
        if sequencer is None:
            raise FencedError(
                f"interval {lease.interval} of {lease.computation!r} was never acquired in "
                f"{self._name}, yet this lease claims token {lease.token}: it comes from "
                "another keyspace or table. Acquire the interval from this store"
            )
        self._count_fence(lease)
        raise FencedError(
            f"interval {lease.interval} of {lease.computation!r} was acquired by another "
            f"worker (sequencer {sequencer}, this lease {lease.token}); stop work on it and "
            "drop its cached state"
        )

    def _head(self, lease: Lease) -> bytes | None:
        """The ``last_commit`` the next write of ``lease`` must find (SERIAL read if unknown)."""
        known = self._heads.get((lease.computation, lease.interval))
        if known is not None and known[0] == lease.token:
            return known[1]
        return self._read_head(lease)

    def _read_head(self, lease: Lease) -> bytes | None:
        """The interval's ``last_commit`` by a SERIAL read, learned as the lease's head once
        the sequencer shows the lease still holds the interval."""
        sequencer, last_commit = self.serial_read(lease.computation, lease.interval)
        self._check_fence(lease, sequencer)
        self._learn(lease, last_commit)
        return last_commit

    def _learn(self, lease: Lease, head: bytes | None) -> None:
        """Record ``head`` as the lease's ``last_commit``, as read linearizably.

        Finding the uncertain write's marker there settles it as applied; it must be noted
        now, since the next write moves the head on and the marker is never seen again.
        """
        partition = (lease.computation, lease.interval)
        self._heads[partition] = (lease.token, head)
        entry = self._uncertain.get(partition)
        if entry is not None and entry.token == lease.token and head == entry.marker:
            entry.outcome = True

    def _count_fence(self, lease: Lease) -> None:
        """Count the refusal in FENCES_TABLE, for people looking at the interval; the fence
        itself stands whether or not the count lands."""
        try:
            self._execute(
                self._statements.count_fence, (self._name, lease.computation, lease.interval)
            )
        except Exception as exc:  # the FencedError the caller raises next is what matters
            _log.warning(
                "could not count a fenced operation on interval %d of %r: %s",
                lease.interval,
                lease.computation,
                exc,
            )

    def _execute(self, statement: Any, parameters: tuple[Any, ...]) -> Any:
        return self._session.execute(statement, parameters, timeout=self._timeout())
