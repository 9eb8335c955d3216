from __future__ import annotations

import uuid
from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from millstream.connectors.maven import MavenArtifacts
from millstream.devtools.local import kafka as local_kafka
from millstream.devtools.local.java import JavaRuntime
from millstream.devtools.local.kafka import KafkaService
from millstream.engine.config import MillstreamConfig
from millstream.engine.errors import ServiceStartError

pytestmark = pytest.mark.unit


def _service(tmp_path: Path, java_options: tuple[str, ...] = ()) -> KafkaService:
    config = MillstreamConfig(
        home=tmp_path,
        kafka_bootstrap="127.0.0.1:19092",
        kafka_controller_port=19093,
        kafka_java_options=java_options,
    )
    java = JavaRuntime(Path("/usr/bin/java"), 17)
    return KafkaService(config, java, MavenArtifacts(tmp_path / "artifacts", print), print)


def test_kraft_combined_node_bound_to_loopback(tmp_path: Path) -> None:
    properties = dict(
        line.split("=", 1) for line in _service(tmp_path).server_properties().splitlines()
    )
    assert properties["process.roles"] == "broker,controller"
    assert properties["listeners"] == "PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093"
    assert properties["advertised.listeners"] == "PLAINTEXT://127.0.0.1:19092"
    assert properties["controller.quorum.voters"] == "1@127.0.0.1:19093"
    assert properties["log.dirs"] == str(tmp_path / "kafka" / "data")
    assert properties["offsets.topic.replication.factor"] == "1"
    assert properties["auto.create.topics.enable"] == "false"


def test_command_line_carries_the_marker_and_main_class(tmp_path: Path) -> None:
    service = _service(tmp_path)
    argv = service.argv([Path("/m2/kafka_2.13-4.3.1.jar"), Path("/m2/kafka-clients-4.3.1.jar")])
    assert argv[0] == "/usr/bin/java"
    assert service.process.marker in argv
    assert argv[argv.index("-cp") + 1] == "/m2/kafka_2.13-4.3.1.jar:/m2/kafka-clients-4.3.1.jar"
    assert argv[-2:] == ["kafka.Kafka", str(tmp_path / "kafka" / "conf" / "server.properties")]
    assert service.ports() == [("broker", 19092), ("controller", 19093)]


def test_the_configured_java_options_come_last_so_they_win(tmp_path: Path) -> None:
    argv = _service(tmp_path, ("-XX:TieredStopAtLevel=1",)).argv([Path("/m2/kafka.jar")])
    assert argv.index("-XX:TieredStopAtLevel=1") == argv.index("-cp") - 1
    assert "-XX:TieredStopAtLevel=1" not in _service(tmp_path).argv([Path("/m2/kafka.jar")])


class _SlowCoordinatorAdmin:
    """An admin client whose brokers leave the first ``slow`` coordinator lookups unanswered
    (a future that times out), then answer with a fully replicated offsets topic."""

    def __init__(self, slow: int) -> None:
        self.slow = slow
        self.lookups = 0

    def describe_consumer_groups(self, groups: list[str]) -> dict[str, Future[None]]:
        self.lookups += 1
        future: Future[None] = Future()
        if self.lookups > self.slow:
            future.set_result(None)
        return {groups[0]: future}

    def list_topics(self, topic: str, timeout: float) -> Any:
        partition = SimpleNamespace(isrs=[1, 2, 3])
        return SimpleNamespace(topics={topic: SimpleNamespace(partitions={0: partition})})


def test_the_offsets_topic_is_awaited_through_unanswered_lookups(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found on a fresh machine: a coordinator lookup that took longer than its 10 s raised
    TimeoutError out of the wait, and the 3-node stack failed to start."""
    admin = _SlowCoordinatorAdmin(slow=2)
    monkeypatch.setattr(local_kafka, "AdminClient", lambda *args, **kwargs: admin)
    monkeypatch.setattr(Future, "result", _result_without_waiting)
    local_kafka.create_offsets_topic("127.0.0.2:9092", replicas=3, timeout=30)
    assert admin.lookups == 3


def test_the_offsets_topic_wait_gives_up_in_time(monkeypatch: pytest.MonkeyPatch) -> None:
    admin = _SlowCoordinatorAdmin(slow=1_000)
    monkeypatch.setattr(local_kafka, "AdminClient", lambda *args, **kwargs: admin)
    monkeypatch.setattr(Future, "result", _result_without_waiting)
    with pytest.raises(ServiceStartError, match="did not create __consumer_offsets"):
        local_kafka.create_offsets_topic("127.0.0.2:9092", replicas=3, timeout=0.2)


def _result_without_waiting(self: Future[Any], timeout: float | None = None) -> Any:
    """Future.result as if its timeout had passed: raises TimeoutError unless done."""
    if not self.done():
        raise TimeoutError
    return self._result


def test_a_new_cluster_id_never_starts_like_an_option(monkeypatch: pytest.MonkeyPatch) -> None:
    """`kafka-storage format --cluster-id -ubJD…` fails: the tool takes the id for an option.
    A new stack's first `millstream up` did, once in 64 (a first byte of 0xF8 to 0xFB)."""
    drawn = iter([uuid.UUID(bytes=b"\xf9" + bytes(15)), uuid.UUID(bytes=b"\x01" + bytes(15))])
    monkeypatch.setattr(uuid, "uuid4", lambda: next(drawn))
    made = local_kafka._new_cluster_id()
    assert made == "AQAAAAAAAAAAAAAAAAAAAA"
    assert not made.startswith("-")
