from __future__ import annotations

from pathlib import Path

import pytest

from millstream.connectors.local.artifacts import MavenArtifacts
from millstream.connectors.local.java import JavaRuntime
from millstream.connectors.local.kafka import KafkaService
from millstream.engine.config import MillstreamConfig

pytestmark = pytest.mark.unit


def _service(tmp_path: Path) -> KafkaService:
    config = MillstreamConfig(
        home=tmp_path, kafka_bootstrap="127.0.0.1:19092", kafka_controller_port=19093
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


def test_command_line_carries_the_marker_and_main_class(tmp_path: Path) -> None:
    service = _service(tmp_path)
    argv = service.argv([Path("/m2/kafka_2.13-4.3.1.jar"), Path("/m2/kafka-clients-4.3.1.jar")])
    assert argv[0] == "/usr/bin/java"
    assert service.process.marker in argv
    assert argv[argv.index("-cp") + 1] == "/m2/kafka_2.13-4.3.1.jar:/m2/kafka-clients-4.3.1.jar"
    assert argv[-2:] == ["kafka.Kafka", str(tmp_path / "kafka" / "conf" / "server.properties")]
    assert service.ports() == [("broker", 19092), ("controller", 19093)]
