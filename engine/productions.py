"""Productions: records a computation sends downstream, and how they survive failures.

Every production has a deterministic record ID (see :mod:`millstream.engine.records`), so
sending one twice is harmless: consumers drop the second copy. What the policy decides is when
a production is checkpointed in the store relative to being sent (paper 6.1.2, 6.1.3):

* :attr:`ProductionPolicy.STRONG`: written as a *pending production* in the same atomic commit
  as the state change that made it, sent after the commit, and deleted once the sink
  acknowledged it. A worker that takes over an interval resends every pending production it
  finds. Downstream sees the result of exactly one execution of the call, even if user code is
  not deterministic.
* :attr:`ProductionPolicy.WEAK`: sent *before* the commit and awaited for a short delay; only
  the stragglers not acknowledged by then are checkpointed (and resent like strong ones). This
  saves a store write per production but, after a crash before the commit, the retried call
  sends again: correct only for computations whose output is a deterministic function of the
  input (idempotent computations).

Dead letters are always checkpointed, whatever the policy.

**Transactional productions** (``ComputationOptions.transactional_productions``, on by default
for exactly-once computations with strong productions) make the delivery itself exactly-once
for every reader, not only for millstream's deduplicating consumers. Each commit's checkpointed
productions carry a :class:`CommitTag` (the lease token and the commit's number under it, so
tags order as commits happen). A :class:`TransactionalSink` sends an interval's productions in
one transaction that also records a *marker*: the highest tag delivered so far. A worker that
takes an interval over first :meth:`~TransactionalSink.open` s it, which fences every earlier
producer of the interval (aborting its open transaction) and returns the marker: pending
productions tagged at or below it were delivered and are dropped without a resend; the rest
go in a new transaction. A transaction whose outcome is unknown is resolved the same way.

A commit the sink answered counts only once it is *settled*: the interval's marker, read
once no transaction holds it pending, covers it (:meth:`TransactionalSink.settled`). Kafka
can answer a commit and never complete it: a broker killed as the commit completed may,
restarting, skip the transaction's markers (it takes the partitions for deleted), which
leaves the transaction hanging until a sweep aborts it
(:mod:`millstream.connectors.kafka.hanging`). Until a commit settles, its productions stay
pending (and hold the watermark); one that does not is resolved by the marker like an
unknown outcome.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence, Set
from dataclasses import dataclass, field
from typing import Protocol, Self

from millstream.engine.records import Record, encode_record

__all__ = [
    "CommitTag",
    "DeliveryOutcome",
    "Production",
    "ProductionPolicy",
    "ProductionSink",
    "StagedTransaction",
    "TransactionUnavailableError",
    "TransactionalSink",
    "delivered_by",
]


class ProductionPolicy(enum.Enum):
    """When productions are checkpointed relative to being sent."""

    STRONG = "strong"
    WEAK = "weak"


@dataclass(frozen=True, order=True, slots=True)
class CommitTag:
    """Names one commit of an interval: the ``token`` of the lease that made it and its
    ``number`` under that lease. Tokens only grow (:mod:`millstream.engine.sequencer`), so
    tags order as the commits happened."""

    token: int
    number: int

    def encode(self) -> str:
        return f"{self.token}:{self.number}"

    @classmethod
    def decode(cls, text: str) -> Self:
        token, _, number = text.partition(":")
        return cls(int(token), int(number))


@dataclass(frozen=True, slots=True)
class Production:
    """A record bound for a named stream.

    ``encoded`` is the record's envelope if the producer already encoded it (the engine does,
    to check its size), so the store and the sink do not encode it again. ``tag`` names the
    commit that checkpointed it when its computation's productions are transactional
    (``None``: not checkpointed yet, or by a commit that did not tag it; such a production
    is never taken for delivered).
    """

    stream: str
    record: Record
    encoded: bytes | None = field(default=None, compare=False, repr=False)
    tag: CommitTag | None = field(default=None, compare=False)

    @property
    def record_id(self) -> bytes:
        return self.record.record_id

    @property
    def envelope(self) -> bytes:
        """The record, Avro single-object encoded."""
        return self.encoded if self.encoded is not None else encode_record(self.record)


class ProductionSink(Protocol):
    """Where productions go (Kafka in production, a list in tests).

    ``send`` delivers each production to its stream at least once and returns the IDs of those
    the destination durably acknowledged within ``timeout`` seconds. A production whose ID is
    missing may or may not have been delivered; the engine keeps it pending and sends it again
    later, relying on consumers to deduplicate by record ID. Raising means nothing is known
    about any of them. Sending a production that was already delivered must be harmless.

    A worker calls ``send`` one call at a time, but not always from one thread: a large batch
    of weak productions is sent from a thread of the batch's while its later keys run
    (:data:`~millstream.engine.weak_productions.WEAK_SEND_CHUNK`), and workers of several intervals
    may share one sink.
    """

    def send(self, productions: Sequence[Production], timeout: float) -> Set[bytes]: ...


def delivered_by(tag: CommitTag | None, marker: CommitTag | None) -> bool:
    """Whether a production checkpointed by the commit ``tag`` was delivered, as the
    interval's transaction ``marker`` says (an untagged production never counts as such)."""
    return tag is not None and marker is not None and tag <= marker


class DeliveryOutcome(enum.Enum):
    """What :meth:`TransactionalSink.deliver` knows of its transaction."""

    COMMITTED = "committed"
    UNKNOWN = "unknown"
    """Aborted, or its commit's outcome not known: :meth:`~TransactionalSink.open` tells."""
    FENCED = "fenced"
    """Another producer of the interval was opened since: this one is void."""


class TransactionUnavailableError(Exception):
    """The transaction coordinator did not answer in time; nothing was decided.

    Not a :class:`~millstream.engine.errors.MillstreamError` of the batch: the worker keeps
    the productions pending and opens the interval again at its next delivery.
    """


class StagedTransaction(Protocol):
    """A transaction begun with its productions and marker sent, not committed yet
    (:meth:`TransactionalSink.stage`): read_committed readers see none of it until
    :meth:`commit`, and nothing of it after :meth:`abort`."""

    def commit(self) -> DeliveryOutcome:
        """Commit it, as :meth:`TransactionalSink.deliver` would have (and with the same
        outcomes): the staging's own failure (a fenced producer, an unanswered call) is
        reported here."""
        ...

    def abort(self) -> None:
        """Abort it: the commit it waited for did not happen. Raises nothing; a producer
        that cannot abort is dropped, and the interval's next open aborts the transaction."""
        ...


class TransactionalSink(Protocol):
    """Delivers an interval's productions in transactions that record what was delivered
    (Kafka transactions in production, :class:`~millstream.engine.testing.TestingTransactions`
    in tests). One producer per interval; calls for different intervals may run on several
    threads at once."""

    def prepare(self, computation: str, interval: int, timeout: float, token: int) -> None:
        """Begin the interval's next :meth:`open` in the background, for the lease ``token``
        (an open with that token then waits for it), so that its round trips overlap the
        batch's reads, user code and commit; the fencing happens as it runs. Raises nothing:
        the open reports a failure."""
        ...

    def open(
        self, computation: str, interval: int, timeout: float, token: int | None = None
    ) -> CommitTag | None:
        """Become the interval's only producer: fence every producer opened before (an open
        transaction of theirs is aborted, one being committed completes first), then return
        the marker of the last committed transaction (``None``: none ever). Takes the open
        prepared for the same lease ``token``, if any (one prepared for another lease may
        have been fenced since by a later owner's, and is dropped). Raises
        :class:`TransactionUnavailableError` if that cannot be done within ``timeout``."""
        ...

    def ready(self, computation: str, interval: int, token: int) -> bool:
        """Whether the open :meth:`prepare` began for the lease ``token`` has finished
        without failing, so that :meth:`open` would return its marker at once."""
        ...

    def deliver(
        self,
        computation: str,
        interval: int,
        productions: Sequence[Production],
        marker: CommitTag,
        timeout: float,
    ) -> DeliveryOutcome:
        """Send ``productions`` and record ``marker`` in one transaction of the interval's
        producer (opened before); readers of committed data see all of them or none."""
        ...

    def settled(self, computation: str, interval: int, marker: CommitTag, timeout: float) -> bool:
        """Whether the transaction of the interval that recorded ``marker``, whose commit was
        answered, is settled: the interval's marker, read once no transaction holds it
        pending, is ``marker`` or later. ``False`` when it is earlier (the transaction was
        aborted after all) or not readable so within ``timeout``. Raises nothing."""
        ...

    def stage(
        self,
        computation: str,
        interval: int,
        productions: Sequence[Production],
        marker: CommitTag,
        timeout: float,
    ) -> StagedTransaction | None:
        """Begin what :meth:`deliver` does, in the background, short of the commit, so that
        its round trips overlap the store commit that checkpoints the productions; the
        worker commits it once that commit landed, or aborts it. ``None``: the interval's
        producer is not open here (the worker delivers after its commit, opening first)."""
        ...
