"""The user's computation: code that runs per key on records and timers (paper 5.1).

Subclass :class:`Computation` and override :meth:`~Computation.process_record` (and
:meth:`~Computation.process_timer` if it sets timers)::

    class WindowCounter(Computation):
        def process_record(self, ctx: Context, record: Record) -> None:
            count = ctx.state(IntCodec())
            count.set(count.get(0) + 1)
            ctx.set_timer("flush", window_end(record.timestamp))

        def process_timer(self, ctx: Context, timer: Timer) -> None:
            count = ctx.state(IntCodec()).get(0)
            ctx.produce("counts", IntCodec().encode(count), timer.timestamp)
            ctx.clear_state()

The engine serializes calls per key and retries them after failures, hiding duplicates as long
as the computation keeps all per-key data in the context. One instance serves many keys (and
may run in several processes at once), so attributes must hold only configuration. External
side effects are not covered by the exactly-once guarantee; make them idempotent.

A computation whose input streams carry deletions as Kafka tombstones (messages with a key
and no value) can take them: ``ComputationOptions(tombstones="deliver")`` and
:meth:`~Computation.process_deletion`. Otherwise they are dead letters.
"""

from __future__ import annotations

from millstream.engine.context import Context
from millstream.engine.records import Deletion, Record
from millstream.engine.timers import Timer

__all__ = ["Computation"]


class Computation:
    """Base class of user computations; the engine calls these hooks, one key at a time."""

    def process_record(self, ctx: Context, record: Record) -> None:
        """Handle one input record for ``ctx.key``; raise to dead-letter the record."""
        raise NotImplementedError(
            f"{type(self).__name__} receives records but does not override process_record"
        )

    def process_timer(self, ctx: Context, timer: Timer) -> None:
        """Handle a due timer of ``ctx.key``; raise to dead-letter the firing."""
        raise NotImplementedError(
            f"{type(self).__name__} set timer {timer.tag!r} but does not override process_timer"
        )

    def process_deletion(self, ctx: Context, deletion: Deletion) -> None:
        """Handle a Kafka tombstone of ``ctx.key`` (``deletion.key``), with
        ``ComputationOptions(tombstones="deliver")``; raise to dead-letter it.

        Called in order with the key's records, exactly once per tombstone on the stream
        (see :class:`~millstream.engine.records.Deletion`): clear the key's state here
        (``ctx.clear_state()``), delete its timers, produce what the deletion means.
        """
        raise NotImplementedError(
            f"{type(self).__name__} takes tombstones as deletions but does not override "
            "process_deletion"
        )
