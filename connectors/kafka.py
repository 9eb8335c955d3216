"""Kafka plumbing shared by the engine, injectors, examples and tests.

Streams are Kafka topics of the same name: stream ``searches`` is topic ``searches``, and a
computation's dead letters go to ``<computation>.dead-letters``. Stream names are restricted
to Kafka's topic alphabet (see :mod:`millstream.engine.topology`) so the mapping is the
identity; :func:`stream_topic` is the one place that says so.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Mapping, Sequence, Set
from functools import partial

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from millstream.engine.config import MillstreamConfig
from millstream.engine.productions import Production
from millstream.engine.records import encode_record

__all__ = [
    "KafkaProductionSink",
    "admin_client",
    "consumer",
    "create_topics",
    "delete_topics",
    "producer",
    "stream_topic",
]

_log = logging.getLogger(__name__)


def admin_client(config: MillstreamConfig) -> AdminClient:
    return AdminClient({"bootstrap.servers": config.kafka_bootstrap}, logger=_log)


def producer(config: MillstreamConfig, **settings: str | int | bool) -> Producer:
    """An idempotent producer: a retried send never writes a record twice."""
    return Producer(
        {
            "bootstrap.servers": config.kafka_bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            # The Java client's partitioner, so a key lands where Java producers put it too.
            "partitioner": "murmur2_random",
            **settings,
        },
        logger=_log,
    )


def consumer(config: MillstreamConfig, purpose: str, **settings: str | int | bool) -> Consumer:
    """A reader in a consumer group of its own that never commits offsets.

    millstream's progress lives in Spark checkpoints, never in consumer groups; this is for
    reading topics directly (offsets, tests, benchmarks). Without an explicit position it
    starts at the earliest offset. ``purpose`` prefixes the throwaway group id.
    """
    return Consumer(
        {
            "bootstrap.servers": config.kafka_bootstrap,
            "group.id": f"{purpose}-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "logger": _log,
            **settings,
        }
    )


def create_topics(
    config: MillstreamConfig,
    names: Sequence[str],
    partitions: int = 1,
    replication: int = 1,
    topic_config: Mapping[str, str] | None = None,
    timeout: float = 30.0,
) -> None:
    """Create topics; ones that already exist are left as they are."""
    admin = admin_client(config)
    futures = admin.create_topics(
        [
            NewTopic(name, partitions, replication, config=dict(topic_config or {}))
            for name in names
        ],
        operation_timeout=timeout,
    )
    for future in futures.values():
        try:
            future.result(timeout=timeout)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise


def delete_topics(config: MillstreamConfig, names: Sequence[str], timeout: float = 30.0) -> None:
    """Delete topics; ones that do not exist are ignored."""
    if not names:
        return
    admin = admin_client(config)
    for future in admin.delete_topics(list(names), operation_timeout=timeout).values():
        try:
            future.result(timeout=timeout)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise


def stream_topic(stream: str) -> str:
    """The Kafka topic that carries ``stream``: the same name."""
    return stream


class KafkaProductionSink:
    """The :class:`~millstream.engine.productions.ProductionSink` that writes to Kafka.

    Each production becomes one Kafka message on :func:`stream_topic` of its stream, keyed by
    the record's key, valued by its Avro envelope. ``send`` returns the IDs whose delivery
    the broker acknowledged (``acks=all``, idempotent producer) within ``timeout``; the rest
    stay queued in the producer and may still arrive, which is why the engine keeps them
    pending and consumers deduplicate by record ID.
    """

    def __init__(self, config: MillstreamConfig, **settings: str | int | bool) -> None:
        self._producer = producer(config, **settings)

    def send(self, productions: Sequence[Production], timeout: float) -> Set[bytes]:
        acknowledged: set[bytes] = set()
        deadline = time.monotonic() + timeout

        def delivered(error: KafkaError | None, message: Message, record_id: bytes) -> None:
            if error is None:
                acknowledged.add(record_id)
            else:
                _log.warning("production %s not delivered: %s", record_id.hex(), error)

        for production in productions:
            record = production.record
            while True:
                try:
                    self._producer.produce(
                        stream_topic(production.stream),
                        key=record.key.encode(),
                        value=encode_record(record),
                        on_delivery=partial(delivered, record_id=record.record_id),
                    )
                    break
                except BufferError:
                    # The local queue is full: let deliveries drain it, unless time is up.
                    if time.monotonic() >= deadline:
                        return frozenset(acknowledged)
                    self._producer.poll(0.05)
        self._producer.flush(max(0.0, deadline - time.monotonic()))
        # A copy: deliveries acknowledged after the deadline must not change the answer.
        return frozenset(acknowledged)

    def close(self, timeout: float = 30.0) -> int:
        """Deliver what is queued; returns how many messages are still undelivered."""
        return self._producer.flush(timeout)
