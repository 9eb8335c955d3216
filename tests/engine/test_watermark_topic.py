"""The watermark topic contract (:mod:`millstream.engine.watermark_topic`), on every backend.

``memory`` is a unit test; ``kafka`` an integration test on the real Kafka, on a watermark
topic of its own. What one backend alone does (Kafka's failed reads and malformed messages,
its wake-up topics) is tested with that backend (``tests/connectors/test_kafka.py``).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import pytest

from millstream.engine.watermark_topic import MemoryWatermarkTopic, WatermarkTopic
from millstream.engine.watermarks import ExpectedSet, WatermarkReport, injector_source
from tests.watermark_topics import delete_watermark_topics

if TYPE_CHECKING:
    from millstream.engine.config import MillstreamConfig

# A writer, and a factory of readers that each start at the topic's beginning.
Topics = tuple[WatermarkTopic, Callable[[], WatermarkTopic]]


@pytest.fixture(
    params=[
        pytest.param("memory", marks=pytest.mark.unit),
        pytest.param("kafka", marks=pytest.mark.integration),
    ]
)
def topics(request: pytest.FixtureRequest) -> Iterator[Topics]:
    if request.param == "memory":
        memory = MemoryWatermarkTopic()
        yield memory, memory.reader
        return
    from millstream.connectors import kafka as kafka_connector

    services: MillstreamConfig = request.getfixturevalue("services")
    unique: Callable[[str], str] = request.getfixturevalue("unique")
    config = dataclasses.replace(services, kafka_watermark_topic=unique("watermarks"))
    writer = kafka_connector.KafkaWatermarkTopic(config)
    readers: list[kafka_connector.KafkaWatermarkTopic] = []

    def reader() -> WatermarkTopic:
        readers.append(kafka_connector.KafkaWatermarkTopic(config, create=False))
        return readers[-1]

    try:
        yield writer, reader
    finally:
        for opened in [writer, *readers]:
            opened.close()
        delete_watermark_topics(config)


def report(process: str, watermark: int, sequence: int = 1) -> WatermarkReport:
    return WatermarkReport(
        injector_source("clicks", process), ("clicks",), watermark, sequence, {"clicks": {0: 3}}
    )


def test_messages_are_read_in_order_under_their_keys_each_once(topics: Topics) -> None:
    writer, reader = topics
    first = reader()
    assert first.read() == []
    expected = ExpectedSet("clicks", ("clicks",), ("0", "1"))
    writer.declare(expected)
    writer.publish(report("0", 100))
    writer.publish(report("1", 50))
    assert first.read() == [
        ("injector/clicks", expected),
        (injector_source("clicks", "0"), report("0", 100)),
        (injector_source("clicks", "1"), report("1", 50)),
    ]
    assert first.read() == []

    retired = expected.retire("1")
    writer.declare(retired)
    writer.retire(injector_source("clicks", "1"))
    writer.publish(report("0", 200, sequence=2))
    assert first.read() == [
        ("injector/clicks", retired),
        (injector_source("clicks", "1"), None),
        (injector_source("clicks", "0"), report("0", 200, sequence=2)),
    ]
    # Another reader starts from the beginning (on Kafka, what compaction kept of it).
    assert reader().read()[-1] == (injector_source("clicks", "0"), report("0", 200, sequence=2))


def test_closing_twice_is_harmless(topics: Topics) -> None:
    writer, _ = topics
    writer.publish(report("0", 100))
    writer.close()
    writer.close()


@pytest.mark.unit
def test_the_memory_topic_keeps_wakes_and_asks_for_end_offsets() -> None:
    topic = MemoryWatermarkTopic(lambda streams: {s: {0: len(s)} for s in streams})
    assert topic.end_offsets(["ab", "abc"]) == {"ab": {0: 2}, "abc": {0: 3}}
    assert MemoryWatermarkTopic().end_offsets(["ab"]) == {}  # nothing written: covers nothing
    other = topic.reader()
    other.wake(["alarm"], "alarm/t/c")
    assert topic.wakes == [("alarm", "alarm/t/c")]
    topic.publish(report("0", 1))
    assert other.reports() == [report("0", 1)]
    assert other.end_offsets(["a"]) == {"a": {0: 1}}


@pytest.mark.unit
def test_the_injectors_old_names_warn_and_name_the_new_ones() -> None:
    import millstream.injectors
    from millstream.engine.testing import TestingSink
    from millstream.injectors import process, testing

    with pytest.warns(DeprecationWarning, match="WatermarkTopic"):
        assert process.WatermarkChannel is WatermarkTopic
    with pytest.warns(DeprecationWarning, match="WatermarkTopic"):
        assert millstream.injectors.WatermarkChannel is WatermarkTopic
    with pytest.warns(DeprecationWarning, match="MemoryWatermarkTopic"):
        channel = testing.MemoryWatermarkChannel(TestingSink())
    assert isinstance(channel, MemoryWatermarkTopic)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(AttributeError):
            _ = process.NoSuchName
