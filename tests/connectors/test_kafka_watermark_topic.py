"""KafkaWatermarkTopic without a broker: when it creates the topic and its clients, the order
of a report and its wake-ups, and the deprecated names it replaces (the reads and writes on
a real Kafka are in test_kafka.py and tests/engine/test_watermark_topic.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from millstream.connectors import kafka as kafka_connector
from millstream.connectors.kafka import KafkaWatermarkTopic
from millstream.connectors.kafka import watermark_topic as kafka_watermark_topic
from millstream.engine.config import MillstreamConfig
from millstream.engine.watermarks import ExpectedSet, WatermarkReport, injector_source

pytestmark = pytest.mark.unit


class FakeProducer:
    """Acknowledges everything it is given, at the next flush."""

    def __init__(self) -> None:
        self.written: list[tuple[str, bytes | None]] = []
        self.flushes = 0
        self._unacknowledged: list[Callable[..., None]] = []

    def produce(
        self, topic: str, *, key: bytes, value: bytes | None, on_delivery: Callable[..., None]
    ) -> None:
        self.written.append((topic, value))
        self._unacknowledged.append(on_delivery)

    def flush(self, timeout: float) -> int:
        self.flushes += 1
        for callback in self._unacknowledged:
            callback(None, None)
        self._unacknowledged.clear()
        return 0


class Kafka:
    """What the topic asked of Kafka (faked where the module looks the calls up)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.created: list[str] = []
        self.wake_topics: list[str] = []
        self.producers: list[FakeProducer] = []
        monkeypatch.setattr(
            kafka_watermark_topic,
            "create_watermark_topic",
            lambda config: self.created.append(config.kafka_watermark_topic),
        )
        monkeypatch.setattr(
            kafka_watermark_topic,
            "create_wake_topics",
            lambda config, topics: self.wake_topics.extend(topics),
        )
        monkeypatch.setattr(kafka_watermark_topic, "producer", self._producer)

    def _producer(self, config: MillstreamConfig, **settings: Any) -> FakeProducer:
        self.producers.append(FakeProducer())
        return self.producers[-1]


@pytest.fixture
def kafka(monkeypatch: pytest.MonkeyPatch) -> Kafka:
    return Kafka(monkeypatch)


CONFIG = MillstreamConfig()


def test_the_topic_is_created_at_once_or_before_the_first_write_and_clients_at_first_use(
    kafka: Kafka,
) -> None:
    KafkaWatermarkTopic(CONFIG)
    assert kafka.created == [CONFIG.kafka_watermark_topic]
    assert kafka.producers == []  # made at the first write

    reader = KafkaWatermarkTopic(CONFIG, create=False)
    assert kafka.created == [CONFIG.kafka_watermark_topic]
    reader.retire(injector_source("clicks"))
    reader.retire(injector_source("clicks", "1"))
    assert kafka.created == [CONFIG.kafka_watermark_topic] * 2  # once, before writing
    assert len(kafka.producers) == 1
    assert kafka.producers[0].written == [(CONFIG.kafka_watermark_topic, None)] * 2


def test_a_report_is_acknowledged_before_its_streams_consumers_are_woken(kafka: Kafka) -> None:
    topic = KafkaWatermarkTopic(CONFIG)
    report = WatermarkReport(injector_source("clicks"), ("clicks", "views"), 100, 1)
    topic.publish(report)
    (producer,) = kafka.producers
    wakes = [kafka_connector.wake_topic(CONFIG, s) for s in report.streams]
    assert producer.written == [
        (CONFIG.kafka_watermark_topic, report.encode()),
        *((wake, b"") for wake in wakes),
    ]
    assert producer.flushes == 2  # the report alone, then the wake-ups
    assert kafka.wake_topics == wakes

    topic.declare(ExpectedSet("clicks", ("clicks",), ("0",)))
    topic.wake(wakes[:1], "alarm")
    assert kafka.wake_topics == wakes  # created once


def test_closing_flushes_what_was_written_once(kafka: Kafka) -> None:
    topic = KafkaWatermarkTopic(CONFIG)
    topic.close()  # nothing made: nothing to close
    assert kafka.producers == []
    topic = KafkaWatermarkTopic(CONFIG)
    topic.retire("x")
    (producer,) = kafka.producers
    flushed = producer.flushes
    topic.close()
    topic.close()
    assert producer.flushes == flushed + 1


class FakeConsumer:
    """A consumer of group ``group``, assigned what it is given; ``calls``: what it was
    asked, in order."""

    def __init__(self, group: str) -> None:
        self.group = group
        self.assigned: list[Any] = []
        self.calls: list[tuple[str, str | None]] = []

    def assign(self, partitions: list[Any]) -> None:
        self.assigned = partitions
        self.calls.append(("assign", None))

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> None:
        self.calls.append(("list_topics", topic))


def test_a_read_asks_for_the_topics_end_with_a_consumer_that_fetches_nothing(
    kafka: Kafka, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The reading consumer keeps a fetch in flight, which the broker holds up to its
    # fetch.wait.max.ms when nothing is new, and answers a connection's requests in turn:
    # asked through it, the end waited behind that fetch at every batch's start.
    made: list[FakeConsumer] = []
    asked: list[FakeConsumer] = []

    def consumer(config: MillstreamConfig, group: str, **settings: Any) -> FakeConsumer:
        made.append(FakeConsumer(group))
        return made[-1]

    def end_offsets(reader: FakeConsumer, topics: list[str], timeout: float) -> Any:
        asked.append(reader)
        return {topic: {0: 0} for topic in topics}

    monkeypatch.setattr(kafka_watermark_topic, "consumer", consumer)
    monkeypatch.setattr(kafka_watermark_topic, "end_offsets", end_offsets)
    topic = KafkaWatermarkTopic(CONFIG, create=False)
    assert topic.read() == []
    assert topic.read() == []
    reading = [c for c in made if c.assigned]
    assert [c.group for c in reading] == ["millstream-watermarks"]
    assert len(asked) == 2
    assert not set(map(id, asked)) & set(map(id, reading))


def test_the_reading_consumer_learns_the_topic_before_it_is_assigned_to_it(
    kafka: Kafka, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Else librdkafka fetches nothing until its once-a-second scan of its topics finds the
    # topic's leader: a batch's first read waited about a second, in one run of two.
    made: list[FakeConsumer] = []

    def consumer(config: MillstreamConfig, group: str, **settings: Any) -> FakeConsumer:
        made.append(FakeConsumer(group))
        return made[-1]

    monkeypatch.setattr(kafka_watermark_topic, "consumer", consumer)
    monkeypatch.setattr(
        kafka_watermark_topic,
        "end_offsets",
        lambda reader, topics, timeout: {topic: {0: 0} for topic in topics},
    )
    topic = KafkaWatermarkTopic(CONFIG, create=False)
    assert topic.read() == []
    assert topic.read() == []  # assigned once: asked once
    (reading,) = [c for c in made if c.assigned]
    assert reading.calls == [("list_topics", CONFIG.kafka_watermark_topic), ("assign", None)]


@pytest.mark.parametrize(
    ("name", "creates"),
    [("WatermarkPublisher", True), ("WatermarkReader", False), ("KafkaWatermarkChannel", True)],
)
def test_the_old_names_warn_and_are_the_watermark_topic(
    kafka: Kafka, name: str, creates: bool
) -> None:
    with pytest.warns(DeprecationWarning, match="KafkaWatermarkTopic"):
        old = getattr(kafka_connector, name)(CONFIG)
    assert isinstance(old, KafkaWatermarkTopic)
    assert kafka.created == ([CONFIG.kafka_watermark_topic] if creates else [])
