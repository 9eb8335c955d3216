"""Find the Java runtime the local services run on, and check its version."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from millstream.engine.errors import JavaNotFoundError

__all__ = ["REQUIRED_JAVA_MAJOR", "JavaRuntime", "find_java", "parse_java_major"]

# Cassandra 5.0 runs on Java 11 or 17, Kafka 4's broker on 17 or newer: 17 is the overlap.
REQUIRED_JAVA_MAJOR = 17


@dataclass(frozen=True)
class JavaRuntime:
    executable: Path
    major: int

    @property
    def home(self) -> Path:
        return self.executable.resolve().parent.parent


def parse_java_major(version_output: str) -> int:
    """The major version from ``java -version`` output ("1.8.0_x" is 8, "17.0.15" is 17)."""
    match = re.search(r'version "(\d+)(?:\.(\d+))?', version_output)
    if match is None:
        raise ValueError(f"no version in {version_output[:200]!r}")
    major = int(match.group(1))
    if major == 1 and match.group(2) is not None:
        major = int(match.group(2))
    return major


def find_java(environ: Mapping[str, str] | None = None) -> JavaRuntime:
    """``$JAVA_HOME/bin/java`` if JAVA_HOME is set, else ``java`` on PATH; must be Java 17."""
    env = os.environ if environ is None else environ
    java_home = env.get("JAVA_HOME")
    if java_home:
        executable = Path(java_home) / "bin" / "java"
        where = f"JAVA_HOME={java_home}"
        if not executable.is_file():
            raise JavaNotFoundError(
                f"{where} has no bin/java. Point JAVA_HOME at a JDK {REQUIRED_JAVA_MAJOR} "
                f"install{_hint()}, or unset it to use java from PATH."
            )
    else:
        found = shutil.which("java", path=env.get("PATH"))
        if found is None:
            raise JavaNotFoundError(
                f"Java is not installed (no `java` on PATH and JAVA_HOME unset). Kafka and "
                f"Cassandra need a JDK {REQUIRED_JAVA_MAJOR}: install one (Debian/Ubuntu: "
                f"`apt-get install openjdk-{REQUIRED_JAVA_MAJOR}-jdk-headless`) or set JAVA_HOME."
            )
        executable = Path(found)
        where = f"`java` on PATH ({found})"
    try:
        result = subprocess.run(
            [str(executable), "-version"], capture_output=True, text=True, timeout=30, check=False
        )
        major = parse_java_major(result.stderr + result.stdout)
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        raise JavaNotFoundError(f"could not run {where} -version: {exc}") from exc
    if major != REQUIRED_JAVA_MAJOR:
        raise JavaNotFoundError(
            f"{where} is Java {major}, but Cassandra 5.0 and Kafka 4 together need Java "
            f"{REQUIRED_JAVA_MAJOR}. Set JAVA_HOME to a JDK {REQUIRED_JAVA_MAJOR}{_hint()}."
        )
    return JavaRuntime(executable=executable, major=major)


def _hint() -> str:
    candidates = sorted(Path("/usr/lib/jvm").glob(f"*{REQUIRED_JAVA_MAJOR}*/bin/java"))
    return f" (this machine has one at {candidates[0].parent.parent})" if candidates else ""
