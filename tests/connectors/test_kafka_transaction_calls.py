"""The Kafka transactional sink's calls are bounded: a librdkafka call that blocks past its
timeout (confluentinc/librdkafka#5456) is abandoned with its producer, the outcome unknown."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from millstream.connectors.kafka import transactions
from millstream.connectors.kafka.transactions import KafkaTransactionalSink, _Producer
from millstream.engine.config import MillstreamConfig
from millstream.engine.productions import CommitTag, DeliveryOutcome, Production
from millstream.engine.records import Record, injector_record_id

pytestmark = pytest.mark.unit


class BlockedProducer:
    """Stands for a librdkafka producer whose send_offsets_to_transaction never returns."""

    def __init__(self, released: threading.Event) -> None:
        self.released = released
        self.produced = 0

    def begin_transaction(self) -> None:
        pass

    def produce(self, topic: str, key: bytes, value: bytes) -> None:
        self.produced += 1

    def send_offsets_to_transaction(self, offsets: Any, metadata: Any, timeout: float) -> None:
        self.released.wait()

    def commit_transaction(self, timeout: float) -> None:
        raise AssertionError("a blocked transaction must not be committed")


def test_a_call_blocked_past_its_timeout_is_abandoned_with_its_producer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(transactions, "GRACE_SECONDS", 0.0)
    released = threading.Event()
    sink = KafkaTransactionalSink(MillstreamConfig(kafka_bootstrap="127.0.0.1:1"), "ks.table")
    blocked = BlockedProducer(released)
    sink._producers[("comp", 0)] = _Producer(blocked, object(), time.monotonic())  # type: ignore[arg-type]
    record = Record("k", b"v", 1, injector_record_id("t", 0, 0))
    try:
        started = time.monotonic()
        outcome = sink.deliver("comp", 0, [Production("out", record)], CommitTag(1, 1), 0.2)
        assert time.monotonic() - started < 5
        assert outcome is DeliveryOutcome.UNKNOWN
        assert sink.abandoned == 1
        assert blocked.produced == 1
        # The next delivery must open the interval again (fencing the abandoned producer).
        again = sink.deliver("comp", 0, [Production("out", record)], CommitTag(1, 1), 0.2)
        assert again is DeliveryOutcome.UNKNOWN
        assert sink.abandoned == 1
    finally:
        released.set()
