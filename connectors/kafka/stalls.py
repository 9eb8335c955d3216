"""Stalls of transactional output streams: a partition whose last stable offset stays behind.

A ``read_committed`` reader of a partition stops at its *last stable offset* (LSO): the first
offset of the oldest transaction still open on it. While a transaction is open the LSO is
behind the partition's high watermark, which is normal for the moment an interval's
productions are being delivered; it becomes a *stall* when the LSO does not move for
:data:`STALL_AFTER_SECONDS`: a producer died mid-transaction (a killed driver or worker), and
readers wait until the interval's next owner opens its producer (which aborts the
transaction) or until the broker aborts it at ``transaction.timeout.ms``
(``[kafka] transaction_timeout``), whichever comes first. That timeout is therefore the bound
on a stall; :class:`StableOffsetWatch` counts the stalls it sees, for the metrics.

It reads both offsets of every partition with the admin client's ``list_offsets``
(``READ_COMMITTED`` gives the LSO, ``READ_UNCOMMITTED`` the high watermark), at most every
:data:`PROBE_SECONDS`, on the clock it is given.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from confluent_kafka import IsolationLevel, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from millstream.connectors.kafka.topics import admin_client, stream_topic
from millstream.engine.clock import Clock
from millstream.engine.config import MillstreamConfig

__all__ = [
    "PROBE_SECONDS",
    "STALL_AFTER_SECONDS",
    "StableOffsetWatch",
    "StallTracker",
    "TransactionStalls",
    "latest_offsets",
    "stable_offsets",
]

_log = logging.getLogger(__name__)

STALL_AFTER_SECONDS: Final = 10.0
"""How long a partition's LSO must stay behind its high watermark, unmoved, to be a stall: far
longer than a live owner keeps a transaction open (one interval's send and commit)."""

PROBE_SECONDS: Final = 5.0
"""The least time between two reads of the offsets."""

Partition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class TransactionStalls:
    """What a probe found: ``stalled`` partitions (their LSO behind and unmoved for the stall
    time), of which ``new`` were not stalled at the previous probe; ``longest`` seconds the
    oldest of them has been stuck; ``unstable`` messages behind the LSOs of all partitions
    (written by open transactions, or aborted ones' markers not yet passed)."""

    stalled: int = 0
    new: int = 0
    longest: float = 0.0
    unstable: int = 0


@dataclass(slots=True)
class _Behind:
    stable: int  # the LSO when first seen behind
    since: int  # µs
    stalled: bool = False


@dataclass(slots=True)
class StallTracker:
    """Turns successive offset reads into :class:`TransactionStalls` (no I/O: the rule alone)."""

    stall_after: float = STALL_AFTER_SECONDS
    _behind: dict[Partition, _Behind] = field(default_factory=dict)

    def observe(self, offsets: Mapping[Partition, tuple[int, int]], now: int) -> TransactionStalls:
        """``offsets``: each partition's (last stable offset, high watermark); ``now`` in µs."""
        stalled = new = unstable = 0
        longest = 0.0
        behind: dict[Partition, _Behind] = {}
        for partition, (stable, high) in offsets.items():
            if stable >= high:
                continue
            unstable += high - stable
            seen = self._behind.get(partition)
            if seen is None or seen.stable != stable:
                seen = _Behind(stable, now)
            stuck = (now - seen.since) / 1e6
            if stuck >= self.stall_after:
                stalled += 1
                new += not seen.stalled
                seen.stalled = True
                longest = max(longest, stuck)
            behind[partition] = seen
        self._behind = behind
        return TransactionStalls(stalled, new, longest, unstable)


def stable_offsets(
    admin: AdminClient, topics: Sequence[str], timeout: float = 10.0
) -> dict[Partition, tuple[int, int]]:
    """Each partition of ``topics``: (last stable offset, high watermark)."""
    partitions: list[TopicPartition] = []
    for topic in topics:
        metadata = admin.list_topics(topic, timeout=timeout).topics[topic]
        if metadata.error is not None:
            raise KafkaException(metadata.error)
        partitions += [TopicPartition(topic, p) for p in sorted(metadata.partitions)]
    if not partitions:
        return {}
    places = [(tp.topic, tp.partition) for tp in partitions]
    stable = latest_offsets(admin, places, IsolationLevel.READ_COMMITTED, timeout)
    high = latest_offsets(admin, places, IsolationLevel.READ_UNCOMMITTED, timeout)
    return {partition: (stable[partition], high[partition]) for partition in stable}


def latest_offsets(
    admin: AdminClient, partitions: Sequence[Partition], level: IsolationLevel, timeout: float
) -> dict[Partition, int]:
    """Each of ``partitions``' end as a reader at ``level`` sees it: the last stable offset
    (``READ_COMMITTED``: below it every transaction is decided) or the high watermark
    (``READ_UNCOMMITTED``). One request per leader broker, not one per partition."""
    futures = admin.list_offsets(
        {TopicPartition(t, p): OffsetSpec.latest() for t, p in partitions},  # type: ignore[no-untyped-call]
        isolation_level=level,
        request_timeout=timeout,
    )
    return {(tp.topic, tp.partition): future.result().offset for tp, future in futures.items()}


class StableOffsetWatch:
    """Watches the partitions of ``streams`` for stalls (:meth:`probe`, after each batch)."""

    def __init__(
        self,
        config: MillstreamConfig,
        streams: Sequence[str],
        clock: Clock,
        *,
        stall_after: float = STALL_AFTER_SECONDS,
        every: float = PROBE_SECONDS,
    ) -> None:
        self.config = config
        self.topics = sorted({stream_topic(s) for s in streams})
        self.clock = clock
        self.every = every
        self.tracker = StallTracker(stall_after)
        self.last = TransactionStalls()
        self._probed: int | None = None
        self._admin: AdminClient | None = None

    def probe(self) -> TransactionStalls | None:
        """The stalls now, or ``None`` if the last probe was less than ``every`` seconds ago.
        Kafka not answering is no stall to count: it is logged and the probe skipped (the
        batch's own Kafka calls report the outage)."""
        now = self.clock.now()
        if self._probed is not None and now - self._probed < self.every * 1e6:
            return None
        self._probed = now
        if self._admin is None:
            self._admin = admin_client(self.config)
        try:
            offsets = stable_offsets(self._admin, self.topics)
        except KafkaException as exc:
            _log.info("stable offsets of %s not read: %s", ", ".join(self.topics), exc)
            return None
        self.last = self.tracker.observe(offsets, now)
        if self.last.new:
            _log.warning(
                "%d partition(s) of %s stalled: their last stable offset has not moved for "
                "%.0f s (a producer died in a transaction; the interval's next owner or the "
                "transaction timeout ends it)",
                self.last.new,
                ", ".join(self.topics),
                self.last.longest,
            )
        return self.last
