"""The contract every local service node fulfils, and the shared up/status/down logic.

A backend (``kafka.py``, ``cassandra.py``) says how to lay out its data
directory, which JVM command to run, which ports it binds and how to tell it
accepts clients. This module does the rest the same way for all of them:
reuse a running instance, refuse taken ports, start detached, wait with a
deadline, report pid/address/health/memory, stop by pid.

Each service object is one server process, one *node*: the single-node stack has one node
of each backend on 127.0.0.1, a replicated stack several, each on a loopback address of
its own (:class:`Node`), so that every node binds the same port numbers.
"""

from __future__ import annotations

import subprocess
from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from pathlib import Path

from millstream.connectors.maven import MavenArtifacts
from millstream.devtools.local.class_archive import keep_written_archive, service_archive
from millstream.devtools.local.java import JavaRuntime
from millstream.devtools.local.process import (
    Progress,
    ServiceProcess,
    Stop,
    check_ports_free,
    fresh_scratch,
)
from millstream.devtools.local.security import SecureMaterial, secure_client_config
from millstream.engine.config import MillstreamConfig
from millstream.engine.errors import ServiceStartError

__all__ = ["LOOPBACK", "LocalService", "Node", "ServiceStatus"]

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class Node:
    """Node ``number`` (from 1) of a local cluster whose nodes run on ``hosts``, one each.

    ``Node()`` is the single-node stack: one node on 127.0.0.1, named after its backend
    (``kafka``) and kept in ``<home>/<backend>/``. A node of a replicated stack is named
    ``<backend>-<number>`` and kept in ``<home>/cluster/<backend>-<number>/``, so the two
    stacks never share a directory, a pid file or an address. A ``secure`` node (of the
    secured stack, ``millstream up --secure``) authenticates its clients and encrypts their
    connections (:mod:`millstream.devtools.local.security`), and is kept in
    ``<home>/secure/<backend>/``.
    """

    hosts: tuple[str, ...] = (LOOPBACK,)
    number: int = 1
    secure: bool = False

    def __post_init__(self) -> None:
        if not 1 <= self.number <= len(self.hosts):
            raise ValueError(f"node {self.number} is not one of the {len(self.hosts)} nodes")
        if len(set(self.hosts)) != len(self.hosts):
            raise ValueError(f"every node needs an address of its own, got {self.hosts}")

    @property
    def host(self) -> str:
        """The loopback address this node binds."""
        return self.hosts[self.number - 1]

    @property
    def replicated(self) -> bool:
        return len(self.hosts) > 1

    @property
    def replication(self) -> int:
        """The replication factor the cluster gives its data: every node, at most three."""
        return min(len(self.hosts), 3)

    @property
    def majority(self) -> int:
        """How many of ``replication`` replicas make a quorum (2 of 3, 1 of 1)."""
        return self.replication // 2 + 1

    def name(self, backend: str) -> str:
        return f"{backend}-{self.number}" if self.replicated else backend

    def cluster_dir(self, home: Path) -> Path:
        """The directory of the whole stack's nodes (and of what they share)."""
        if self.secure:
            return home / "secure"
        return home / "cluster" if self.replicated else home

    def stack_option(self) -> str:
        """The ``millstream up/down`` option that names this node's stack ("" for the
        single node)."""
        if self.secure:
            return " --secure"
        return f" --nodes {len(self.hosts)}" if self.replicated else ""

    def root(self, home: Path, backend: str) -> Path:
        return self.cluster_dir(home) / self.name(backend)


@dataclass(frozen=True)
class ServiceStatus:
    name: str
    pid: int | None
    address: str
    healthy: bool
    rss_bytes: int | None = None

    def describe(self, width: int = 10) -> str:
        """One line; ``width`` aligns the names of several (the longest name's length)."""
        state = "healthy" if self.healthy else ("unhealthy" if self.pid else "stopped")
        pid = f"pid {self.pid}" if self.pid else "no pid"
        memory = f", rss {self.rss_bytes / 2**20:.0f} MiB" if self.rss_bytes else ""
        return f"{self.name:<{width}} {state:<9} {pid:<10} {self.address}{memory}"


class LocalService(ABC):
    """One server process (a node) under its root directory, run from the pinned Maven
    artifacts: ``<home>/<backend>/`` for the single node, ``<home>/cluster/<backend>-N/`` for
    node N of a replicated stack (see :class:`Node`).

    :meth:`up` (re)starts this node alone and returns once it accepts clients, so a harness
    may kill -9 one node by :attr:`process` ``.running_pid()`` and bring it back with
    :meth:`up`: it restarts on its existing data and rejoins its cluster.
    """

    backend: str  # "kafka", "cassandra": names the node and its directory
    profile: str  # the POM profile holding its classpath
    start_timeout: float = 180.0
    # The node's timer slack (:func:`~millstream.devtools.local.process.timer_slack`); None
    # keeps the kernel's.
    timer_slack_ns: int | None = None

    def __init__(
        self,
        config: MillstreamConfig,
        java: JavaRuntime,
        artifacts: MavenArtifacts,
        progress: Progress,
        node: Node | None = None,
    ) -> None:
        self.config = config
        self.java = java
        self.artifacts = artifacts
        self.progress = progress
        self.node = node or Node()
        self.name = self.node.name(self.backend)
        self.host = self.node.host
        self.root = self.node.root(config.home, self.backend)
        self.process = ServiceProcess(
            name=self.name,
            pid_file=self.root / f"{self.name}.pid",
            log_file=self.root / "logs" / f"{self.name}.out",
            marker=f"-Dmillstream.service={self.root}",
        )

    # -- what a backend provides ------------------------------------------------

    @abstractmethod
    def ports(self) -> list[tuple[str, int]]:
        """(role, port) pairs the service binds on its node's address, :attr:`host`."""

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

    def starts_alone(self) -> bool:
        """Whether no other node of this backend may be starting while this one does.

        :meth:`LocalStack.up <millstream.devtools.local.stack.LocalStack.up>` starts the
        other nodes of a backend together, then these one after another, in node order.
        """
        return False

    # -- shared behaviour --------------------------------------------------------

    @property
    def security(self) -> SecureMaterial:
        """The CA, certificate and passwords of a secure node (see :class:`Node`)."""
        return SecureMaterial(self.node.cluster_dir(self.config.home))

    def client_config(self) -> MillstreamConfig:
        """How a client reaches this node alone: its address, and for a secure node the
        secured stack's credentials and CA (whose files :meth:`prepare` creates)."""
        base = secure_client_config(self.config, self.host) if self.node.secure else self.config
        return replace(
            base,
            kafka_bootstrap=f"{self.host}:{self.config.kafka_port}",
            cassandra_hosts=(self.host,),
        )

    def up(self) -> ServiceStatus:
        """Start the service unless ours already runs; return once it accepts clients."""
        pid = self.process.running_pid()
        if pid is not None:
            self.progress(f"{self.name}: already running (pid {pid})")
            self._wait_healthy(None)
            return self.status()
        check_ports_free(self.name, self.host, self.ports())
        classpath = self.artifacts.classpath(self.profile)
        fresh_scratch(self.scratch)  # no process of this node runs now
        self.prepare()
        self.progress(f"{self.name}: starting (log: {self.process.log_file})")
        argv = self.argv(classpath)
        self._archives.mkdir(parents=True, exist_ok=True)
        archive = service_archive(self._archives, self.backend, self._archive_node, argv)

        def start() -> tuple[subprocess.Popen[bytes], bool]:
            options, mapped = archive.jvm_options()
            return (
                self.process.start(
                    [argv[0], *options, *argv[1:]], cwd=self.root, slack_ns=self.timer_slack_ns
                ),
                mapped,
            )

        proc, mapped = start()
        try:
            self._wait_healthy(proc)
        except ServiceStartError:
            if not mapped or proc.poll() is None:
                raise
            # A JVM that cannot map its archive exits as it starts: start without it (and
            # write a new one as it stops).
            archive.path.unlink(missing_ok=True)
            self.progress(f"{self.name}: did not start with {archive.path}; removed it")
            proc, _ = start()
            self._wait_healthy(proc)
        self.progress(f"{self.name}: ready on {self.address()} (pid {proc.pid})")
        return self.status()

    @property
    def scratch(self) -> Path:
        """The node's temporary files, its JVMs' ``java.io.tmpdir`` (the native libraries
        Cassandra unpacks, for one): in its own directory, emptied as it starts, so that a
        node killed -9 leaves nothing behind in ``/tmp``."""
        return self.root / "tmp"

    @property
    def _archives(self) -> Path:
        """Where the class archives of the local services' JVMs live (all stacks share)."""
        return self.config.home / "jvm-archives"

    @property
    def _archive_node(self) -> str:
        """This node, told apart from the nodes of the other stacks."""
        return "_".join(self.root.relative_to(self.config.home).parts)

    def _wait_healthy(self, proc: subprocess.Popen[bytes] | None) -> None:
        nodes = self.node.stack_option()
        self.process.wait_healthy(
            proc,
            self.healthy,
            self.start_timeout,
            self.progress,
            retry=f"run `millstream up{nodes}` again",
            stop=f"`millstream down{nodes}` stops it",
        )

    def status(self) -> ServiceStatus:
        pid = self.process.running_pid()
        return ServiceStatus(
            name=self.name,
            pid=pid,
            address=self.address(),
            healthy=pid is not None and self.healthy(),
            rss_bytes=_rss_bytes(pid) if pid else None,
        )

    def before_down(self) -> None:
        """What to do before :meth:`down` while every node of the stack still runs: a stack
        stops its nodes of one backend at once, and a node that asked the cluster something
        as it stopped could be cut off by another node's stop. Nothing by default."""
        return  # an optional step, not an abstract one

    def down(self) -> bool:
        """Stop our process by pid; False if it was not running."""
        stopped = self.process.stop()
        said = {
            Stop.NOT_RUNNING: "was not running",
            Stop.STOPPED: "stopped",
            Stop.KILLED: "killed: it did not exit within a minute of SIGTERM",
        }
        self.progress(f"{self.name}: {said[stopped]}")
        if stopped and self._archives.is_dir():
            # A JVM started without an archive wrote one as it exited.
            written = keep_written_archive(
                self._archives, self._archive_node, stopped is Stop.STOPPED
            )
            if written is not None:
                self.progress(f"{self.name}: archived its classes for later starts ({written})")
        return bool(stopped)

    def java_argv(self, classpath: list[Path], heap: str, *options: str) -> list[str]:
        """The common JVM prefix: heap, marker, temporary files, classpath."""
        return [
            str(self.java.executable),
            f"-Xms{heap}",
            f"-Xmx{heap}",
            self.process.marker,
            "-Djava.net.preferIPv4Stack=true",
            f"-Djava.io.tmpdir={self.scratch}",
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
