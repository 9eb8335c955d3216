"""Transactional productions on Kafka: one transaction per interval commit, with a marker.

:class:`KafkaTransactionalSink` is the :class:`~millstream.engine.productions.TransactionalSink`
the executors use. Per key interval it keeps one transactional producer whose
``transactional.id`` is derived from the store (keyspace, table and the table's incarnation:
:func:`store_namespace`), the computation and the interval, so that a new owner's
``init_transactions()`` fences the old owner's producer, as the interval's sequencer fences
its store writes, and aborts its open transaction (or waits for one being committed to
complete).

The marker: every transaction also commits, through ``send_offsets_to_transaction``, an offset
for partition 0 of :func:`transaction_marker_topic` in a consumer group named like the
transactional ID. The offset is the commit tag's lease token and its metadata the whole tag
(``millstream-commit <token>:<number>``). Offsets committed in a transaction become visible
only if it commits, so the group's committed offset says, atomically with the productions,
which commits were delivered. Nothing is ever written to the marker topic itself.

Reading the marker after ``init_transactions()`` uses ``require_stable`` (KIP-447): the
broker answers only once no transaction holds that offset pending.

**Settling a commit** (:meth:`KafkaTransactionalSink.settled`): after ``commit_transaction()``
returns, the marker is read back the same way, asked again while the broker answers that a
transaction holds it (it does for a few milliseconds after most commits, until the
coordinator's markers land). The answer of ``commit_transaction()`` alone is not enough: it
comes once the coordinator logged its decision, before the markers are written, and a broker
restarted in between may skip them for good (Kafka 4.3's coordinator takes a partition whose
leader its metadata does not know yet for deleted: "Couldn't find leader endpoint for
partitions ..., likely deleted already and hence can be skipped"), leaving the transaction
hanging until :mod:`~millstream.connectors.kafka.hanging` aborts it. The proving ground lost
a commit's productions so before commits were settled.

**Staged transactions** (:meth:`KafkaTransactionalSink.stage`): a worker that kept its
interval has the transaction begun, its productions produced and its marker added on a thread
of its own while its Cassandra commit runs, and commits it (:meth:`_Staged.commit`) once that
commit landed, or aborts it. Its records are invisible to ``read_committed`` readers until
then; librdkafka sends them as they are produced (``linger.ms`` 0), so the commit finds little
left to flush.

A producer is made when a batch with input begins on an interval whose producer is not open
here (:meth:`KafkaTransactionalSink.prepare`, on a thread of its own, so that the open's round
trips overlap the batch's reads, user code and commit: librdkafka takes 50 to 500 ms to find a
new producer's coordinator), kept while this process owns the interval, and closed when idle
for :data:`IDLE_SECONDS` or when the process holds more than :data:`MAX_PRODUCERS` (its next
delivery then opens it again, which resolves any pending productions by the marker).

**Bounded calls.** librdkafka's ``send_offsets_to_transaction`` can block past its timeout,
for good, when the group coordinator went away during the call (a broker restarted:
confluentinc/librdkafka#5456 and #5511, open in 2.16; met by the proving ground's Kafka
kill). Every blocking transaction call therefore runs on a thread of its own, waited for
its timeout plus :data:`GRACE_SECONDS`: one that has not returned by then is abandoned with
its producer (the outcome is unknown; the next open fences that producer and aborts its
transaction) and counted in :attr:`KafkaTransactionalSink.abandoned`.
``send_offsets_to_transaction``, the call that gets stuck, has a timeout of its own, at most
:data:`OFFSETS_SECONDS`: it takes milliseconds when the coordinators answer, and a stuck one
held its interval's batch for the whole send timeout (35 s per batch after a broker's
restart in the proving ground), where giving up sooner only reopens the producer. An
abandoned call also renews the sink's admin client, which the same broker restart leaves
unanswering (see :meth:`KafkaTransactionalSink._read_marker`).

On a secured cluster the principal needs, besides what it has for its streams: ``Write`` and
``Describe`` on the transactional IDs (prefix ``millstream.``), ``Read`` on the groups (prefix
``millstream.``) and ``Read`` and ``Describe`` on the marker topic.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Final, TypeVar

from confluent_kafka import (
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

from millstream.connectors.kafka.clients import consumer, producer
from millstream.connectors.kafka.topics import admin_client, create_topics, stream_topic
from millstream.engine.config import MillstreamConfig
from millstream.engine.pause_points import pause_point
from millstream.engine.productions import (
    CommitTag,
    DeliveryOutcome,
    Production,
    TransactionUnavailableError,
)

__all__ = [
    "GRACE_SECONDS",
    "IDLE_SECONDS",
    "MAX_PRODUCERS",
    "OFFSETS_SECONDS",
    "SETTLE_SECONDS",
    "TRANSACTIONAL_ID_PREFIX",
    "KafkaTransactionalSink",
    "create_transaction_marker_topic",
    "delete_transaction_markers",
    "store_namespace",
    "transaction_marker_topic",
    "transactional_id",
]

_log = logging.getLogger(__name__)

IDLE_SECONDS: Final = 300.0
GRACE_SECONDS: Final = 5.0
SETTLE_SECONDS: Final = 10.0
"""The longest a commit's marker is read back for (:meth:`KafkaTransactionalSink.settled`)."""
_SETTLE_PAUSES: Final = (0.002, 0.005, 0.01, 0.02, 0.05, 0.1)
OFFSETS_SECONDS: Final = 10.0
"""The longest ``send_offsets_to_transaction`` is waited for (then :data:`GRACE_SECONDS`),
shorter than the send timeout: see the module docstring."""
_RETRY_BACKOFF_MS: Final = 10
MAX_PRODUCERS: Final = 256

_METADATA_PREFIX: Final = "millstream-commit "
# Errors that say this producer was superseded by a newer one of the same transactional ID.
_FENCED: Final = frozenset(
    {
        KafkaError._FENCED,
        KafkaError.PRODUCER_FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
    }
)
_MARKER_TOPIC_CONFIG: Final = {"cleanup.policy": "delete", "retention.ms": "3600000"}

_T = TypeVar("_T")


class _Stuck(Exception):  # noqa: N818  (an internal signal, not an error of the API)
    """A librdkafka call did not return within its timeout and grace."""


def _bounded(call: Callable[[], _T], timeout: float, what: str) -> _T:
    """``call()``, on a daemon thread waited for ``timeout`` + :data:`GRACE_SECONDS`: see
    the module docstring. Its exception, if any, is raised here."""
    outcome: list[_T] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            outcome.append(call())
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=run, name=f"millstream-{what}", daemon=True)
    thread.start()
    thread.join(timeout + GRACE_SECONDS)
    if thread.is_alive():
        raise _Stuck(f"{what} did not return within {timeout + GRACE_SECONDS:.0f} s")
    if failure:
        raise failure[0]
    return outcome[0]


def transaction_marker_topic(config: MillstreamConfig) -> str:
    """The topic whose partition 0 the transaction markers are committed offsets of."""
    return f"{config.kafka_watermark_topic}.transactions"


def create_transaction_marker_topic(config: MillstreamConfig, timeout: float = 30.0) -> None:
    """Create the marker topic (one partition, never written to); an existing one stays."""
    create_topics(
        config,
        [transaction_marker_topic(config)],
        partitions=1,
        timeout=timeout,
        topic_config=_MARKER_TOPIC_CONFIG,
    )


def delete_transaction_markers(
    config: MillstreamConfig, keyspace: str, timeout: float = 30.0
) -> list[str]:
    """Delete the marker groups of every interval whose store is in ``keyspace`` (once its
    state is dropped: a marker without its pending productions means nothing); the groups
    deleted. Kafka keeps a group's committed offsets for ``offsets.retention.minutes`` (7
    days by default) after its last commit otherwise."""
    admin = admin_client(config)
    prefix = f"millstream.{keyspace}."
    listed = admin.list_consumer_groups(request_timeout=timeout).result(timeout)
    groups = sorted(g.group_id for g in listed.valid if g.group_id.startswith(prefix))
    if groups:
        for future in admin.delete_consumer_groups(groups, request_timeout=timeout).values():
            future.result(timeout)
    return groups


def store_namespace(keyspace: str, table: str, table_id: uuid.UUID) -> str:
    """The namespace of the transactional IDs and markers of the intervals stored in
    ``keyspace.table``, whose Cassandra table ID is ``table_id``.

    The ID is in it because a marker outlives the table: Kafka keeps a group's offsets for
    days. A table dropped and created again (state reset by hand) starts its sequencers over,
    so an old marker would cover the new commits' tags and their productions would be taken
    for delivered; the new table's ID gives its intervals markers of their own."""
    return f"{keyspace}.{table}.{table_id.hex[:12]}"


TRANSACTIONAL_ID_PREFIX: Final = "millstream."
"""How every transactional ID (and marker group) of millstream begins."""


def transactional_id(namespace: str, computation: str, interval: int) -> str:
    """The transactional ID (and marker group) of an interval of a computation whose store
    is ``namespace`` (:func:`store_namespace`): stable across processes and restarts."""
    return f"{TRANSACTIONAL_ID_PREFIX}{namespace}.{computation}.{interval}"


@dataclass
class _Producer:
    producer: Producer
    group_metadata: object
    used: float


@dataclass(slots=True)
class _Opening:
    """An open begun in the background (prepare) for the lease ``token``."""

    future: Future[tuple[_Producer, CommitTag | None]]
    token: int
    began: float


class _Staged:
    """A transaction being staged on a thread of its own (:meth:`KafkaTransactionalSink.stage`):
    ``sent`` completes once its productions and marker are sent."""

    def __init__(
        self, sink: KafkaTransactionalSink, key: tuple[str, int], held: _Producer, timeout: float
    ) -> None:
        self._sink = sink
        self._key = key
        self._held = held
        self._timeout = timeout
        self.sent: Future[None] = Future()

    def _wait(self) -> None:
        """Return once the staging ended; raise what it raised (``_Stuck`` if it never
        returned: its calls are bounded, so it is wedged)."""
        # Each produce is bounded by the timeout and send_offsets by OFFSETS_SECONDS.
        try:
            self.sent.result(2 * self._timeout + GRACE_SECONDS)
        except FutureTimeout as exc:
            raise _Stuck("the transaction's staging did not return") from exc

    def commit(self) -> DeliveryOutcome:
        computation, _ = self._key
        try:
            self._wait()
            self._sink._commit(self._held, computation, self._timeout)
        except (_Stuck, KafkaException) as exc:
            return self._sink._failed(self._key, self._held, exc)
        return DeliveryOutcome.COMMITTED

    def abort(self) -> None:
        sink, (computation, interval), held = self._sink, self._key, self._held
        try:
            self._wait()
            _bounded(
                lambda: held.producer.abort_transaction(self._timeout),
                self._timeout,
                "abort_transaction",
            )
        except (_Stuck, KafkaException) as exc:
            # The producer goes: the interval's next open fences it and aborts what it left.
            _log.warning(
                "staged transaction of interval %d of %r not aborted, its producer dropped: %s",
                interval,
                computation,
                exc,
            )
            sink._drop(self._key, held)


class KafkaTransactionalSink:
    """Delivers each interval's productions in Kafka transactions with a commit marker.

    ``namespace`` tells apart the topologies sharing a cluster (:func:`store_namespace`: the
    store's keyspace, table and table ID); ``settings`` go to every producer (tests).
    """

    def __init__(
        self, config: MillstreamConfig, namespace: str, **settings: str | int | bool
    ) -> None:
        self._config = config
        self._namespace = namespace
        self._settings = settings
        self._marker_topic = transaction_marker_topic(config)
        self._admin = admin_client(config)
        self._producers: dict[tuple[str, int], _Producer] = {}
        # Opens under way in the background (prepare), or done and not taken yet.
        self._opening: dict[tuple[str, int], _Opening] = {}
        self._lock = threading.Lock()
        self.abandoned = 0  # producers left blocked in a call (see the module docstring)

    def prepare(self, computation: str, interval: int, timeout: float, token: int) -> None:
        key = (computation, interval)
        with self._lock:
            self._close_idle()
            held = self._opening.get(key)
            if held is not None and held.token == token:
                return  # one for this lease is under way, or done and not taken yet
            if held is None and len(self._opening) >= MAX_PRODUCERS:
                return  # intervals that take input but never deliver: open when they do
            # One prepared for an earlier lease of this process is dropped: a later owner may
            # have opened the producer since, fencing it.
            future: Future[tuple[_Producer, CommitTag | None]] = Future()
            self._opening[key] = _Opening(future, token, time.monotonic())

        def run() -> None:
            try:
                future.set_result(self._open(computation, interval, timeout))
            except BaseException as exc:  # handed to the open that takes it
                future.set_exception(exc)

        threading.Thread(target=run, name=f"millstream-open-{interval}", daemon=True).start()

    def ready(self, computation: str, interval: int, token: int) -> bool:
        with self._lock:
            opening = self._opening.get((computation, interval))
        if opening is None or opening.token != token or not opening.future.done():
            return False
        return opening.future.exception() is None

    def open(
        self, computation: str, interval: int, timeout: float, token: int | None = None
    ) -> CommitTag | None:
        key = (computation, interval)
        with self._lock:
            self._producers.pop(key, None)  # a fenced or failed one is of no more use
            opening = self._opening.pop(key, None)
        if opening is None or token is None or opening.token != token:
            held, marker = self._open(computation, interval, timeout)
        else:
            # Its calls are bounded (init_transactions by _bounded, the marker by timeout).
            try:
                held, marker = opening.future.result(2 * timeout + GRACE_SECONDS)
            except FutureTimeout as exc:
                self.abandoned += 1
                raise TransactionUnavailableError(
                    f"the Kafka producer of interval {interval} of {computation!r} did not open"
                ) from exc
        held.used = time.monotonic()
        with self._lock:
            self._close_idle()
            self._producers[key] = held
        return marker

    def _open(
        self, computation: str, interval: int, timeout: float
    ) -> tuple[_Producer, CommitTag | None]:
        """A new producer of the interval, initialised (which fences every earlier one), and
        the marker it found."""
        name = transactional_id(self._namespace, computation, interval)
        made = producer(
            self._config,
            **{
                "transactional.id": name,
                "transaction.timeout.ms": int(self._config.kafka_transaction_timeout * 1000),
                "linger.ms": 0,
                # A transaction begun right after the last one committed waits until the
                # broker has written the last one's markers: its AddOffsetsToTxn (and
                # AddPartitionsToTxn) are refused as concurrent and retried after this
                # backoff. librdkafka's 100 ms default cost every interval a tenth of a
                # second per back-to-back batch; the markers take a few milliseconds here.
                # Other retries back off exponentially from it (up to retry.backoff.max.ms).
                "retry.backoff.ms": _RETRY_BACKOFF_MS,
                **self._settings,
            },
        )
        try:
            _bounded(lambda: self._connect(made, timeout), timeout, "list_topics")
            _bounded(lambda: made.init_transactions(timeout), timeout, "init_transactions")
        except _Stuck as exc:
            self.abandoned += 1
            raise TransactionUnavailableError(
                f"the Kafka producer {name!r} did not open: {exc}"
            ) from exc
        except KafkaException as exc:
            raise TransactionUnavailableError(
                f"could not open the Kafka producer {name!r} within {timeout:.0f} s: {exc.args[0]}"
            ) from exc
        marker = self._read_marker(name, timeout)
        # The group is named only for the offsets; the consumer never joins or subscribes.
        named = consumer(self._config, "millstream-marker", **{"group.id": name})
        try:
            metadata = named.consumer_group_metadata()
        finally:
            named.close()
        return _Producer(made, metadata, time.monotonic()), marker

    def _connect(self, made: Producer, timeout: float) -> None:
        """Return once ``made`` has a connection up to a broker it learned from metadata.

        init_transactions on a new producer that has none looks for its coordinator again
        only on librdkafka's 500 ms timer: one open in four or five paid it here, and an
        interval opens again whenever Spark hands its task to another Python worker. The
        first metadata answer comes over the bootstrap connection, which librdkafka then
        replaces by one to the broker the answer names; the second comes once that is up
        (a single request made it worse: one open in three waited).
        """
        deadline = time.monotonic() + timeout
        for _ in range(2):
            made.list_topics(self._marker_topic, max(0.0, deadline - time.monotonic()))

    def deliver(
        self,
        computation: str,
        interval: int,
        productions: Sequence[Production],
        marker: CommitTag,
        timeout: float,
    ) -> DeliveryOutcome:
        key = (computation, interval)
        with self._lock:
            held = self._producers.get(key)
        if held is None:  # closed as idle, or failed before: open it again first
            return DeliveryOutcome.UNKNOWN
        try:
            self._send(held, productions, marker, timeout)
            self._commit(held, computation, timeout)
        except (_Stuck, KafkaException) as exc:
            return self._failed(key, held, exc)
        return DeliveryOutcome.COMMITTED

    def settled(self, computation: str, interval: int, marker: CommitTag, timeout: float) -> bool:
        name = transactional_id(self._namespace, computation, interval)
        window = min(timeout, SETTLE_SECONDS)
        deadline = time.monotonic() + window
        attempt = 0
        while True:
            try:
                found = self._read_marker(name, max(0.1, deadline - time.monotonic()))
            except TransactionUnavailableError as exc:
                # Held by a transaction (this one, its markers not written yet), or Kafka
                # not answering: asked again, sooner at first.
                pause = _SETTLE_PAUSES[min(attempt, len(_SETTLE_PAUSES) - 1)]
                attempt += 1
                if time.monotonic() + pause < deadline:
                    time.sleep(pause)
                    continue
                _log.warning(
                    "the commit of interval %d of %r (marker %s) was answered, but its marker "
                    "was not readable as committed within %.0f s; its productions stay pending: %s",
                    interval,
                    computation,
                    marker.encode(),
                    window,
                    exc,
                )
                return False
            if found is not None and found >= marker:
                return True
            _log.warning(
                "the commit of interval %d of %r (marker %s) was answered, but the marker reads "
                "%s: the transaction was aborted after all; its productions stay pending",
                interval,
                computation,
                marker.encode(),
                "nothing" if found is None else found.encode(),
            )
            return False

    def stage(
        self,
        computation: str,
        interval: int,
        productions: Sequence[Production],
        marker: CommitTag,
        timeout: float,
    ) -> _Staged | None:
        key = (computation, interval)
        with self._lock:
            held = self._producers.get(key)
        if held is None:
            return None
        staged = _Staged(self, key, held, timeout)

        def run() -> None:
            try:
                self._send(held, productions, marker, timeout)
            except BaseException as exc:  # reported by the commit (or dropped by an abort)
                staged.sent.set_exception(exc)
            else:
                staged.sent.set_result(None)

        threading.Thread(target=run, name=f"millstream-stage-{interval}", daemon=True).start()
        return staged

    def _send(
        self,
        held: _Producer,
        productions: Sequence[Production],
        marker: CommitTag,
        timeout: float,
    ) -> None:
        """Begin a transaction of ``held``, send ``productions`` in it and add ``marker``."""
        held.used = time.monotonic()
        made = held.producer
        offsets = [
            TopicPartition(
                self._marker_topic, 0, marker.token, metadata=_METADATA_PREFIX + marker.encode()
            )
        ]
        made.begin_transaction()
        for production in productions:
            self._produce(made, production, timeout)
        offsets_timeout = min(timeout, OFFSETS_SECONDS)
        _bounded(
            lambda: made.send_offsets_to_transaction(offsets, held.group_metadata, offsets_timeout),
            offsets_timeout,
            "send_offsets_to_transaction",
        )

    def _commit(self, held: _Producer, computation: str, timeout: float) -> None:
        pause_point("executor.transaction", computation)
        made = held.producer
        _bounded(lambda: made.commit_transaction(timeout), timeout, "commit_transaction")

    def _failed(
        self, key: tuple[str, int], held: _Producer, exc: _Stuck | KafkaException
    ) -> DeliveryOutcome:
        """The outcome of a transaction of ``held`` that raised ``exc``; the producer is
        dropped (the interval's next delivery opens it again)."""
        computation, interval = key
        self._drop(key, held)
        if isinstance(exc, _Stuck):
            # The coordinator that wedged this call likely wedged the admin client too (see
            # _read_marker): the open that follows reads the marker through a new one.
            self._renew_admin(self._admin)
            self.abandoned += 1
            _log.warning(
                "transaction of interval %d of %r abandoned, its outcome unknown: %s",
                interval,
                computation,
                exc,
            )
            return DeliveryOutcome.UNKNOWN
        error = exc.args[0]
        if isinstance(error, KafkaError) and error.code() in _FENCED:
            return DeliveryOutcome.FENCED
        _log.warning(
            "transaction of interval %d of %r ended unknown: %s", interval, computation, error
        )
        return DeliveryOutcome.UNKNOWN

    def _drop(self, key: tuple[str, int], held: _Producer) -> None:
        """Forget ``held``, unless another open replaced it already."""
        with self._lock:
            if self._producers.get(key) is held:
                del self._producers[key]

    def close(self) -> None:
        """Forget every producer (an open transaction of theirs is aborted by the broker)."""
        with self._lock:
            self._producers.clear()
            self._opening.clear()

    def _produce(self, made: Producer, production: Production, timeout: float) -> None:
        topic = stream_topic(production.stream)
        envelope = production.envelope
        key = production.record.key.encode()
        deadline = None
        while True:
            try:
                made.produce(topic, envelope, key)  # positional: keywords cost half as much again
                return
            except BufferError:
                # The local queue is full: let deliveries drain it, unless time is up.
                if deadline is None:
                    deadline = time.monotonic() + timeout
                elif time.monotonic() >= deadline:
                    raise KafkaException(
                        KafkaError(KafkaError._TIMED_OUT, "the producer's queue stayed full")
                    ) from None
                made.poll(0.05)

    def _renew_admin(self, stale: AdminClient) -> None:
        """A new admin client in place of ``stale``, unless another thread renewed it first
        (a read still waiting on ``stale`` keeps it referenced until it ends)."""
        with self._lock:
            if self._admin is stale:
                self._admin = admin_client(self._config)

    def _read_marker(self, name: str, timeout: float) -> CommitTag | None:
        request = ConsumerGroupTopicPartitions(name, [TopicPartition(self._marker_topic, 0)])
        admin = self._admin
        try:
            futures = admin.list_consumer_group_offsets([request], require_stable=True)
            answer = futures[name].result(timeout=timeout)
        except FutureTimeout as exc:
            # No answer: Kafka down, or the client wedged. After a kill -9 of the broker, the
            # admin client made before it never answered again (every read timed out for
            # minutes while a new client's read of the same marker answered at once): the
            # next read gets a new one. (An offset a transaction holds pending is no reason:
            # librdkafka 2.16 raises the broker's UNSTABLE_OFFSET_COMMIT at once, below.)
            self._renew_admin(admin)
            raise TransactionUnavailableError(
                f"the transaction marker of {name!r} was not readable within {timeout:.0f} s "
                "(Kafka not answering)"
            ) from exc
        except KafkaException as exc:
            raise TransactionUnavailableError(
                f"could not read the transaction marker of {name!r}: {exc.args[0]}"
            ) from exc
        [partition] = answer.topic_partitions
        if partition.error is not None:
            raise TransactionUnavailableError(
                f"could not read the transaction marker of {name!r}: {partition.error}"
            )
        metadata = partition.metadata or ""
        if partition.offset < 0 or not metadata.startswith(_METADATA_PREFIX):
            return None
        return CommitTag.decode(metadata.removeprefix(_METADATA_PREFIX))

    def _close_idle(self) -> None:
        now = time.monotonic()
        by_use = sorted(self._producers.items(), key=lambda item: item[1].used)
        excess = len(by_use) - MAX_PRODUCERS + 1
        for number, (key, held) in enumerate(by_use):
            if number < excess or now - held.used > IDLE_SECONDS:
                del self._producers[key]
        # An open prepared for a batch that failed before it delivered, never taken since.
        for key, opening in list(self._opening.items()):
            if now - opening.began > IDLE_SECONDS:
                del self._opening[key]
