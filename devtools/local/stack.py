"""The local stack: Kafka and Cassandra, one node each or replicated, started, reported and
stopped together.

``LocalStack(config, progress)`` is the single-node stack on 127.0.0.1 that ``millstream up``
runs. ``LocalStack(config, progress, nodes=3)`` (or :class:`LocalCluster`) is the replicated
one that ``millstream up --nodes 3`` runs: three Cassandra nodes and three Kafka brokers on
127.0.0.2, 127.0.0.3 and 127.0.0.4, each node on the same ports as the single node, under
``<home>/cluster/``. ``LocalStack(config, progress, secure=True)`` is the secured single
node that ``millstream up --secure`` runs on 127.0.0.5, under ``<home>/secure/``: Kafka over
SASL_SSL (SCRAM-SHA-512), Cassandra with a password and TLS
(:mod:`~millstream.devtools.local.security`). The stacks share nothing but the artifact
cache, so all can run at once. Every node is a
:class:`~millstream.devtools.local.service.LocalService` of its own (``cassandra-1`` ...
``kafka-3``): a fault harness kills one by pid and brings it back with its ``up()``.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

from millstream.connectors.maven import MavenArtifacts
from millstream.devtools.local.cassandra import CassandraService
from millstream.devtools.local.java import find_java
from millstream.devtools.local.kafka import (
    KafkaService,
    create_offsets_topic,
    create_transaction_state_topic,
)
from millstream.devtools.local.process import Progress
from millstream.devtools.local.security import SECURE_HOST, secure_client_config
from millstream.devtools.local.service import LOOPBACK, LocalService, Node, ServiceStatus
from millstream.engine.config import MillstreamConfig

__all__ = [
    "CLUSTER_HOSTS",
    "NODE_COUNTS",
    "SECURE_HOST",
    "LocalCluster",
    "LocalStack",
    "stack_hosts",
]

# The stack sizes `millstream up --nodes` offers: one node, or three (replication factor 3,
# which keeps quorums with one node down).
NODE_COUNTS = (1, 3)
# Loopback aliases (Linux routes all of 127/8 to lo): the replicated stack's nodes can bind
# the single node's port numbers without clashing with it on 127.0.0.1.
CLUSTER_HOSTS = ("127.0.0.2", "127.0.0.3", "127.0.0.4")

_BACKENDS: tuple[type[LocalService], ...] = (CassandraService, KafkaService)


def stack_hosts(nodes: int) -> tuple[str, ...]:
    """The addresses of a stack of ``nodes`` nodes per backend."""
    if nodes not in NODE_COUNTS:
        raise ValueError(
            f"a local stack has {' or '.join(map(str, NODE_COUNTS))} nodes, not {nodes}"
        )
    return (LOOPBACK,) if nodes == 1 else CLUSTER_HOSTS[:nodes]


class LocalStack:
    """``up`` is idempotent: services already running under ``config.home`` are reused.

    ``nodes`` (1 or 3) is the number of nodes of each backend; ``secure`` the secured single
    node (on :data:`~millstream.devtools.local.security.SECURE_HOST`). Only the ports of
    ``config`` matter for the nodes; where clients find them is :meth:`client_config`.
    """

    def __init__(
        self,
        config: MillstreamConfig,
        progress: Progress,
        maven_repo_local: Path | None = None,
        nodes: int = 1,
        secure: bool = False,
    ) -> None:
        if secure and nodes != 1:
            raise ValueError("the secured local stack has one node of each service")
        self.config = config
        self.progress = progress
        self.secure = secure
        self.hosts = (SECURE_HOST,) if secure else stack_hosts(nodes)
        self._maven_repo_local = maven_repo_local
        self._services: list[LocalService] | None = None

    @property
    def nodes(self) -> int:
        return len(self.hosts)

    @property
    def replication(self) -> int:
        """The replication factor the stack supports (and its client config asks for)."""
        return Node(self.hosts).replication

    @property
    def services(self) -> Sequence[LocalService]:
        """Every node, backend by backend in start order: ``cassandra``, ``kafka`` for the
        single node; ``cassandra-1`` ... ``cassandra-3``, ``kafka-1`` ... ``kafka-3``."""
        if self._services is None:
            java = find_java()
            artifacts = MavenArtifacts(
                self.config.home / "artifacts", self.progress, repo_local=self._maven_repo_local
            )
            self._services = [
                backend(
                    self.config,
                    java,
                    artifacts,
                    self.progress,
                    Node(self.hosts, number, secure=self.secure),
                )
                for backend in _BACKENDS
                for number in range(1, self.nodes + 1)
            ]
        return self._services

    def client_config(self) -> MillstreamConfig:
        """``config`` pointed at this stack: every node as a contact point, and topics and
        keyspaces created with the stack's replication factor; for the secured stack, with
        its credentials and CA (created by its first :meth:`up`)."""
        if self.secure:
            return secure_client_config(self.config, SECURE_HOST)
        nodes = [s for s in self.services if isinstance(s, KafkaService)]
        return replace(
            self.config,
            kafka_bootstrap=",".join(node.address() for node in nodes),
            cassandra_hosts=self.hosts,
            kafka_replication=self.replication,
            cassandra_replication=self.replication,
        )

    def client_environment(self) -> dict[str, str]:
        """The ``MILLSTREAM_*`` variables that make :func:`~millstream.engine.config.
        load_config` return :meth:`client_config`'s endpoints and replication."""
        client = self.client_config()
        return {
            "MILLSTREAM_KAFKA_BOOTSTRAP": client.kafka_bootstrap,
            "MILLSTREAM_CASSANDRA_HOSTS": ",".join(client.cassandra_hosts),
            "MILLSTREAM_CASSANDRA_REPLICATION": str(client.cassandra_replication),
            "MILLSTREAM_KAFKA_REPLICATION": str(client.kafka_replication),
            **(self._secure_environment(client, reveal=True) if self.secure else {}),
        }

    def client_exports(self) -> list[str]:
        """Shell lines that set :meth:`client_environment`; passwords are read from their
        files when the line runs (``"$(cat ...)"``), never written out."""
        client = self.client_config()
        variables = {
            **{k: v for k, v in self.client_environment().items() if "PASSWORD" not in k},
            **(self._secure_environment(client, reveal=False) if self.secure else {}),
        }
        return [f"export {name}={value}" for name, value in variables.items()]

    def _secure_environment(self, client: MillstreamConfig, reveal: bool) -> dict[str, str]:
        material = next(iter(self.services)).security

        def password(service: str) -> str:
            if reveal:
                return material.password(service).reveal()
            return f'"$(cat {material.password_file(service)})"'

        return {
            "MILLSTREAM_KAFKA_SECURITY_PROTOCOL": client.kafka_security_protocol,
            "MILLSTREAM_KAFKA_SASL_MECHANISM": client.kafka_sasl_mechanism,
            "MILLSTREAM_KAFKA_USERNAME": str(client.kafka_username),
            "MILLSTREAM_KAFKA_PASSWORD": password("kafka"),
            "MILLSTREAM_KAFKA_CA_FILE": str(client.kafka_ca_file),
            "MILLSTREAM_CASSANDRA_USERNAME": str(client.cassandra_username),
            "MILLSTREAM_CASSANDRA_PASSWORD": password("cassandra"),
            "MILLSTREAM_CASSANDRA_TLS": "true",
            "MILLSTREAM_CASSANDRA_CA_FILE": str(client.cassandra_ca_file),
        }

    def up(self) -> list[ServiceStatus]:
        services = self.services
        if self.secure:
            services[0].security.ensure(SECURE_HOST)
        # Resolve artifacts one profile at a time (Maven's local repository is
        # not safe for concurrent writers), then start the backends in parallel:
        # Cassandra's start-up dominates and Kafka's fits inside it.
        for backend in _BACKENDS:
            services[0].artifacts.classpath(backend.profile)
        by_backend = [[s for s in services if type(s) is backend] for backend in _BACKENDS]
        with ThreadPoolExecutor(max_workers=len(by_backend)) as pool:
            started = pool.map(_start_backend, by_backend)
            # Back in the order of the services.
            statuses = {status.name: status for group in started for status in group}
        statuses_in_order = [statuses[service.name] for service in services]
        if self.replication > 1:
            client = self.client_config()
            create_offsets_topic(client.kafka_bootstrap, client.kafka_replication)
            create_transaction_state_topic(client.kafka_bootstrap, client.kafka_replication)
        return statuses_in_order

    def status(self) -> list[ServiceStatus]:
        return [service.status() for service in self.services]

    def down(self) -> list[bool]:
        """Stop every node by pid, all at once (each takes seconds to stop, and none needs
        another: a replicated stack's brokers skip the controlled shutdown, for which the last
        of them would wait in vain for a quorum of controllers; see
        ``KafkaService.server_properties``). Kafka's nodes come first in the list returned."""
        nodes = [
            service
            for backend in reversed(_BACKENDS)
            for service in reversed(self.services)
            if type(service) is backend
        ]
        failed: Exception | None = None
        for node in nodes:
            try:
                node.before_down()  # while every node answers
            except Exception as exc:  # every node still stops; raised below
                failed = failed or exc
        with ThreadPoolExecutor(max_workers=max(1, len(nodes))) as pool:
            stopped = list(pool.map(lambda node: node.down(), nodes))
        if failed is not None:
            raise failed
        return stopped


class LocalCluster(LocalStack):
    """The replicated local stack: :class:`LocalStack` with three nodes by default."""

    def __init__(
        self,
        config: MillstreamConfig,
        progress: Progress,
        nodes: int = 3,
        maven_repo_local: Path | None = None,
    ) -> None:
        super().__init__(config, progress, maven_repo_local=maven_repo_local, nodes=nodes)


def _start_backend(nodes: Sequence[LocalService]) -> list[ServiceStatus]:
    """Start the nodes of one backend: those that may start together at once (Kafka's
    must: a controller needs a majority of the voters to elect a leader, and a broker needs
    a leader to register), then, one after another, those that must start alone (see
    :meth:`~millstream.devtools.local.service.LocalService.starts_alone`)."""
    alone = [node for node in nodes if node.starts_alone()]
    together = [node for node in nodes if node not in alone]
    statuses: list[ServiceStatus] = []
    if together:
        with ThreadPoolExecutor(max_workers=len(together)) as pool:
            statuses.extend(pool.map(lambda node: node.up(), together))
    statuses.extend(node.up() for node in alone)
    return statuses
