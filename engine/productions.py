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
"""

from __future__ import annotations

import enum
from collections.abc import Sequence, Set
from dataclasses import dataclass, field
from typing import Protocol

from millstream.engine.records import Record, encode_record

__all__ = ["Production", "ProductionPolicy", "ProductionSink"]


class ProductionPolicy(enum.Enum):
    """When productions are checkpointed relative to being sent."""

    STRONG = "strong"
    WEAK = "weak"


@dataclass(frozen=True, slots=True)
class Production:
    """A record bound for a named stream.

    ``encoded`` is the record's envelope if the producer already encoded it (the engine does,
    to check its size), so the store and the sink do not encode it again.
    """

    stream: str
    record: Record
    encoded: bytes | None = field(default=None, compare=False, repr=False)

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
    """

    def send(self, productions: Sequence[Production], timeout: float) -> Set[bytes]: ...
