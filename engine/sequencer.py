"""Sequencers: the lease that makes one worker the only writer of a key interval (paper 6.2).

Every key interval of a computation has a sequencer, an integer stored with the interval's
data. A worker taking an interval over *acquires* it: one linearizable write moves the
sequencer forward to a value nobody held before, and that value becomes the worker's
:class:`Lease` token. Every later write of the worker carries the condition
``sequencer == token``, so once another worker has acquired the interval, no write of the
first one (a zombie: a retried or speculative task, a replayed batch, a delayed packet) can
apply. It fails with :class:`~millstream.engine.errors.FencedError` instead.

Acquiring also tells a worker whether its *soft state* (cached per-key state, the timer set,
the pending productions, the dedup Bloom filter) still describes the store. Passing the lease
of its previous batch, it learns ``cache_valid``: true exactly when the sequencer still held
that lease's token, i.e. no one else acquired the interval in between, so nothing but this
worker wrote to it. Otherwise the worker must rescan the interval before trusting any cache:
a scan started before a competitor's last write could miss it (paper figure 12).

An owner with strong productions keeps its lease across batches while a cheap read of the
sequencer says it still holds it (:mod:`millstream.engine.protocol`, step 1).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["INITIAL_SEQUENCER", "Lease"]

# The sequencer of an interval nobody has acquired yet; the first lease gets token 1.
INITIAL_SEQUENCER = 0


@dataclass(frozen=True, slots=True)
class Lease:
    """A worker's claim on ``interval`` of ``computation``, valid until someone acquires again.

    ``token`` is the sequencer value written at acquisition; ``cache_valid`` says whether the
    acquiring worker's soft state from its previous lease can be reused. ``conflicts``
    counts the acquire's attempts that lost to another writer or had an unknown outcome
    (sequencer conflicts: each cost one more conditional write).
    """

    computation: str
    interval: int
    token: int
    cache_valid: bool
    conflicts: int = 0
