"""The production sink that writes to Kafka."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence, Set
from typing import cast

from confluent_kafka import KafkaError, Message

from millstream.connectors.kafka.clients import producer
from millstream.connectors.kafka.topics import stream_topic
from millstream.engine.config import MillstreamConfig
from millstream.engine.productions import Production

__all__ = ["KafkaProductionSink"]

_log = logging.getLogger(__name__)


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
        # A delivery names its production by its envelope (which holds the record ID): one
        # callback for all, not one made for each production.
        record_ids: dict[bytes, bytes] = {}

        def delivered(error: KafkaError | None, message: Message) -> None:
            record_id = record_ids[cast(bytes, message.value())]
            if error is None:
                acknowledged.add(record_id)
            else:
                _log.warning("production %s not delivered: %s", record_id.hex(), error)

        produce = self._producer.produce
        for production in productions:
            envelope = production.envelope
            record_ids[envelope] = production.record_id
            key = production.record.key.encode()
            topic = stream_topic(production.stream)
            while True:
                try:
                    # Positional: keywords cost the call half as much again.
                    produce(topic, envelope, key, on_delivery=delivered)
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
