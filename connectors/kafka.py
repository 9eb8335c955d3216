"""Kafka plumbing shared by the engine, injectors, examples and tests."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from millstream.engine.config import MillstreamConfig

__all__ = ["admin_client", "create_topics", "delete_topics", "producer"]

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
            **settings,
        },
        logger=_log,
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
