"""The Kafka transactional sink's calls are bounded: a librdkafka call that blocks past its
timeout (confluentinc/librdkafka#5456) is abandoned with its producer, the outcome unknown."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import pytest

from millstream.connectors.kafka import transactions
from millstream.connectors.kafka.transactions import KafkaTransactionalSink, _Producer
from millstream.engine.config import MillstreamConfig
from millstream.engine.productions import (
    CommitTag,
    DeliveryOutcome,
    Production,
    TransactionUnavailableError,
)
from millstream.engine.records import Record, injector_record_id

pytestmark = pytest.mark.unit


class BlockedProducer:
    """Stands for a librdkafka producer whose send_offsets_to_transaction never returns."""

    def __init__(self, released: threading.Event) -> None:
        self.released = released
        self.produced = 0
        self.offsets_timeout: float | None = None

    def begin_transaction(self) -> None:
        pass

    def produce(self, topic: str, key: bytes, value: bytes) -> None:
        self.produced += 1

    def send_offsets_to_transaction(self, offsets: Any, metadata: Any, timeout: float) -> None:
        self.offsets_timeout = timeout
        self.released.wait()

    def commit_transaction(self, timeout: float) -> None:
        raise AssertionError("a blocked transaction must not be committed")


class SilentAdmin:
    """Stands for an admin client that never answers again (made before a broker's kill)."""

    def __init__(self) -> None:
        self.asked = 0

    def list_consumer_group_offsets(self, requests: Any, require_stable: bool) -> dict[str, Any]:
        self.asked += 1
        assert require_stable
        return {request.group_id: Future() for request in requests}


@pytest.fixture
def admins(monkeypatch: pytest.MonkeyPatch) -> list[SilentAdmin]:
    """Every admin client the sinks made, in order: silent ones."""
    made: list[SilentAdmin] = []

    def admin_client(config: MillstreamConfig) -> SilentAdmin:
        made.append(SilentAdmin())
        return made[-1]

    monkeypatch.setattr(transactions, "admin_client", admin_client)
    return made


@pytest.fixture
def blocked(
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[tuple[KafkaTransactionalSink, BlockedProducer]]:
    """A sink whose producer of interval 0 of ``comp`` blocks in send_offsets_to_transaction
    until the test ends; calls are abandoned at their timeout, without grace."""
    monkeypatch.setattr(transactions, "GRACE_SECONDS", 0.0)
    released = threading.Event()
    sink = KafkaTransactionalSink(MillstreamConfig(kafka_bootstrap="127.0.0.1:1"), "ks.table")
    producer = BlockedProducer(released)
    sink._producers[("comp", 0)] = _Producer(producer, object(), time.monotonic())  # type: ignore[arg-type]
    yield sink, producer
    released.set()


def _deliver(sink: KafkaTransactionalSink, timeout: float) -> DeliveryOutcome:
    record = Record("k", b"v", 1, injector_record_id("t", 0, 0))
    return sink.deliver("comp", 0, [Production("out", record)], CommitTag(1, 1), timeout)


def test_a_call_blocked_past_its_timeout_is_abandoned_with_its_producer(
    blocked: tuple[KafkaTransactionalSink, BlockedProducer],
) -> None:
    sink, producer = blocked
    started = time.monotonic()
    assert _deliver(sink, 0.2) is DeliveryOutcome.UNKNOWN
    assert time.monotonic() - started < 5
    assert sink.abandoned == 1
    assert producer.produced == 1
    # The next delivery must open the interval again (fencing the abandoned producer).
    assert _deliver(sink, 0.2) is DeliveryOutcome.UNKNOWN
    assert sink.abandoned == 1


def test_a_stuck_send_offsets_is_given_up_on_sooner_than_the_send_timeout(
    blocked: tuple[KafkaTransactionalSink, BlockedProducer], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(transactions, "OFFSETS_SECONDS", 0.2)
    sink, producer = blocked
    started = time.monotonic()
    assert _deliver(sink, 60.0) is DeliveryOutcome.UNKNOWN
    assert time.monotonic() - started < 5  # not the 60 s send timeout
    assert sink.abandoned == 1
    assert producer.offsets_timeout == 0.2  # librdkafka is told the shorter timeout too


def test_a_stuck_call_gives_the_sink_a_new_admin_client(
    admins: list[SilentAdmin], blocked: tuple[KafkaTransactionalSink, BlockedProducer]
) -> None:
    sink, _ = blocked
    assert _deliver(sink, 0.1) is DeliveryOutcome.UNKNOWN
    assert len(admins) == 2
    assert sink._admin is admins[1]  # type: ignore[comparison-overlap]


def test_a_marker_read_without_an_answer_is_unavailable_and_the_next_read_gets_a_new_client(
    admins: list[SilentAdmin],
) -> None:
    sink = KafkaTransactionalSink(MillstreamConfig(kafka_bootstrap="127.0.0.1:1"), "ks.table")
    with pytest.raises(TransactionUnavailableError, match="not readable within 0 s"):
        sink._read_marker("millstream.ks.table.comp.0", 0.05)
    assert len(admins) == 2
    assert admins[0].asked == 1
    with pytest.raises(TransactionUnavailableError):
        sink._read_marker("millstream.ks.table.comp.0", 0.05)
    assert admins[1].asked == 1
    assert len(admins) == 3
