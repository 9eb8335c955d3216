"""Resolve the pinned JVM artifacts (pom.xml beside this file) through Maven.

Maven downloads into its own local repository (``~/.m2`` unless the user's
settings say otherwise); we keep only the resulting classpath, keyed by a hash
of the POM, so a warm start runs no Maven at all.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence
from importlib import resources
from pathlib import Path

from millstream.engine.errors import MavenError

__all__ = [
    "PROFILES",
    "MavenArtifacts",
    "Progress",
    "artifact_name",
    "check_spark_version",
    "connector_jars",
    "pinned_versions",
    "pom_path",
]

# What a long step (a download, a server start) tells the person waiting on it, a line at a time.
Progress = Callable[[str], None]

PROFILES = ("kafka", "kafka-tools", "cassandra", "spark-kafka")

_NETWORK_FAILURES = (
    "Unknown host",
    "UnknownHostException",
    "Connection refused",
    "Connect timed out",
    "connect timed out",
    "Network is unreachable",
    "No route to host",
    "Could not transfer artifact",
    "transfer failed",
)
_DOWNLOADED = re.compile(r"Downloaded from [^:]+: \S+ \((?P<size>[\d.]+) (?P<unit>[kMG]?B)")
_UNITS = {"B": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9}


def pom_path() -> Path:
    return Path(str(resources.files("millstream.connectors").joinpath("pom.xml")))


def _settings_path() -> Path:
    return Path(str(resources.files("millstream.connectors").joinpath("maven-settings.xml")))


def pinned_versions() -> dict[str, str]:
    """The ``*.version`` properties of the POM, e.g. ``{"kafka.version": "4.3.1", ...}``."""
    namespace = {"m": "http://maven.apache.org/POM/4.0.0"}
    properties = ET.parse(pom_path()).getroot().find("m:properties", namespace)
    if properties is None:
        raise MavenError(f"{pom_path()} has no <properties>; the package is damaged, reinstall it")
    return {
        child.tag.split("}", 1)[1]: (child.text or "").strip()
        for child in properties
        if child.tag.endswith(".version")
    }


class MavenArtifacts:
    """Classpaths of the POM's profiles, resolved once and cached under ``cache_dir``."""

    def __init__(
        self,
        cache_dir: Path,
        progress: Progress,
        mvn: str = "mvn",
        repo_local: Path | None = None,
    ) -> None:
        """``repo_local`` replaces Maven's local repository (``~/.m2/repository``)."""
        self._cache_dir = cache_dir
        self._progress = progress
        self._mvn = mvn
        self._repo_local = repo_local

    def classpath(self, profile: str) -> list[Path]:
        if profile not in PROFILES:
            raise ValueError(f"unknown profile {profile!r}; one of {PROFILES}")
        cache = self.cache_file(profile)
        jars = _read_classpath(cache)
        if jars is not None:
            return jars
        self._resolve(profile, cache)
        jars = _read_classpath(cache)
        if jars is None:
            raise MavenError(
                f"Maven reported success for profile {profile!r} but its classpath {cache} is "
                f"missing or names absent jars; delete {self._cache_dir} and run again."
            )
        return jars

    def cache_file(self, profile: str) -> Path:
        """Where the classpath of ``profile`` is kept; a POM change makes a new file."""
        return self._cache_dir / f"{profile}-{_pom_digest()}.classpath"

    def _resolve(self, profile: str, output: Path) -> None:
        mvn = shutil.which(self._mvn)
        if mvn is None:
            raise MavenError(
                f"Maven (`{self._mvn}`) is not on PATH; millstream fetches Kafka, Cassandra and "
                f"the Spark connector with it. Install Maven 3.8+ (Debian/Ubuntu: "
                f"`apt-get install maven`) and run again."
            )
        output.parent.mkdir(parents=True, exist_ok=True)
        partial = output.with_suffix(".partial")
        argv = [
            mvn,
            "--batch-mode",
            "--global-settings",
            str(_settings_path()),
            "--file",
            str(pom_path()),
            "--activate-profiles",
            profile,
            "dependency:build-classpath",
            f"-Dmdep.outputFile={partial}",
            "-Dmdep.includeScope=runtime",
        ]
        if self._repo_local is not None:
            argv.append(f"-Dmaven.repo.local={self._repo_local}")
        self._progress(f"resolving {profile} artifacts with Maven (first time only)")
        lines = self._run(argv, profile)
        if not partial.is_file():
            raise _failure(profile, lines)
        partial.replace(output)

    def _run(self, argv: Sequence[str], profile: str) -> list[str]:
        lines: list[str] = []
        count, size, last = 0, 0.0, time.monotonic()
        with subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            cwd=self._cache_dir,
        ) as proc:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.append(line.rstrip("\n"))
                match = _DOWNLOADED.search(line)
                if match is not None:
                    count += 1
                    size += float(match["size"]) * _UNITS.get(match["unit"], 1)
                    if time.monotonic() - last > 2:
                        self._progress(f"{profile}: downloaded {count} files, {size / 1e6:.1f} MB")
                        last = time.monotonic()
        if count:
            self._progress(f"{profile}: downloaded {count} files, {size / 1e6:.1f} MB in all")
        if proc.returncode != 0:
            raise _failure(profile, lines)
        return lines


def _failure(profile: str, lines: Sequence[str]) -> MavenError:
    errors = [line for line in lines if "[ERROR]" in line][:5] or list(lines[-10:])
    detail = "\n".join(errors)
    if any(marker in line for line in lines for marker in _NETWORK_FAILURES):
        return MavenError(
            f"Maven could not reach its repository while resolving {profile}:\n{detail}\n"
            f"Check that Maven Central (or the mirror in your ~/.m2/settings.xml) is reachable, "
            f"and any proxy settings, then run again; downloads resume where they stopped."
        )
    return MavenError(f"Maven failed to resolve {profile}:\n{detail}")


def _pom_digest() -> str:
    digest = hashlib.sha256(pom_path().read_bytes() + _settings_path().read_bytes())
    return digest.hexdigest()[:12]


def _read_classpath(path: Path) -> list[Path] | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    jars = [Path(entry) for entry in text.split(":") if entry]
    if not jars or not all(jar.is_file() for jar in jars):
        return None
    return jars


_JAR_NAME = re.compile(r"^(?P<artifact>.+?)-(?P<version>\d+(?:\.\d+)+.*)\.jar$")


def artifact_name(jar: Path) -> str:
    """``kafka-clients-3.9.2.jar`` -> ``kafka-clients``."""
    match = _JAR_NAME.match(jar.name)
    return match["artifact"] if match else jar.stem


def connector_jars(resolved: Sequence[Path], provided: Sequence[Path]) -> list[Path]:
    """The resolved jars Spark does not ship itself.

    Spark's own jars (scala-library, lz4, snappy, slf4j, ...) win over the
    connector's transitive copies; two versions of one library on a classpath
    is how NoSuchMethodError happens.
    """
    shipped = {artifact_name(jar) for jar in provided}
    return [jar for jar in resolved if artifact_name(jar) not in shipped]


def check_spark_version(pyspark_version: str) -> None:
    """Refuse a connector whose Spark major.minor differs from the installed pyspark's."""
    pinned = pinned_versions()["spark.version"]
    if pinned.split(".")[:2] != pyspark_version.split(".")[:2]:
        raise MavenError(
            f"the pinned Spark Kafka connector is for Spark {pinned}, but pyspark "
            f"{pyspark_version} is installed; install millstream's pinned pyspark "
            f"(`pip install .` in the repository) so the two match."
        )
