"""The contract every local single-node service fulfils, and the shared up/status/down logic.

A backend (``kafka.py``, ``cassandra.py``) says how to lay out its data
directory, which JVM command to run, which ports it binds and how to tell it
accepts clients. This module does the rest the same way for all of them:
reuse a running instance, refuse taken ports, start detached, wait with a
deadline, report pid/address/health/memory, stop by pid.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

from millstream.connectors.local.artifacts import MavenArtifacts
from millstream.connectors.local.java import JavaRuntime
from millstream.connectors.local.process import (
    Progress,
    ServiceProcess,
    check_ports_free,
)
from millstream.engine.config import MillstreamConfig

__all__ = ["LOOPBACK", "LocalService", "ServiceStatus"]

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class ServiceStatus:
    name: str
    pid: int | None
    address: str
    healthy: bool
    rss_bytes: int | None = None

    def describe(self) -> str:
        state = "healthy" if self.healthy else ("unhealthy" if self.pid else "stopped")
        pid = f"pid {self.pid}" if self.pid else "no pid"
        memory = f", rss {self.rss_bytes / 2**20:.0f} MiB" if self.rss_bytes else ""
        return f"{self.name:<10} {state:<9} {pid:<10} {self.address}{memory}"


class LocalService(ABC):
    """One server process under ``<home>/<name>/``, driven by the pinned Maven artifacts."""

    name: str
    profile: str  # the POM profile holding its classpath
    start_timeout: float = 180.0

    def __init__(
        self,
        config: MillstreamConfig,
        java: JavaRuntime,
        artifacts: MavenArtifacts,
        progress: Progress,
    ) -> None:
        self.config = config
        self.java = java
        self.artifacts = artifacts
        self.progress = progress
        self.root = config.home / self.name
        self.process = ServiceProcess(
            name=self.name,
            pid_file=self.root / f"{self.name}.pid",
            log_file=self.root / "logs" / f"{self.name}.out",
            marker=f"-Dmillstream.service={self.root}",
        )

    # -- what a backend provides ------------------------------------------------

    @abstractmethod
    def ports(self) -> list[tuple[str, int]]:
        """(role, port) pairs the service binds on 127.0.0.1."""

    @abstractmethod
    def address(self) -> str:
        """Where clients connect, e.g. ``127.0.0.1:9092``."""

    @abstractmethod
    def prepare(self) -> None:
        """Write configuration and initialise storage; safe to repeat."""

    @abstractmethod
    def argv(self, classpath: list[Path]) -> list[str]:
        """The full command line; must include ``self.process.marker``."""

    @abstractmethod
    def healthy(self) -> bool:
        """Whether the service accepts clients now (quick, never raises)."""

    # -- shared behaviour --------------------------------------------------------

    def up(self) -> ServiceStatus:
        """Start the service unless ours already runs; return once it accepts clients."""
        pid = self.process.running_pid()
        if pid is not None:
            self.progress(f"{self.name}: already running (pid {pid})")
            self.process.wait_healthy(None, self.healthy, self.start_timeout, self.progress)
            return self.status()
        check_ports_free(self.name, LOOPBACK, self.ports())
        classpath = self.artifacts.classpath(self.profile)
        self.prepare()
        self.progress(f"{self.name}: starting (log: {self.process.log_file})")
        proc = self.process.start(self.argv(classpath), cwd=self.root)
        self.process.wait_healthy(proc, self.healthy, self.start_timeout, self.progress)
        self.progress(f"{self.name}: ready on {self.address()} (pid {proc.pid})")
        return self.status()

    def status(self) -> ServiceStatus:
        pid = self.process.running_pid()
        return ServiceStatus(
            name=self.name,
            pid=pid,
            address=self.address(),
            healthy=pid is not None and self.healthy(),
            rss_bytes=_rss_bytes(pid) if pid else None,
        )

    def down(self) -> bool:
        """Stop our process by pid; False if it was not running."""
        stopped = self.process.stop()
        self.progress(f"{self.name}: {'stopped' if stopped else 'was not running'}")
        return stopped

    def java_argv(self, classpath: list[Path], heap: str, *options: str) -> list[str]:
        """The common JVM prefix: heap, marker, classpath."""
        return [
            str(self.java.executable),
            f"-Xms{heap}",
            f"-Xmx{heap}",
            self.process.marker,
            "-Djava.net.preferIPv4Stack=true",
            *options,
            "-cp",
            ":".join(str(jar) for jar in classpath),
        ]


def _rss_bytes(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None
