"""The pubsub injector on a real Kafka topic written by an ordinary producer."""

from __future__ import annotations

import io
import json
from collections.abc import Callable

import pytest
from fastavro import parse_schema, schemaless_writer

from millstream.connectors import kafka as kafka_connector
from millstream.engine.clock import ManualClock
from millstream.engine.config import MillstreamConfig
from millstream.engine.errors import InjectorError
from millstream.engine.records import injector_record_id
from millstream.injectors import InjectorOptions, KafkaFeedSource
from millstream.injectors.testing import injector_harness

pytestmark = pytest.mark.integration

SECOND = 1_000_000


def pick(document: dict[str, object]) -> tuple[int, str]:
    return int(document["at"]) * SECOND, str(document["user"])  # type: ignore[call-overload]


def send(config: MillstreamConfig, topic: str, items: list[tuple[int, bytes]]) -> None:
    """Messages as any producer writes them: (partition, value)."""
    producer = kafka_connector.producer(config)
    for partition, value in items:
        producer.produce(topic, value=value, partition=partition)
    assert producer.flush(30) == 0


def event(at: int, user: str = "u") -> bytes:
    return json.dumps({"at": at, "user": user}).encode()


def test_a_feed_topic_becomes_records_with_ids_from_topic_partition_and_offset(
    services: MillstreamConfig, kafka_topic: Callable[..., str]
) -> None:
    feed = kafka_topic(2)
    send(services, feed, [(0, event(10, "ann")), (1, event(12, "bob")), (0, b"{not json")])
    send(services, feed, [(0, json.dumps({"user": "no time"}).encode())])
    source = KafkaFeedSource(services, feed, pick, "searches")
    harness = injector_harness("feed", source, InjectorOptions(poll_timeout=2.0))
    harness.process.start()
    for _ in range(5):
        harness.process.step()
        if len(harness.records("searches")) == 2 and len(harness.dead_letters()) == 2:
            break
    records = harness.records("searches")
    assert sorted((r.key, r.timestamp) for r in records) == [
        ("ann", 10 * SECOND),
        ("bob", 12 * SECOND),
    ]
    ids = {r.key: r.record_id for r in records}
    assert ids["ann"] == injector_record_id("feed", f"{feed}/0", 0)
    assert ids["bob"] == injector_record_id("feed", f"{feed}/1", 0)
    assert json.loads(records[0].value)["user"] == records[0].key  # the value as it came
    letters = sorted(harness.dead_letters(), key=lambda d: d.origin.offset or 0)
    assert [(d.origin.stream, d.origin.offset, d.error_type) for d in letters] == [
        (f"{feed}/0", 1, "JSONDecodeError"),
        (f"{feed}/0", 2, "KeyError"),
    ]

    # A restart resumes after the checkpointed offsets: new messages only.
    send(services, feed, [(1, event(20, "cy"))])
    harness.restart(KafkaFeedSource(services, feed, pick, "searches"))
    for _ in range(5):
        harness.process.step()
        if len(harness.records("searches")) == 3:
            break
    assert [r.key for r in harness.records("searches")][2:] == ["cy"]
    assert len([p for p in harness.sink.sent if p.stream == "searches"]) == 3
    harness.process.source.close()


def test_a_caught_up_idle_partition_does_not_hold_the_watermark(
    services: MillstreamConfig, kafka_topic: Callable[..., str]
) -> None:
    feed = kafka_topic(2)
    send(services, feed, [(0, event(100)), (0, event(200)), (1, event(50))])
    clock = ManualClock(1_000 * SECOND)
    source = KafkaFeedSource(
        services,
        feed,
        pick,
        "searches",
        out_of_order=10 * SECOND,
        idle_after=5 * SECOND,
        clock=clock,
    )
    harness = injector_harness("feed", source, InjectorOptions(poll_timeout=2.0), clock=clock)
    harness.process.start()
    for _ in range(5):
        harness.process.step()
        if len(harness.records("searches")) == 3:
            break
    # Both partitions just delivered: partition 1 (at 50 s) holds the watermark.
    assert harness.process.watermark == 40 * SECOND
    send(services, feed, [(0, event(300))])
    clock.advance(5 * SECOND)
    for _ in range(5):
        harness.process.step()
        if len(harness.records("searches")) == 4:
            break
    harness.process.step()  # partition 1's end-of-partition seen, and it is idle now
    assert harness.process.watermark == 290 * SECOND
    harness.process.source.close()


def test_avro_values_are_decoded_with_the_writer_schema(
    services: MillstreamConfig, kafka_topic: Callable[..., str]
) -> None:
    schema = {
        "type": "record",
        "name": "Search",
        "fields": [{"name": "at", "type": "long"}, {"name": "user", "type": "string"}],
    }
    feed = kafka_topic(1)
    body = io.BytesIO()
    schemaless_writer(body, parse_schema(schema), {"at": 7, "user": "dee"})
    confluent = b"\x00\x00\x00\x00\x01" + body.getvalue()
    send(services, feed, [(0, body.getvalue()), (0, confluent), (0, b"\x02")])
    source = KafkaFeedSource(
        services, feed, pick, "searches", value_format="avro", avro_schema=schema
    )
    harness = injector_harness("feed", source, InjectorOptions(poll_timeout=2.0))
    harness.process.start()
    for _ in range(5):
        harness.process.step()
        if len(harness.records("searches")) + len(harness.dead_letters()) == 3:
            break
    assert [(r.key, r.timestamp) for r in harness.records("searches")] == [("dee", 7 * SECOND)] * 2
    assert len(harness.dead_letters()) == 1
    harness.process.source.close()


def test_a_missing_feed_topic_is_a_clear_error(services: MillstreamConfig) -> None:
    source = KafkaFeedSource(services, "no_such_feed_topic_x", pick, "searches")
    with pytest.raises(InjectorError, match="does not exist"):
        source.open(None)
    source.close()


def test_tombstones_and_an_aborted_transaction_never_become_records(
    services: MillstreamConfig, kafka_topic: Callable[..., str], unique: Callable[[str], str]
) -> None:
    feed = kafka_topic(1)
    send(services, feed, [(0, event(10, "ann"))])
    tombstones = kafka_connector.producer(services)
    tombstones.produce(feed, key=b"ann", value=None, partition=0)  # a deletion
    assert tombstones.flush(30) == 0
    aborting = kafka_connector.producer(services, **{"transactional.id": unique("aborting")})
    aborting.init_transactions(30)
    aborting.begin_transaction()
    aborting.produce(feed, value=event(11, "ghost"), partition=0)
    aborting.abort_transaction(30)
    send(services, feed, [(0, event(12, "bob"))])
    source = KafkaFeedSource(services, feed, pick, "searches")
    harness = injector_harness("feed", source, InjectorOptions(poll_timeout=2.0))
    harness.process.start()
    for _ in range(5):
        harness.process.step()
        if len(harness.records("searches")) == 2 and len(harness.dead_letters()) == 1:
            break
    harness.process.step()
    assert [r.key for r in harness.records("searches")] == ["ann", "bob"]
    assert [(d.origin.stream, d.origin.offset, d.error_type) for d in harness.dead_letters()] == [
        (f"{feed}/0", 1, "TombstoneError")
    ]
    harness.process.source.close()
