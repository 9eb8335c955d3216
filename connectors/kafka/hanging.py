"""Hanging Kafka transactions: found and aborted, as ``kafka-transactions.sh`` does by hand.

A transaction *hangs* on a partition when the partition holds its records without an end
marker while its coordinator no longer counts that partition in any transaction of the
producer: nothing will ever write the marker. The first such record pins the partition's last
stable offset for good, so ``read_committed`` readers (every Spark source millstream runs)
see nothing after it, and a ``require_stable`` offset fetch of a group whose transactional
commit sits there (an interval's transaction marker,
:mod:`~millstream.connectors.kafka.transactions`) is refused as unstable, every time. Kafka
leaves such a transaction to an operator (KIP-664: ``kafka-transactions.sh find-hanging``,
then ``abort``).
The proving ground met one after a ``kill -9`` of the single local broker in the middle of
interval transactions: the interval's outputs and its marker stayed stuck until the run's
outage timeout.

:func:`find_hanging` follows ``find-hanging``: the open transactions of the partitions
(DescribeProducers) whose last write is older than ``older_than_ms``, then the coordinator
is asked (ListTransactions by producer ID, DescribeTransactions) whether the producer's
transaction still counts each partition; one it does not count hangs, and
:meth:`TransactionAdmin.abort` writes its abort marker (WriteTxnMarkers). A transaction its
coordinator still holds is never touched, however old: the coordinator ends it itself.

:class:`HangingTransactionSweeper` does that every :data:`SWEEP_SECONDS` in the driver, over
the streams the topology's transactional computations write and the consumer offsets topic
(where the markers are). librdkafka has none of those four calls, so they go through Kafka's
Java admin client in the driver's JVM (:class:`JavaTransactionAdmin`; Spark's Kafka
connector brings it). On a secured cluster the driver's principal needs ``Describe`` on the
topics (``__consumer_offsets`` included) and ``Describe`` on the transactional IDs; a sweep
it may not make is logged, with the command to run by hand.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

from millstream.connectors.kafka.transactions import TRANSACTIONAL_ID_PREFIX
from millstream.engine.clock import Clock
from millstream.engine.outages import first_line

__all__ = [
    "CONSUMER_OFFSETS_TOPIC",
    "SWEEP_SECONDS",
    "HangingTransactionSweeper",
    "JavaTransactionAdmin",
    "OpenTransaction",
    "TransactionAdmin",
    "find_hanging",
    "hanging_after",
]

_log = logging.getLogger(__name__)

CONSUMER_OFFSETS_TOPIC: Final = "__consumer_offsets"

SWEEP_SECONDS: Final = 30.0
"""The time between two sweeps of a driver."""

Partition = tuple[str, int]


def hanging_after(transaction_timeout: float) -> float:
    """Seconds a transaction must have been silent on a partition before it may be taken for
    hanging: twice the producers' transaction timeout, and at least a minute (its coordinator
    aborts one it holds within the timeout plus its 10 s cleanup period)."""
    return max(60.0, 2 * transaction_timeout)


@dataclass(frozen=True, slots=True)
class OpenTransaction:
    """A transaction open on one partition: its producer, the offset where it begins, when
    its producer last wrote there (ms since the epoch) and the coordinator epoch of that
    write (what an abort marker must carry)."""

    topic: str
    partition: int
    producer_id: int
    producer_epoch: int
    start_offset: int
    last_timestamp_ms: int
    coordinator_epoch: int

    def __str__(self) -> str:
        return (
            f"producer {self.producer_id} epoch {self.producer_epoch} on "
            f"{self.topic}-{self.partition} from offset {self.start_offset}"
        )


class TransactionAdmin(Protocol):
    """The four Kafka admin calls a sweep makes (KIP-664)."""

    def partitions(self, topics: Sequence[str]) -> list[Partition]:
        """Every partition of the topics that exist (a missing topic has none)."""

    def open_transactions(self, partitions: Sequence[Partition]) -> list[OpenTransaction]:
        """DescribeProducers: the transactions open on the partitions."""

    def transactional_ids(self, producer_ids: Iterable[int]) -> dict[int, str]:
        """ListTransactions: the transactional ID of each producer its coordinator knows."""

    def transaction_partitions(self, transactional_ids: Iterable[str]) -> dict[str, set[Partition]]:
        """DescribeTransactions: the partitions each transactional ID's current transaction
        counts (written in it, or still waiting for its marker)."""

    def abort(self, transaction: OpenTransaction) -> None:
        """WriteTxnMarkers: abort the transaction on its partition."""


def find_hanging(
    admin: TransactionAdmin,
    partitions: Sequence[Partition],
    *,
    now_ms: int,
    older_than_ms: int,
    own_prefix: str = TRANSACTIONAL_ID_PREFIX,
) -> list[OpenTransaction]:
    """The transactions hanging on ``partitions`` (``kafka-transactions.sh find-hanging``):
    open, silent for more than ``older_than_ms``, and not counted by their coordinator.

    On the consumer offsets topic, which every application's transactions share, only
    millstream's own count: a producer that also hangs on one of the other partitions, or
    whose transactional ID begins with ``own_prefix``. A coordinator that does not list a
    producer may only be hiding it from a principal without ``Describe`` on its
    transactional ID, and another application's transaction is not the driver's to end.
    """
    candidates = [
        t
        for t in admin.open_transactions(partitions)
        if now_ms - t.last_timestamp_ms > older_than_ms
    ]
    if not candidates:
        return []
    ids = admin.transactional_ids({t.producer_id for t in candidates})
    counted = admin.transaction_partitions(set(ids.values())) if ids else {}
    on_streams = {t.producer_id for t in candidates if t.topic != CONSUMER_OFFSETS_TOPIC}
    hanging = []
    for transaction in candidates:
        transactional_id = ids.get(transaction.producer_id)
        held = counted.get(transactional_id, set()) if transactional_id is not None else set()
        if (transaction.topic, transaction.partition) in held:
            continue
        ours = transaction.producer_id in on_streams or (
            transactional_id is not None and transactional_id.startswith(own_prefix)
        )
        if transaction.topic != CONSUMER_OFFSETS_TOPIC or ours:
            hanging.append(transaction)
    return hanging


class JavaTransactionAdmin:
    """:class:`TransactionAdmin` on Kafka's Java ``Admin`` in a JVM reached through py4j (a
    Spark driver's ``sparkContext._jvm``), made with ``settings`` (the Java client settings:
    bootstrap servers and security). Each call waits at most ``timeout`` seconds."""

    def __init__(self, jvm: Any, settings: Mapping[str, str], timeout: float = 10.0) -> None:
        self._jvm = jvm
        self._timeout_ms = int(timeout * 1000)
        properties = jvm.java.util.Properties()
        for key, value in settings.items():
            properties.setProperty(key, value)
        properties.setProperty("client.id", "millstream-hanging-transactions")
        # Each call ends within the timeout, on the client's side too.
        properties.setProperty("default.api.timeout.ms", str(self._timeout_ms))
        properties.setProperty("request.timeout.ms", str(self._timeout_ms))
        self._admin = jvm.org.apache.kafka.clients.admin.AdminClient.create(properties)

    def _get(self, future: Any) -> Any:
        return future.get(self._timeout_ms, self._jvm.java.util.concurrent.TimeUnit.MILLISECONDS)

    def _list(self, items: Iterable[Any]) -> Any:
        listed = self._jvm.java.util.ArrayList()
        for item in items:
            listed.add(item)
        return listed

    def partitions(self, topics: Sequence[str]) -> list[Partition]:
        existing = set(self._get(self._admin.listTopics(self._listing_internal()).names()))
        wanted = [t for t in topics if t in existing]
        if not wanted:
            return []
        described = self._get(self._admin.describeTopics(self._list(wanted)).allTopicNames())
        found: list[Partition] = []
        for topic in wanted:
            for info in described.get(topic).partitions():
                found.append((topic, int(info.partition())))
        return found

    def _listing_internal(self) -> Any:
        return self._jvm.org.apache.kafka.clients.admin.ListTopicsOptions().listInternal(True)

    def open_transactions(self, partitions: Sequence[Partition]) -> list[OpenTransaction]:
        if not partitions:
            return []
        kafka = self._jvm.org.apache.kafka
        wanted = self._list(kafka.common.TopicPartition(t, p) for t, p in partitions)
        states = self._get(self._admin.describeProducers(wanted).all())
        found: list[OpenTransaction] = []
        for entry in states.entrySet().toArray():
            where = entry.getKey()
            for producer in entry.getValue().activeProducers().toArray():
                start = producer.currentTransactionStartOffset()
                if not start.isPresent():
                    continue
                epoch = producer.coordinatorEpoch()
                found.append(
                    OpenTransaction(
                        topic=str(where.topic()),
                        partition=int(where.partition()),
                        producer_id=int(producer.producerId()),
                        producer_epoch=int(producer.producerEpoch()),
                        start_offset=int(start.getAsLong()),
                        last_timestamp_ms=int(producer.lastTimestamp()),
                        coordinator_epoch=int(epoch.getAsInt()) if epoch.isPresent() else 0,
                    )
                )
        return found

    def transactional_ids(self, producer_ids: Iterable[int]) -> dict[int, str]:
        # Every listing, matched here: py4j sends a small number as an Integer, which the
        # producer ID filter's Set<Long> cannot take. Asked only when a transaction is
        # old enough to be suspect, which is rare.
        wanted = set(producer_ids)
        listings = self._get(self._admin.listTransactions().all())
        return {
            producer_id: str(listing.transactionalId())
            for listing in listings.toArray()
            if (producer_id := int(listing.producerId())) in wanted
        }

    def transaction_partitions(self, transactional_ids: Iterable[str]) -> dict[str, set[Partition]]:
        wanted = list(transactional_ids)
        if not wanted:
            return {}
        described = self._get(self._admin.describeTransactions(self._list(wanted)).all())
        return {
            str(entry.getKey()): {
                (str(tp.topic()), int(tp.partition()))
                for tp in entry.getValue().topicPartitions().toArray()
            }
            for entry in described.entrySet().toArray()
        }

    def abort(self, transaction: OpenTransaction) -> None:
        kafka = self._jvm.org.apache.kafka
        spec = kafka.clients.admin.AbortTransactionSpec(
            kafka.common.TopicPartition(transaction.topic, transaction.partition),
            # py4j widens or narrows a Python int to the long and short the signature takes.
            transaction.producer_id,
            transaction.producer_epoch,
            transaction.coordinator_epoch,
        )
        self._get(self._admin.abortTransaction(spec).all())

    def close(self) -> None:
        """Close the client at once: a call under way fails instead of being waited for."""
        self._admin.close(self._jvm.java.time.Duration.ZERO)


class HangingTransactionSweeper:
    """Aborts the transactions hanging on the partitions of ``topics()`` (and of the consumer
    offsets topic), every ``every`` seconds on a thread of its own (:meth:`start`,
    :meth:`stop`), or once (:meth:`sweep`). ``admin`` makes the admin client at the first
    sweep; ``clock`` says the time (µs). :attr:`aborted` lists what it aborted, and
    ``on_abort`` is told of each (metrics)."""

    def __init__(
        self,
        admin: Callable[[], TransactionAdmin],
        topics: Callable[[], Sequence[str]],
        clock: Clock,
        *,
        older_than: float,
        every: float = SWEEP_SECONDS,
        on_abort: Callable[[OpenTransaction], None] | None = None,
    ) -> None:
        self._make_admin = admin
        self._on_abort = on_abort
        self._admin: TransactionAdmin | None = None
        self._topics = topics
        self._clock = clock
        self.older_than = older_than
        self.every = every
        self.aborted: list[OpenTransaction] = []
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def sweep(self) -> list[OpenTransaction]:
        """Find the hanging transactions and abort them: those aborted now. No topics, no
        sweep: the markers are only there for a topology that writes some."""
        streams = self._topics()
        if not streams:
            return []
        with self._lock:
            if self._admin is None:
                self._admin = self._make_admin()
            admin = self._admin
            topics = sorted({*streams, CONSUMER_OFFSETS_TOPIC})
            now_ms = self._clock.now() // 1000
            hanging = find_hanging(
                admin,
                admin.partitions(topics),
                now_ms=now_ms,
                older_than_ms=int(self.older_than * 1000),
            )
            done = []
            for transaction in hanging:
                _log.warning(
                    "aborting a hanging Kafka transaction (its coordinator no longer counts "
                    "it; silent for %.0f s): %s",
                    (now_ms - transaction.last_timestamp_ms) / 1000,
                    transaction,
                )
                admin.abort(transaction)
                done.append(transaction)
                if self._on_abort is not None:
                    self._on_abort(transaction)
            self.aborted += done
            return done

    def start(self) -> None:
        """Sweep every ``every`` seconds until :meth:`stop` (again after a stop)."""
        if self._thread is not None:
            return
        self._stopped.clear()
        self._thread = threading.Thread(
            target=self._run, name="millstream-hanging-transactions", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        while not self._stopped.wait(self.every):
            try:
                self.sweep()
            except Exception as exc:  # a failed sweep is told, and tried again
                if self._stopped.is_set():
                    return  # stopped mid-sweep: its admin client was closed under it
                # Kafka down (its outage is the batches' to report), or no permission.
                _log.warning(
                    "could not look for hanging Kafka transactions (tried again in %.0f s; "
                    "by hand: kafka-transactions.sh find-hanging, then abort): %s",
                    self.every,
                    first_line(exc),
                )

    def stop(self) -> None:
        """Stop sweeping and close the admin client (a sweep under way fails with it: a
        stop never waits out a Kafka that does not answer)."""
        self._stopped.set()
        admin, self._admin = self._admin, None
        close = getattr(admin, "close", None)
        if close is not None:
            close()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()
