"""Apache Kafka 4 nodes (KRaft, each a combined broker and controller) from Maven artifacts.

The single node is broker and sole controller. In a replicated stack of N nodes, node N is
broker N and voter N of a static controller quorum of all of them (a majority must run for
the cluster to work); every node is formatted with the same cluster id, kept in
``<home>/cluster/kafka-cluster-id``. Topics get the stack's replication factor by default,
and a write needs a majority of the replicas in sync (``min.insync.replicas``).
"""

from __future__ import annotations

import base64
import logging
import os
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient

from millstream.connectors.kafka import client_settings
from millstream.devtools.local.process import port_accepts
from millstream.devtools.local.security import SECURE_USER
from millstream.devtools.local.service import LocalService
from millstream.engine.errors import ServiceStartError

__all__ = ["KafkaService", "create_offsets_topic", "create_transaction_state_topic"]

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
    backend = "kafka"
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
        return f"{self.host}:{self.config.kafka_port}"

    def server_properties(self) -> str:
        node = self.node
        broker = f"{self.host}:{self.config.kafka_port}"
        controller = f"{self.host}:{self.config.kafka_controller_port}"
        voters = ",".join(
            f"{number}@{host}:{self.config.kafka_controller_port}"
            for number, host in enumerate(node.hosts, 1)
        )
        replicas, in_sync = str(node.replication), str(node.majority)
        # A secure node's clients (and the broker itself) use SASL_SSL; the controller
        # listener stays PLAINTEXT: only the node itself reaches it, on its loopback address.
        listener = "SASL_SSL" if node.secure else "PLAINTEXT"
        settings = {
            "process.roles": "broker,controller",
            "node.id": str(node.number),
            "controller.quorum.voters": voters,
            "listeners": f"{listener}://{broker},CONTROLLER://{controller}",
            "advertised.listeners": f"{listener}://{broker}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": listener,
            "listener.security.protocol.map": f"CONTROLLER:PLAINTEXT,{listener}:{listener}",
            **(self._security_properties() if node.secure else {}),
            "log.dirs": str(self._data_dir),
            "num.partitions": "1",
            # Every topic, internal ones included, gets the stack's replication factor (one
            # replica on a single node), and an acks=all write needs a majority of them: with
            # three replicas it goes on while one broker is down, and what it acknowledged
            # survives the loss of any one of them.
            "default.replication.factor": replicas,
            "min.insync.replicas": in_sync,
            "offsets.topic.replication.factor": replicas,
            "transaction.state.log.replication.factor": replicas,
            "transaction.state.log.min.isr": in_sync,
            "share.coordinator.state.topic.replication.factor": replicas,
            "share.coordinator.state.topic.min.isr": in_sync,
            "group.initial.rebalance.delay.ms": "0",
            # Lets users delete the per-test and scratch topics they create.
            "delete.topic.enable": "true",
            # A topic exists because someone created it with its partitions: a client that
            # still knows a deleted one (Spark's cached producers, a long-lived librdkafka
            # producer's periodic metadata refresh) would otherwise bring it back minutes
            # later with one partition. Kafka's own internal topics are created regardless.
            "auto.create.topics.enable": "false",
        }
        if node.replication > 1:
            # A broker's controlled shutdown waits (up to five minutes) for the controller
            # quorum to approve it; the stack stops its nodes together, and one whose peers
            # exited first waits for a majority that never comes, until killed. Without it,
            # a stopping broker still flushes its logs and writes the clean-shutdown marker;
            # its partitions move when its session with the controllers times out (the
            # faults kill brokers anyway, which skips the controlled shutdown too).
            settings["controlled.shutdown.enable"] = "false"
        return "".join(f"{key}={value}\n" for key, value in settings.items())

    def _security_properties(self) -> dict[str, str]:
        """SCRAM-SHA-512 over TLS with the local CA's certificate (PEM key store). The
        broker logs in to itself as the millstream user, whose SCRAM credential
        :meth:`_format` stores in the cluster metadata."""
        material = self.security
        jaas = (
            "org.apache.kafka.common.security.scram.ScramLoginModule required "
            f'username="{SECURE_USER}" password="{material.password("kafka").reveal()}";'
        )
        return {
            "sasl.enabled.mechanisms": "SCRAM-SHA-512",
            "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-512",
            "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": jaas,
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(material.server_pem),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(material.ca_file),
        }

    def prepare(self) -> None:
        if self.node.secure:
            self.security.ensure(self.host)
        for directory in (self._conf_dir, self._data_dir, self.root / "logs"):
            directory.mkdir(parents=True, exist_ok=True)
        if self.node.secure:
            self._conf_dir.chmod(0o700)  # server.properties holds the broker's password
        (self._conf_dir / "server.properties").write_text(self.server_properties())
        (self._conf_dir / "log4j2.properties").write_text(_LOG4J2.format(logs=self.root / "logs"))
        if not (self._data_dir / "meta.properties").is_file():
            self._format()

    def _format(self) -> None:
        """Write KRaft metadata once; a formatted log dir keeps its cluster id forever."""
        cluster_id = self._cluster_id()
        self.progress(f"{self.name}: formatting storage (cluster id {cluster_id})")
        argv = [
            *self._jvm(self.artifacts.classpath(self.profile), "256m"),
            _STORAGE_TOOL,
            "format",
            "--config",
            str(self._conf_dir / "server.properties"),
            "--cluster-id",
            cluster_id,
            *self._scram_users(),
        ]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
        if result.returncode != 0:
            output = result.stdout + result.stderr
            if self.node.secure:  # the tool may quote its --add-scram argument
                output = output.replace(self.security.password("kafka").reveal(), "***")
            raise ServiceStartError(
                f"formatting Kafka storage in {self._data_dir} failed:\n"
                f"{output[-3000:]}\n"
                f"If the directory holds data of another cluster, remove {self._data_dir}."
            )

    def _scram_users(self) -> list[str]:
        """The StorageTool option that stores a secure node's SCRAM user in the metadata."""
        if not self.node.secure:
            return []
        password = self.security.password("kafka").reveal()
        return ["--add-scram", f"SCRAM-SHA-512=[name={SECURE_USER},password={password}]"]

    def _cluster_id(self) -> str:
        """A new id for the single node; the one id all nodes of a replicated stack share."""
        if not self.node.replicated:
            return _new_cluster_id()
        shared = self.node.cluster_dir(self.config.home) / "kafka-cluster-id"
        shared.parent.mkdir(parents=True, exist_ok=True)
        # Nodes are formatted concurrently: the first to link its candidate in place wins,
        # and everyone reads the winner.
        candidate = shared.with_name(f"{shared.name}.{uuid.uuid4().hex}")
        candidate.write_text(_new_cluster_id())
        try:
            os.link(candidate, shared)
        except FileExistsError:
            pass
        finally:
            candidate.unlink()
        return shared.read_text().strip()

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
            *self.config.kafka_java_options,
        )

    def healthy(self) -> bool:
        """This node answers metadata requests and is itself a registered, unfenced broker
        (in a cluster: it rejoined, not just opened its port)."""
        if not port_accepts(self.host, self.config.kafka_port):
            return False
        # Only this node: a bootstrap list would let another node answer for it. No error
        # callback: refused credentials here are "not healthy", not an exception.
        settings = client_settings(self.client_config())
        del settings["error_cb"]
        admin = AdminClient(settings, logger=_quiet_logger())
        try:
            metadata = admin.list_topics(timeout=3)
        except KafkaException:
            return False  # not accepting clients yet
        return self.node.number in metadata.brokers


_OFFSETS_TOPIC = "__consumer_offsets"


def create_offsets_topic(bootstrap: str, replicas: int, timeout: float = 60.0) -> None:
    """Have the brokers at ``bootstrap`` create the consumer offsets topic now, with all its
    partitions led and ``replicas`` replicas in sync.

    Kafka creates it on the first use of a consumer group, and only while as many brokers run
    as its replication factor: with three replicas, a group first used while one broker is
    down would find no coordinator. Asking for a group's coordinator creates it.
    """
    admin = AdminClient({"bootstrap.servers": bootstrap}, logger=_quiet_logger())

    def probe() -> None:
        # Answered NOT_COORDINATOR (or the like) until the topic's partitions have leaders.
        admin.describe_consumer_groups([_OFFSETS_PROBE])[_OFFSETS_PROBE].result(timeout=10)

    _await_internal_topic(admin, _OFFSETS_TOPIC, probe, bootstrap, replicas, timeout)


def create_transaction_state_topic(bootstrap: str, replicas: int, timeout: float = 60.0) -> None:
    """The same for the transaction state topic, which Kafka creates on the first use of a
    transactional producer (millstream's transactional productions): a probe producer's
    ``init_transactions()`` creates it."""
    admin = AdminClient({"bootstrap.servers": bootstrap}, logger=_quiet_logger())

    def probe() -> None:
        producer = Producer(
            {"bootstrap.servers": bootstrap, "transactional.id": _TRANSACTIONS_PROBE},
            logger=_quiet_logger(),
        )
        producer.init_transactions(10)

    _await_internal_topic(admin, _TRANSACTIONS_TOPIC, probe, bootstrap, replicas, timeout)


def _await_internal_topic(
    admin: AdminClient,
    topic: str,
    probe: Callable[[], None],
    bootstrap: str,
    replicas: int,
    timeout: float,
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            probe()
            found = admin.list_topics(topic, timeout=10).topics[topic]
            partitions = found.partitions.values()
            if partitions and all(len(p.isrs) >= replicas for p in partitions):
                return
        except (KafkaException, TimeoutError):
            # Not yet: the coordinator or the topic's leaders are still being set up. A
            # request unanswered within its own 10 s (a cluster's first boot on a loaded
            # machine) is no reason to give up before ``timeout`` either.
            pass
        if time.monotonic() >= deadline:
            raise ServiceStartError(
                f"the Kafka brokers at {bootstrap} did not create {topic} with "
                f"{replicas} in-sync replicas within {timeout:.0f}s; check that every broker "
                f"is up (`millstream status --nodes N`) and see their logs/server.log"
            )
        time.sleep(0.5)


# A group nobody uses: describing it only makes a broker look up (and create) its coordinator.
_OFFSETS_PROBE = "millstream-local-offsets-probe"
_TRANSACTIONS_TOPIC = "__transaction_state"
# A transactional ID nobody uses: initialising it only makes the brokers create the topic.
_TRANSACTIONS_PROBE = "millstream-local-transactions-probe"


def _quiet_logger() -> logging.Logger:
    quiet = logging.getLogger("millstream.local.kafka-health")
    if not quiet.handlers:
        quiet.addHandler(logging.NullHandler())
    quiet.propagate = False
    return quiet


def _new_cluster_id() -> str:
    """A random id as Kafka's ``Uuid.randomUuid`` makes them: never one starting with ``-``,
    which ``kafka-storage format --cluster-id`` would take for an option (1 in 64 would)."""
    while True:
        made = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not made.startswith("-"):
            return made
