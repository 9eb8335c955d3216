"""A single-node Apache Kafka 4 (KRaft, combined broker and controller) from Maven artifacts."""

from __future__ import annotations

import base64
import logging
import subprocess
import uuid
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from millstream.connectors.local.process import port_accepts
from millstream.connectors.local.service import LOOPBACK, LocalService
from millstream.engine.errors import ServiceStartError

__all__ = ["KafkaService"]

_NODE_ID = 1
_MAIN_CLASS = "kafka.Kafka"
_STORAGE_TOOL = "kafka.tools.StorageTool"
# The JVM flags of Kafka's own kafka-run-class.sh / kafka-server-start.sh, less the heap.
_JVM_OPTIONS = (
    "-server",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-Djava.awt.headless=true",
)

_LOG4J2 = """\
status = warn
name = millstream-kafka
appender.console.type = Console
appender.console.name = STDOUT
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
appender.server.type = RollingFile
appender.server.name = SERVER
appender.server.fileName = {logs}/server.log
appender.server.filePattern = {logs}/server.log.%i
appender.server.layout.type = PatternLayout
appender.server.layout.pattern = [%d] %p %m (%c)%n
appender.server.policies.type = Policies
appender.server.policies.size.type = SizeBasedTriggeringPolicy
appender.server.policies.size.size = 20MB
appender.server.strategy.type = DefaultRolloverStrategy
appender.server.strategy.max = 3
rootLogger.level = INFO
rootLogger.appenderRef.server.ref = SERVER
rootLogger.appenderRef.console.ref = STDOUT
rootLogger.appenderRef.console.level = WARN
"""


class KafkaService(LocalService):
    name = "kafka"
    profile = "kafka"
    start_timeout = 120.0

    @property
    def _conf_dir(self) -> Path:
        return self.root / "conf"

    @property
    def _data_dir(self) -> Path:
        return self.root / "data"

    def ports(self) -> list[tuple[str, int]]:
        return [
            ("broker", self.config.kafka_port),
            ("controller", self.config.kafka_controller_port),
        ]

    def address(self) -> str:
        return f"{LOOPBACK}:{self.config.kafka_port}"

    def server_properties(self) -> str:
        broker = f"{LOOPBACK}:{self.config.kafka_port}"
        controller = f"{LOOPBACK}:{self.config.kafka_controller_port}"
        settings = {
            "process.roles": "broker,controller",
            "node.id": str(_NODE_ID),
            "controller.quorum.voters": f"{_NODE_ID}@{controller}",
            "listeners": f"PLAINTEXT://{broker},CONTROLLER://{controller}",
            "advertised.listeners": f"PLAINTEXT://{broker}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(self._data_dir),
            "num.partitions": "1",
            # One node: every internal topic has a single replica.
            "offsets.topic.replication.factor": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            # Lets users delete the per-test and scratch topics they create.
            "delete.topic.enable": "true",
        }
        return "".join(f"{key}={value}\n" for key, value in settings.items())

    def prepare(self) -> None:
        for directory in (self._conf_dir, self._data_dir, self.root / "logs"):
            directory.mkdir(parents=True, exist_ok=True)
        (self._conf_dir / "server.properties").write_text(self.server_properties())
        (self._conf_dir / "log4j2.properties").write_text(_LOG4J2.format(logs=self.root / "logs"))
        if not (self._data_dir / "meta.properties").is_file():
            self._format()

    def _format(self) -> None:
        """Write KRaft metadata once; a formatted log dir keeps its cluster id forever."""
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        self.progress(f"kafka: formatting storage (cluster id {cluster_id})")
        argv = [
            *self._jvm(self.artifacts.classpath(self.profile), "256m"),
            _STORAGE_TOOL,
            "format",
            "--config",
            str(self._conf_dir / "server.properties"),
            "--cluster-id",
            cluster_id,
        ]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
        if result.returncode != 0:
            raise ServiceStartError(
                f"formatting Kafka storage in {self._data_dir} failed:\n"
                f"{(result.stdout + result.stderr)[-3000:]}\n"
                f"If the directory holds data of another cluster, remove {self._data_dir}."
            )

    def argv(self, classpath: list[Path]) -> list[str]:
        return [
            *self._jvm(classpath, "512m"),
            _MAIN_CLASS,
            str(self._conf_dir / "server.properties"),
        ]

    def _jvm(self, classpath: list[Path], heap: str) -> list[str]:
        return self.java_argv(
            classpath,
            heap,
            *_JVM_OPTIONS,
            f"-Dlog4j2.configurationFile={self._conf_dir / 'log4j2.properties'}",
            f"-Dkafka.logs.dir={self.root / 'logs'}",
        )

    def healthy(self) -> bool:
        if not port_accepts(LOOPBACK, self.config.kafka_port):
            return False
        quiet = logging.getLogger("millstream.local.kafka-health")
        quiet.addHandler(logging.NullHandler())
        quiet.propagate = False
        admin = AdminClient({"bootstrap.servers": self.address()}, logger=quiet)
        try:
            metadata = admin.list_topics(timeout=3)
        except KafkaException:
            return False  # not accepting clients yet
        return bool(metadata.brokers)
