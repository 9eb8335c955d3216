"""The live view's readings of the real Kafka: the watermark topic's latest message per
source (a zombie's older report does not replace a newer one), every stream's end offsets
in one request, and the internal topics left out."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from millstream.connectors import kafka as kafka_connector
from millstream.engine.clock import ManualClock
from millstream.engine.config import MillstreamConfig
from millstream.engine.watermarks import WatermarkReport
from millstream.ui import KafkaObserver
from millstream.ui.observer import stream_topics
from tests.watermark_topics import delete_watermark_topics

S = 1_000_000


@pytest.mark.unit
def test_the_watermark_topic_and_kafkas_own_topics_are_no_streams() -> None:
    config = MillstreamConfig(kafka_watermark_topic="wm")
    topics = ["wm", "wm.wake.s", "wm.alarm.t.c", "__consumer_offsets", "s", "wmx"]
    assert stream_topics(config, topics) == ["s", "wmx"]


@pytest.mark.integration
def test_an_observation_reads_the_latest_reports_and_every_streams_end(
    services: MillstreamConfig,
    unique: Callable[[str], str],
    kafka_topic: Callable[..., str],
) -> None:
    config = dataclasses.replace(services, kafka_watermark_topic=unique("ui_observer"))
    topic = kafka_connector.KafkaWatermarkTopic(config)
    try:
        stream = kafka_topic(partitions=3)
        writer = kafka_connector.producer(config)
        for i in range(5):
            writer.produce(stream, b"x", partition=i % 3)
        assert writer.flush(30) == 0
        newer = WatermarkReport("computation/t/c", (stream,), 7 * S, 9)
        zombie = WatermarkReport("computation/t/c", (stream,), 3 * S, 4)
        topic.publish(newer)
        topic.publish(zombie)  # a zombie's late report: older sequence, written after
        observer = KafkaObserver(config, ManualClock(42))
        try:
            observed = observer.observe()
        finally:
            observer.close()
        assert observed.error is None
        assert observed.now == 42
        assert observed.messages == {"computation/t/c": newer}
        assert observed.ends[stream] == {0: 2, 1: 2, 2: 1}
        assert config.kafka_watermark_topic not in observed.ends
        assert not any(t.startswith(config.kafka_watermark_topic) for t in observed.ends)
    finally:
        topic.close()
        delete_watermark_topics(config)
