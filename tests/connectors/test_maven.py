from __future__ import annotations

import stat
from pathlib import Path

import pytest

from millstream.connectors.maven import (
    MavenArtifacts,
    artifact_name,
    check_spark_version,
    connector_jars,
    pinned_versions,
)
from millstream.engine.errors import MavenError

pytestmark = pytest.mark.unit


def test_pinned_versions_are_the_required_lines() -> None:
    versions = pinned_versions()
    assert versions["kafka.version"].startswith("4.")
    assert versions["cassandra.version"].startswith("5.0.")
    assert versions["spark.version"].startswith("4.")


@pytest.mark.parametrize(
    ("jar", "name"),
    [
        ("spark-sql-kafka-0-10_2.13-4.2.0.jar", "spark-sql-kafka-0-10_2.13"),
        ("zstd-jni-1.5.7-7.jar", "zstd-jni"),
        ("kafka-clients-3.9.2.jar", "kafka-clients"),
        ("commons-pool2-2.13.1.jar", "commons-pool2"),
        ("spark-tags_2.13-4.2.0.jar", "spark-tags_2.13"),
    ],
)
def test_artifact_name(jar: str, name: str) -> None:
    assert artifact_name(Path(jar)) == name


def test_spark_keeps_its_own_copies_of_shared_libraries() -> None:
    resolved = [
        Path(p)
        for p in (
            "/m2/spark-sql-kafka-0-10_2.13-4.2.0.jar",
            "/m2/kafka-clients-3.9.2.jar",
            "/m2/scala-library-2.13.15.jar",
            "/m2/lz4-java-1.10.1.jar",
            "/m2/commons-pool2-2.13.1.jar",
        )
    ]
    provided = [Path("/spark/scala-library-2.13.17.jar"), Path("/spark/lz4-java-1.11.0.jar")]
    assert [jar.name for jar in connector_jars(resolved, provided)] == [
        "spark-sql-kafka-0-10_2.13-4.2.0.jar",
        "kafka-clients-3.9.2.jar",
        "commons-pool2-2.13.1.jar",
    ]


def test_connector_for_another_spark_line_is_refused() -> None:
    pinned = pinned_versions()["spark.version"]
    check_spark_version(pinned)
    major, minor = pinned.split(".")[:2]
    with pytest.raises(MavenError, match="pinned Spark Kafka connector is for Spark"):
        check_spark_version(f"{major}.{int(minor) + 1}.0")


def _fake_mvn(folder: Path, output: str) -> str:
    mvn = folder / "fake-mvn"
    mvn.write_text(f"#!/bin/sh\ncat <<'OUT'\n{output}\nOUT\nexit 1\n")
    mvn.chmod(mvn.stat().st_mode | stat.S_IEXEC)
    return str(mvn)


def test_unreachable_repository_is_explained(tmp_path: Path) -> None:
    mvn = _fake_mvn(
        tmp_path,
        "[ERROR] Failed to execute goal: Could not transfer artifact org.apache.kafka:kafka_2.13"
        ":pom:4.3.1 from/to central: Unknown host repo.maven.apache.org",
    )
    artifacts = MavenArtifacts(tmp_path / "cache", print, mvn=mvn)
    with pytest.raises(MavenError, match=r"(?s)could not reach its repository.*settings.xml"):
        artifacts.classpath("kafka")


def test_missing_maven_is_explained(tmp_path: Path) -> None:
    artifacts = MavenArtifacts(tmp_path, print, mvn=str(tmp_path / "no-such-mvn"))
    with pytest.raises(MavenError, match=r"is not on PATH.*Install Maven"):
        artifacts.classpath("cassandra")


def test_a_cached_classpath_skips_maven(tmp_path: Path) -> None:
    # Warm start: a cached classpath whose jars exist is used without running Maven
    # (the fake mvn would fail if it ran).
    mvn = _fake_mvn(tmp_path, "[ERROR] must not run")
    artifacts = MavenArtifacts(tmp_path / "cache", print, mvn=mvn)
    with pytest.raises(MavenError):
        artifacts.classpath("kafka")
    jar = tmp_path / "a-1.0.jar"
    jar.write_bytes(b"")
    artifacts.cache_file("kafka").write_text(str(jar))
    assert artifacts.classpath("kafka") == [jar]
    # A cached classpath naming a jar that has since vanished is resolved again.
    jar.unlink()
    with pytest.raises(MavenError):
        artifacts.classpath("kafka")
