"""A node of the local stack's kind whose JVM runs a small class of its own: the contract of
:class:`~millstream.devtools.local.service.LocalService` (starts, stops, class archives,
temporary files) on a JVM that starts in a second."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest

from millstream.connectors.maven import MavenArtifacts
from millstream.devtools.local.java import find_java
from millstream.devtools.local.process import log_tail
from millstream.devtools.local.service import LocalService
from millstream.engine.config import MillstreamConfig

_SLEEPER = """
import java.util.concurrent.ConcurrentSkipListMap;

public class Sleeper {
    public static void main(String[] args) throws Exception {
        ConcurrentSkipListMap<String, String> loaded = new ConcurrentSkipListMap<>();
        loaded.put("a", "b");
        // A temporary file as the JVM's own are made (unpacked native libraries): deleted
        // as the JVM exits, left behind by a JVM killed -9.
        java.io.File temporary = java.io.File.createTempFile("sleeper", ".tmp");
        temporary.deleteOnExit();
        System.out.println("temporary " + temporary);
        System.out.println("started " + loaded.size() + " " + ProcessHandle.current().pid());
        Thread.sleep(600_000);
    }
}
"""


class SleeperService(LocalService):
    """A node whose JVM runs a small class of its own (from a jar: an archive holds the
    classes of jars only) until it is stopped."""

    backend = "sleeper"
    profile = "kafka"
    start_timeout = 60.0

    def __init__(self, config: MillstreamConfig, jar: Path, said: list[str]) -> None:
        super().__init__(config, find_java(), cast(MavenArtifacts, _Artifacts(jar)), said.append)

    def ports(self) -> list[tuple[str, int]]:
        return []

    def address(self) -> str:
        return "nowhere"

    def prepare(self) -> None:
        (self.root / "logs").mkdir(parents=True, exist_ok=True)

    def argv(self, classpath: list[Path]) -> list[str]:
        # Where each class came from, to its own file (overwritten by each start).
        loaded = f"-Xlog:class+load=info,cds=info:file={self.root / 'class-load.log'}"
        return [*self.java_argv(classpath, "64m", loaded), "Sleeper"]

    def sleeper_source(self) -> str:
        """Where the JVM running now loaded the ``Sleeper`` class from."""
        log = (self.root / "class-load.log").read_text()
        found = re.search(r" Sleeper source: (.*)$", log, re.MULTILINE)
        assert found is not None, log[-2000:]
        return found[1]

    def temporary_file(self) -> Path:
        """The temporary file the JVM running now made."""
        log = (self.process.log_file).read_text()
        made = re.findall(r"^temporary (.*)$", log, re.MULTILINE)
        assert made, log[-2000:]
        return Path(made[-1])

    def healthy(self) -> bool:
        # This start's JVM, not an earlier one: the log file is appended to.
        pid = self.process.running_pid()
        return pid is not None and f"started 1 {pid}" in log_tail(self.process.log_file)


class _Artifacts:
    def __init__(self, jar: Path) -> None:
        self.jar = jar

    def classpath(self, profile: str) -> list[Path]:
        return [self.jar]


@pytest.fixture
def sleeper(tmp_path: Path) -> Iterator[tuple[SleeperService, list[str]]]:
    java_home = find_java().home
    source = tmp_path / "src" / "Sleeper.java"
    source.parent.mkdir()
    source.write_text(_SLEEPER)
    subprocess.run([str(java_home / "bin" / "javac"), str(source)], check=True)
    jar = tmp_path / "sleeper.jar"
    subprocess.run(
        [str(java_home / "bin" / "jar"), "cf", str(jar), "-C", str(source.parent), "Sleeper.class"],
        check=True,
    )
    said: list[str] = []
    service = SleeperService(MillstreamConfig(home=tmp_path / "home"), jar, said)
    try:
        yield service, said
    finally:
        service.process.stop(timeout=10)


def command_line(pid: int) -> list[str]:
    """The arguments of process ``pid``."""
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
