"""Class-data-sharing archives of the local services' JVMs.

Kafka and Cassandra spend a good part of their start loading and verifying classes. A node
started without an archive for its Java, classpath and heap records the classes it loads
and writes them into an archive as its JVM exits (``-XX:ArchiveClassesAtExit``); the nodes
started later map that archive (``-XX:SharedArchiveFile``) instead of loading those classes
again: a stack comes up about a fifth sooner, and so does each node a fault test restarts.

Each node writes to a partial file of its own; the archive appears, whole, only when a node
stopped on SIGTERM (a JVM killed or crashed mid-write leaves a truncated file, which would
crash the JVM that maps it). The nodes of one backend share its archive. A JVM that cannot
map its archive ignores it; one that exits while starting with it has the archive removed
and starts without it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from millstream.connectors import jvm_archives

__all__ = ["KEPT_PER_BACKEND", "ServiceArchive", "keep_written_archive", "service_archive"]

KEPT_PER_BACKEND = 2
"""Archives of one backend kept (50 to 60 MB each): a new Java or artifact version gets a
new one, and the archives used least recently go."""

_PARTIAL = ".partial"


@dataclass(frozen=True)
class ServiceArchive:
    """The archive a node's JVM maps, and where it writes one when there is none yet."""

    path: Path
    partial: Path
    java_agent: bool  # Cassandra's (jamm): archiving with an agent must be allowed

    def jvm_options(self) -> tuple[list[str], bool]:
        """The options that map the archive, or write it at exit when there is none; and
        whether they map it."""
        allow = (
            ["-XX:+UnlockDiagnosticVMOptions", "-XX:+AllowArchivingWithJavaAgent"]
            if self.java_agent
            else []
        )
        if self.path.exists():
            os.utime(self.path)  # used now: the ones used least recently are evicted
            return [*allow, f"-XX:SharedArchiveFile={self.path}"], True
        self.partial.unlink(missing_ok=True)
        return [*allow, f"-XX:ArchiveClassesAtExit={self.partial}"], False


def service_archive(
    directory: Path, backend: str, node: str, argv: Sequence[str]
) -> ServiceArchive:
    """The archive of a JVM started with ``argv`` (``java ... -cp JARS ...``) as ``node``
    of ``backend``, in ``directory``: named by the Java binary, each jar of the classpath
    (name, size, time: the JVM refuses an archive whose jars changed) and the heap size."""
    classpath = argv[list(argv).index("-cp") + 1].split(":")
    settings = [arg for arg in argv if arg.startswith(("-Xmx", "-javaagent:"))]
    path = jvm_archives.archive_path(
        directory, backend, Path(argv[0]), map(Path, classpath), settings
    )
    return ServiceArchive(
        path=path,
        partial=directory / f".{path.name}.{node}{_PARTIAL}",
        java_agent=any(arg.startswith("-javaagent:") for arg in argv),
    )


def keep_written_archive(directory: Path, node: str, stopped_cleanly: bool) -> Path | None:
    """After ``node``'s JVM exited: the archive it wrote as it exited becomes its backend's
    (returned) if it stopped on SIGTERM and the backend has none yet; otherwise it goes."""
    kept = None
    for partial in directory.glob(f".*.{node}{_PARTIAL}"):
        path = directory / partial.name[1 : -len(f".{node}{_PARTIAL}")]
        if stopped_cleanly and partial.stat().st_size > 0 and not path.exists():
            os.replace(partial, path)  # whole, or not there
            jvm_archives.evict(directory, path.name.split("-", 1)[0], KEPT_PER_BACKEND)
            kept = path
        else:
            partial.unlink(missing_ok=True)
    return kept
