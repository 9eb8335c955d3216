"""The pubsub injector's handling of each message, over an in-memory consumer: every bad
message one dead letter with its topic, partition and offset, nothing good lost, nothing
checkpointed before it is handled. ``test_pubsub.py`` runs it on a real Kafka."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, KafkaError, Message

from millstream.connectors import kafka as kafka_connector
from millstream.engine.config import load_config
from millstream.engine.errors import InjectorError
from millstream.engine.stores.memory.store import InjectedCrash
from millstream.injectors import InjectorOptions, KafkaFeedSource
from millstream.injectors.testing import InjectorHarness, injector_harness

pytestmark = pytest.mark.unit

SECOND = 1_000_000
FEED = "feed"


@dataclass
class ScriptedConsumer:
    """Hands out the messages it was given, ``per_poll`` at a time, on one partition."""

    messages: list[Message]
    per_poll: int = 100
    assigned: list[Any] = field(default_factory=list)
    closed: bool = False

    def consume(self, num_messages: int, timeout: float) -> list[Message]:
        taken = self.messages[: min(num_messages, self.per_poll)]
        del self.messages[: len(taken)]
        return taken

    def list_topics(self, topic: str, timeout: float) -> Any:
        return SimpleNamespace(topics={topic: SimpleNamespace(error=None, partitions={0: None})})

    def assign(self, partitions: list[Any]) -> None:
        self.assigned = partitions

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def consumer(monkeypatch: pytest.MonkeyPatch) -> ScriptedConsumer:
    scripted = ScriptedConsumer([])
    monkeypatch.setattr(kafka_connector, "consumer", lambda *args, **settings: scripted)
    return scripted


def message(offset: int, value: bytes | None) -> Message:
    return Message(topic=FEED, partition=0, offset=offset, value=value)


def event(at: object, user: object = "u") -> bytes:
    return json.dumps({"at": at, "user": user}).encode()


def pick(document: dict[str, Any]) -> tuple[int, str]:
    return document["at"], document["user"]


def started(**options: Any) -> InjectorHarness:
    source = KafkaFeedSource(load_config(), FEED, pick, "searches", **options)
    harness = injector_harness("feed", source, InjectorOptions(poll_timeout=0))
    harness.process.start()
    return harness


def test_every_bad_message_is_one_dead_letter_with_its_message_id(
    consumer: ScriptedConsumer,
) -> None:
    bad = {
        1: None,  # a tombstone
        2: b"\xff\xfe not even utf-8",
        3: b"{truncated json",
        4: json.dumps({"user": "no time"}).encode(),  # a missing field
        5: event("yesterday"),  # a time that is not µs
        6: event(10**25),  # ns, not µs: out of range
        7: event(True),
        8: event(7 * SECOND, None),  # no key
        9: b"",
    }
    values = {0: event(5 * SECOND, "ann"), **bad, 10: event(6 * SECOND, "bob")}
    consumer.messages = [message(offset, value) for offset, value in values.items()]
    harness = started(out_of_order=SECOND)
    harness.process.step()

    assert [(r.key, r.timestamp) for r in harness.records("searches")] == [
        ("ann", 5 * SECOND),
        ("bob", 6 * SECOND),
    ]
    letters = harness.dead_letters()
    assert [(d.origin.stream, d.origin.offset) for d in letters] == [
        (f"{FEED}/0", offset) for offset in bad
    ]
    assert [d.error_type for d in letters] == [
        "TombstoneError",
        "UnicodeDecodeError",
        "JSONDecodeError",
        "KeyError",
        "TypeError",
        "AbsurdTimestampError",
        "TypeError",
        "TypeError",
        "JSONDecodeError",
    ]
    assert "tombstone" in letters[0].error_message
    assert letters[2].raw == b"{truncated json"
    # Bad event times never reached the watermark: the highest good one holds it.
    assert harness.process.watermark == 5 * SECOND
    # Every message is handled: a restart starts after all of them.
    harness.restart(KafkaFeedSource(load_config(), FEED, pick, "searches"))
    assert [(tp.partition, tp.offset) for tp in consumer.assigned] == [(0, 11)]


def test_a_message_counts_as_handled_only_once_its_dead_letter_is_sent(
    consumer: ScriptedConsumer,
) -> None:
    feed = [message(0, event(5 * SECOND)), message(1, b"junk")]
    consumer.messages = list(feed)
    harness = started()
    harness.sink.crash_next_send(after=1)  # the record is sent, its neighbour's dead letter not
    with pytest.raises(InjectedCrash):
        harness.process.step()
    # Not checkpointed: a restart reads the feed from where it was, the beginning.
    consumer.messages = list(feed)
    harness.restart(KafkaFeedSource(load_config(), FEED, pick, "searches"))
    assert [(tp.partition, tp.offset) for tp in consumer.assigned] == [(0, OFFSET_BEGINNING)]
    harness.process.step()
    assert len(harness.records("searches")) == 1  # sent twice with one ID
    assert [d.origin.offset for d in harness.dead_letters()] == [1]
    # Handled now: a restart starts after both.
    harness.restart(KafkaFeedSource(load_config(), FEED, pick, "searches"))
    assert [(tp.partition, tp.offset) for tp in consumer.assigned] == [(0, 2)]


def test_an_error_event_of_the_client_is_logged_and_a_fatal_one_stops_the_source(
    consumer: ScriptedConsumer, caplog: pytest.LogCaptureFixture
) -> None:
    consumer.messages = [
        Message(error=KafkaError(KafkaError._TRANSPORT)),  # no partition: the client's
        message(0, event(5 * SECOND)),
        Message(topic=FEED, partition=0, offset=1, error=KafkaError(KafkaError._PARTITION_EOF)),
    ]
    harness = started()
    harness.process.step()
    assert len(harness.records("searches")) == 1
    assert "reading feed topic" in caplog.text
    consumer.messages = [Message(error=KafkaError(KafkaError._FATAL, fatal=True))]
    with pytest.raises(InjectorError, match="reading feed topic"):
        harness.process.step()
