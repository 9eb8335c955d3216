"""Kafka plumbing shared by the engine, injectors, examples and tests.

Streams are Kafka topics of the same name: stream ``searches`` is topic ``searches``, and a
computation's dead letters go to ``<computation>.dead-letters``. Stream names are restricted
to Kafka's topic alphabet (see :mod:`millstream.engine.topology`) so the mapping is the
identity; :func:`stream_topic` is the one place that says so.

Low-watermark reports (:mod:`millstream.engine.watermarks`) travel on one compacted topic,
``config.kafka_watermark_topic`` (default ``millstream.watermarks``), keyed by source name,
so Kafka keeps each source's latest report: :func:`create_watermark_topic`,
:class:`KafkaWatermarkTopic` (the :mod:`~millstream.engine.watermark_topic` contract).

The modules: ``clients`` (connection and security settings, producers and consumers),
``topics`` (topic names, creation, end offsets), ``watermark_topic`` (the watermark topic:
reports, expected sets, wake-ups), ``sink`` (:class:`KafkaProductionSink`) and
``transactions`` (:class:`KafkaTransactionalSink`: transactional productions, with their
marker topic) and ``stalls`` (:class:`StableOffsetWatch`: transactional outputs whose last
stable offset is stuck).
"""

from millstream.connectors.kafka.clients import (
    client_settings,
    consumer,
    java_client_settings,
    producer,
    refusal,
)
from millstream.connectors.kafka.sink import KafkaProductionSink
from millstream.connectors.kafka.stalls import StableOffsetWatch, TransactionStalls
from millstream.connectors.kafka.topics import (
    WAKE_TOPIC_CONFIG,
    WATERMARK_TOPIC_CONFIG,
    admin_client,
    alarm_topic,
    create_topics,
    create_wake_topics,
    create_watermark_topic,
    delete_topics,
    delete_wake_topics,
    end_offsets,
    start_offsets,
    stream_topic,
    wake_topic,
)
from millstream.connectors.kafka.transactions import (
    KafkaTransactionalSink,
    create_transaction_marker_topic,
    delete_transaction_markers,
    store_namespace,
    transaction_marker_topic,
)
from millstream.connectors.kafka.watermark_topic import (
    KafkaWatermarkChannel,
    KafkaWatermarkTopic,
    WatermarkPublisher,
    WatermarkReader,
)

__all__ = [
    "WAKE_TOPIC_CONFIG",
    "WATERMARK_TOPIC_CONFIG",
    "KafkaProductionSink",
    "KafkaTransactionalSink",
    "KafkaWatermarkChannel",
    "KafkaWatermarkTopic",
    "StableOffsetWatch",
    "TransactionStalls",
    "WatermarkPublisher",
    "WatermarkReader",
    "admin_client",
    "alarm_topic",
    "client_settings",
    "consumer",
    "create_topics",
    "create_transaction_marker_topic",
    "create_wake_topics",
    "create_watermark_topic",
    "delete_topics",
    "delete_transaction_markers",
    "delete_wake_topics",
    "end_offsets",
    "java_client_settings",
    "producer",
    "refusal",
    "start_offsets",
    "store_namespace",
    "stream_topic",
    "transaction_marker_topic",
    "wake_topic",
]
