"""Naming and keeping Java class-data-sharing archives: what the local Spark driver's archive
(:mod:`millstream.spark.class_archive`) and the local services' archives
(:mod:`millstream.devtools.local.class_archive`) share.

A JVM maps an archive only if the Java binary and every classpath jar (size and time) are
those it was written with, so an archive is named by a digest of them and of the settings
its classes' layout depends on: a new Java, jar or setting gets a new archive, never a
refused one. Archives are large (50 to 160 MB); a directory keeps the ones used most
recently (:func:`evict`, by modification time: a JVM that maps one touches it).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from pathlib import Path

__all__ = ["archive_path", "evict"]


def archive_path(
    directory: Path, prefix: str, java: Path, jars: Iterable[Path], settings: Sequence[str] = ()
) -> Path:
    """``<directory>/<prefix>-<digest>.jsa``: the digest of the ``java`` binary it resolves
    to, each jar (path, size, time) and ``settings``."""
    real = java.resolve()
    facts = [str(real), str(real.stat().st_size), str(real.stat().st_mtime_ns)]
    for jar in jars:
        stat = jar.stat()
        facts.append(f"{jar}:{stat.st_size}:{stat.st_mtime_ns}")
    facts += settings
    digest = hashlib.sha256("\n".join(facts).encode()).hexdigest()[:16]
    return directory / f"{prefix}-{digest}.jsa"


def evict(directory: Path, prefix: str, keep: int, companions: Sequence[str] = ()) -> None:
    """Remove the ``prefix`` archives of ``directory`` but the ``keep`` used most recently,
    with the files beside each that have the ``companions`` suffixes (its log, ...)."""
    archives = sorted(
        directory.glob(f"{prefix}-*.jsa"), key=lambda p: p.stat().st_mtime, reverse=True
    )
    for stale in archives[keep:]:
        for leftover in (stale, *(stale.with_suffix(suffix) for suffix in companions)):
            leftover.unlink(missing_ok=True)
