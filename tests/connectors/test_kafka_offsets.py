"""Unit tests of the Kafka plumbing that need no broker (fakes stand in for the client)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest
from confluent_kafka import KafkaError, KafkaException

from millstream.connectors import kafka as kafka_connector
from millstream.connectors.kafka import topics as kafka_topics
from millstream.engine.config import MillstreamConfig

pytestmark = pytest.mark.unit


class _LeaderlessReader:
    """A reader whose topic has no partition leader for its first ``failures`` calls."""

    def __init__(self, failures: int, code: int = KafkaError.NOT_LEADER_FOR_PARTITION) -> None:
        self.failures = failures
        self.code = code
        self.calls = 0

    def list_topics(self, topic: str, timeout: float) -> Any:
        partition = SimpleNamespace(id=0)
        return SimpleNamespace(
            topics={topic: SimpleNamespace(error=None, partitions={0: partition})}
        )

    def get_watermark_offsets(self, partition: Any, timeout: float) -> tuple[int, int]:
        self.calls += 1
        if self.calls <= self.failures:
            raise KafkaException(KafkaError(self.code))
        return 0, 7


def test_end_offsets_wait_for_a_new_topic_to_get_its_leader() -> None:
    reader = _LeaderlessReader(failures=3)
    assert kafka_connector.end_offsets(cast(Any, reader), ["t"], timeout=5) == {"t": {0: 7}}
    assert reader.calls == 4


@pytest.mark.parametrize(
    "code",
    [
        KafkaError.OFFSET_NOT_AVAILABLE,
        KafkaError.UNKNOWN_LEADER_EPOCH,
        KafkaError.FENCED_LEADER_EPOCH,
        KafkaError.REPLICA_NOT_AVAILABLE,
        KafkaError._DESTROY_BROKER,
    ],
)
def test_end_offsets_wait_while_a_partition_moves_between_leaders(code: int) -> None:
    """Found by the proving ground on the 3-broker cluster: as a killed broker came back and
    took its partitions back, the new leader answered OFFSET_NOT_AVAILABLE (its high
    watermark not caught up yet), which killed the driver's watermark report; and as a
    broker was killed, librdkafka destroyed its handle (_DESTROY_BROKER) under a
    get_watermark_offsets in flight, which killed a driver's batch."""
    reader = _LeaderlessReader(failures=2, code=code)
    assert kafka_connector.end_offsets(cast(Any, reader), ["t"], timeout=5) == {"t": {0: 7}}
    assert reader.calls == 3


def test_end_offsets_raise_other_errors_and_give_up_in_time() -> None:
    denied = _LeaderlessReader(failures=1, code=KafkaError.TOPIC_AUTHORIZATION_FAILED)
    with pytest.raises(KafkaException):
        kafka_connector.end_offsets(cast(Any, denied), ["t"], timeout=5)
    assert denied.calls == 1
    leaderless = _LeaderlessReader(failures=1_000_000)
    with pytest.raises(KafkaException):
        kafka_connector.end_offsets(cast(Any, leaderless), ["t"], timeout=0.3)


def test_wake_topic_names_stay_within_kafkas_limit() -> None:
    config = MillstreamConfig(kafka_watermark_topic="millstream.watermarks")
    assert kafka_connector.wake_topic(config, "searches") == "millstream.watermarks.wake.searches"
    long = kafka_connector.alarm_topic(config, "t" * 200, "c" * 200)
    assert len(long) <= 249
    assert long.startswith("millstream.watermarks.alarm.")
    assert long != kafka_connector.alarm_topic(config, "t" * 200, "d" * 200)


def test_a_just_created_watermark_topic_is_checked_once_the_broker_knows_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = {"describe": 0}

    class Admin:
        def describe_configs(self, resources: list[Any]) -> dict[Any, Any]:
            calls["describe"] += 1
            future: Any = SimpleNamespace()
            if calls["describe"] <= 2:

                def unknown(timeout: float) -> Any:
                    raise KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART))

                future.result = unknown
            else:
                entry = SimpleNamespace(value="compact")
                future.result = lambda timeout: {"cleanup.policy": entry}
            return {resources[0]: future}

    monkeypatch.setattr(kafka_topics, "create_topics", lambda *args, **kwargs: None)
    monkeypatch.setattr(kafka_topics, "admin_client", lambda config: Admin())
    kafka_connector.create_watermark_topic(MillstreamConfig(), timeout=5)
    assert calls["describe"] == 3
