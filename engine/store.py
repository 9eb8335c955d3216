"""The interval store: the contract every backend of MillWheel's persistent state fulfils.

Everything a computation persists for one key interval lives in one *partition* that only
sequencer-guarded writes touch (paper 6.2): the interval's sequencer, and rows of four kinds,
per key: state, timers, dedup IDs, and pending productions. A backend implements
:class:`IntervalStore`; ``stores/memory`` holds an in-process one, ``stores/cassandra`` mirrors
it on Cassandra. On Cassandra the mapping is one to one:

* one table, partition key ``(computation, interval)``; a static ``sequencer`` column and a
  static ``last_commit`` marker column;
* clustering rows ``(kind, key, item)``: ``state`` (``item`` empty), ``timer`` (``item`` the
  tag), ``dedup`` (``item`` the record ID, written ``USING TTL``), ``production`` (``key`` empty,
  ``item`` the record ID, so acknowledged productions are deleted by ID);
* :meth:`~IntervalStore.acquire` is an LWT ``UPDATE ... SET sequencer = s + 1 IF sequencer = s``
  (read ``s`` at SERIAL, retry on contention); every other write is an LWT conditional batch
  on that one partition ``IF sequencer = token AND last_commit = <the marker before>``,
  setting ``last_commit`` to a fresh marker. The markers form a chain, so a write that timed
  out and is proposed late (still queued at a coordinator) fails once anything was written
  after it;
* reads run after the acquiring LWT, whose Paxos round completes or supersedes any write still
  in flight from an earlier owner, so a scan cannot miss one (paper figure 12);
* an LWT timeout raises :class:`~millstream.engine.errors.UnknownOutcomeError`, resolved by
  :meth:`~IntervalStore.was_applied`, which either finds the write's marker or moves the chain
  past it (a SERIAL read alone would not stop a late proposal).

Times are integer microseconds from the store's injected clock.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Sequence, Set
from dataclasses import dataclass

from millstream.engine.productions import Production
from millstream.engine.sequencer import Lease
from millstream.engine.state import KeyChanges
from millstream.engine.timers import Timer

__all__ = ["IntervalSnapshot", "IntervalStore", "split_batches"]


@dataclass(frozen=True, slots=True)
class IntervalSnapshot:
    """What a worker needs in memory to own an interval, read by :meth:`IntervalStore.scan`.

    ``dedup_ids`` are the unexpired IDs (to fill the Bloom filter); ``productions`` are the
    pending ones (to resend); ``timers`` all timers of all keys. State is read per key, lazily.
    """

    timers: tuple[Timer, ...]
    productions: tuple[Production, ...]
    dedup_ids: tuple[bytes, ...]


class IntervalStore(ABC):
    """Per-interval persistent state, written only under the interval's sequencer.

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
    def scan(self, lease: Lease) -> IntervalSnapshot:
        """All timers, pending productions and unexpired dedup IDs of the interval."""

    @abstractmethod
    def read_state(self, lease: Lease, key: str) -> bytes | None:
        """The committed state of ``key``, or ``None`` if it has none."""

    @abstractmethod
    def has_seen(self, lease: Lease, key: str, record_ids: Collection[bytes]) -> Set[bytes]:
        """The IDs among ``record_ids`` committed as dedup IDs of ``key`` and not expired."""

    @abstractmethod
    def commit(self, lease: Lease, changes: Sequence[KeyChanges], *, dedup_ttl: int) -> None:
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
        """

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
