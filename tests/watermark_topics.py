"""Removing a watermark topic of a test's (or a test session's) own, with the topics that come
with it: its wake and alarm topics, and the transaction marker topic that provisioning makes
beside it (``<watermark topic>.transactions``), which a test deleting the watermark topic
alone left behind."""

from __future__ import annotations

from millstream.connectors import kafka as kafka_connector
from millstream.engine.config import MillstreamConfig

__all__ = ["delete_watermark_topics"]


def delete_watermark_topics(config: MillstreamConfig) -> None:
    """Delete ``config``'s watermark topic, its wake and alarm topics and its marker topic
    (those that exist)."""
    kafka_connector.delete_wake_topics(config)
    kafka_connector.delete_topics(
        config,
        [config.kafka_watermark_topic, kafka_connector.transaction_marker_topic(config)],
    )
