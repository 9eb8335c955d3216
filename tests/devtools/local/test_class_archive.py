"""The local services' class archives: one per backend, Java, classpath and heap, written by
a node's JVM as it stops on SIGTERM, mapped by the nodes started after it, and never in the
way of a start."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from millstream.devtools.local import class_archive
from millstream.devtools.local.class_archive import keep_written_archive, service_archive
from millstream.devtools.local.java import find_java
from tests.devtools.local.conftest import SleeperService, command_line


def _argv(tmp_path: Path, *options: str) -> list[str]:
    jars = [tmp_path / "a.jar", tmp_path / "b.jar"]
    for jar in jars:
        if not jar.exists():
            jar.write_bytes(b"jar")
    java = str(find_java().executable)
    return [java, "-Xmx512m", *options, "-cp", ":".join(map(str, jars)), "Main"]


@pytest.mark.unit
def test_the_nodes_of_a_backend_share_an_archive_named_by_java_jars_and_heap(
    tmp_path: Path,
) -> None:
    store = tmp_path / "archives"
    first = service_archive(store, "kafka", "cluster_kafka-1", _argv(tmp_path))
    second = service_archive(store, "kafka", "cluster_kafka-2", _argv(tmp_path))
    assert first.path == second.path
    assert first.path.name.startswith("kafka-")
    assert first.partial != second.partial
    assert not first.java_agent
    assert service_archive(store, "kafka", "k", _argv(tmp_path, "-javaagent:x.jar")).java_agent
    bigger = _argv(tmp_path)
    bigger[1] = "-Xmx1g"
    assert service_archive(store, "kafka", "k", bigger).path != first.path
    os.utime(tmp_path / "b.jar", (1_000_000, 1_000_000))  # the JVM would refuse the archive
    assert service_archive(store, "kafka", "k", _argv(tmp_path)).path != first.path


@pytest.mark.unit
def test_a_node_writes_the_archive_at_exit_until_one_is_kept_then_maps_it(tmp_path: Path) -> None:
    store = tmp_path / "archives"
    store.mkdir()
    archive = service_archive(store, "kafka", "kafka", _argv(tmp_path))
    archive.partial.write_bytes(b"left by a JVM that crashed")
    assert archive.jvm_options() == ([f"-XX:ArchiveClassesAtExit={archive.partial}"], False)
    assert not archive.partial.exists(), "a stale partial archive was kept"
    assert not archive.path.exists()

    archive.partial.write_bytes(b"written at exit")
    other = service_archive(store, "kafka", "secure_kafka", _argv(tmp_path))
    other.partial.write_bytes(b"another stack's node, still running")
    assert keep_written_archive(store, "kafka", stopped_cleanly=True) == archive.path
    assert archive.path.read_bytes() == b"written at exit"
    assert other.partial.exists(), "another node's archive in the making was touched"
    assert archive.jvm_options() == ([f"-XX:SharedArchiveFile={archive.path}"], True)

    # A second node's archive, once one is kept, and one written by a killed JVM, go.
    assert keep_written_archive(store, "secure_kafka", stopped_cleanly=True) is None
    assert not other.partial.exists()
    archive.path.unlink()
    archive.partial.write_bytes(b"cut short")
    assert keep_written_archive(store, "kafka", stopped_cleanly=False) is None
    assert not archive.path.exists()
    assert not archive.partial.exists()


@pytest.mark.unit
def test_a_java_agent_needs_archiving_allowed_and_old_archives_go(tmp_path: Path) -> None:
    store = tmp_path / "archives"
    store.mkdir()
    archive = service_archive(store, "cassandra", "cassandra", _argv(tmp_path, "-javaagent:j.jar"))
    assert archive.jvm_options()[0][:2] == [
        "-XX:+UnlockDiagnosticVMOptions",
        "-XX:+AllowArchivingWithJavaAgent",
    ]
    older = [store / f"cassandra-000000000000000{n}.jsa" for n in range(2)]
    for age, path in enumerate(older):
        path.write_bytes(b"older")
        os.utime(path, (1_000_000 + age, 1_000_000 + age))
    kafka = store / "kafka-0000000000000000.jsa"
    kafka.write_bytes(b"another backend's")
    os.utime(kafka, (1, 1))
    archive.partial.write_bytes(b"new")
    assert keep_written_archive(store, "cassandra", stopped_cleanly=True) == archive.path
    assert sorted(store.glob("cassandra-*.jsa")) == sorted([older[1], archive.path])
    assert len(list(store.glob("*.jsa"))) == class_archive.KEPT_PER_BACKEND + 1
    assert kafka.exists()


@pytest.mark.integration
def test_a_jvm_archives_its_classes_as_it_stops_and_the_next_one_maps_them(
    sleeper: tuple[SleeperService, list[str]],
) -> None:
    service, said = sleeper
    service.up()
    pid = service.process.running_pid()
    assert pid is not None
    assert any(a.startswith("-XX:ArchiveClassesAtExit=") for a in command_line(pid))
    assert service.sleeper_source().startswith("file:")
    assert service.down()
    (archive,) = (service.config.home / "jvm-archives").glob("sleeper-*.jsa")
    assert f"archived its classes for later starts ({archive})" in said[-1]

    service.up()
    pid = service.process.running_pid()
    assert pid is not None
    assert f"-XX:SharedArchiveFile={archive}" in command_line(pid)
    assert service.sleeper_source() == "shared objects file (top)"
    assert service.down()
    assert list(archive.parent.glob("sleeper-*.jsa")) == [archive]
    assert not list(archive.parent.glob(".*.partial"))


@pytest.mark.integration
def test_a_node_that_cannot_start_with_its_archive_starts_without_it(
    sleeper: tuple[SleeperService, list[str]],
) -> None:
    service, said = sleeper
    service.up()
    assert service.down()
    (archive,) = (service.config.home / "jvm-archives").glob("sleeper-*.jsa")
    # Cut short, as a write interrupted would leave it: the JVM that maps it crashes.
    with archive.open("r+b") as handle:
        handle.truncate(archive.stat().st_size // 2)
    service.up()
    assert any(f"did not start with {archive}; removed it" in line for line in said), said
    pid = service.process.running_pid()
    assert pid is not None
    assert not any(a.startswith("-XX:SharedArchiveFile=") for a in command_line(pid))
    assert service.down()
    assert archive.exists(), "the node started without an archive did not write a new one"
