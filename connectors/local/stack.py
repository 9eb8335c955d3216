"""The local stack: single-node Kafka and Cassandra, started, reported and stopped together."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from millstream.connectors.local.artifacts import MavenArtifacts
from millstream.connectors.local.cassandra import CassandraService
from millstream.connectors.local.java import find_java
from millstream.connectors.local.kafka import KafkaService
from millstream.connectors.local.process import Progress
from millstream.connectors.local.service import LocalService, ServiceStatus
from millstream.engine.config import MillstreamConfig

__all__ = ["LocalStack"]


class LocalStack:
    """``up`` is idempotent: services already running under ``config.home`` are reused."""

    def __init__(
        self, config: MillstreamConfig, progress: Progress, maven_repo_local: Path | None = None
    ) -> None:
        self.config = config
        self.progress = progress
        self._maven_repo_local = maven_repo_local
        self._services: list[LocalService] | None = None

    @property
    def services(self) -> Sequence[LocalService]:
        if self._services is None:
            java = find_java()
            artifacts = MavenArtifacts(
                self.config.home / "artifacts", self.progress, repo_local=self._maven_repo_local
            )
            self._services = [
                service(self.config, java, artifacts, self.progress)
                for service in (CassandraService, KafkaService)
            ]
        return self._services

    def up(self) -> list[ServiceStatus]:
        services = self.services
        # Resolve artifacts one profile at a time (Maven's local repository is
        # not safe for concurrent writers), then start the services in parallel:
        # Cassandra's start-up dominates and Kafka's fits inside it.
        for service in services:
            service.artifacts.classpath(service.profile)
        with ThreadPoolExecutor(max_workers=len(services)) as pool:
            return list(pool.map(lambda service: service.up(), services))

    def status(self) -> list[ServiceStatus]:
        return [service.status() for service in self.services]

    def down(self) -> list[bool]:
        return [service.down() for service in reversed(self.services)]
