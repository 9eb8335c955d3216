from __future__ import annotations

import stat
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from millstream.connectors.maven import MavenArtifacts, pom_path
from millstream.devtools.local import kafka_tools
from millstream.devtools.local.java import JavaRuntime
from millstream.devtools.local.kafka_tools import (
    CONSOLE_CONSUMER,
    TOOLS_LOG4J2_CONFIG,
    kafka_tool_argv,
)
from millstream.engine.config import MillstreamConfig

pytestmark = pytest.mark.unit


def _cached_artifacts(tmp_path: Path) -> tuple[MavenArtifacts, list[Path]]:
    """Artifacts whose kafka-tools classpath is cached, with a Maven that fails if it runs."""
    mvn = tmp_path / "fake-mvn"
    mvn.write_text("#!/bin/sh\necho '[ERROR] must not run'\nexit 1\n")
    mvn.chmod(mvn.stat().st_mode | stat.S_IEXEC)
    artifacts = MavenArtifacts(tmp_path / "artifacts", print, mvn=str(mvn))
    jars = [tmp_path / "kafka-tools-4.3.1.jar", tmp_path / "kafka-clients-4.3.1.jar"]
    for jar in jars:
        jar.write_bytes(b"")
    cache = artifacts.cache_file("kafka-tools")
    cache.parent.mkdir(parents=True)
    cache.write_text(":".join(str(jar) for jar in jars))
    return artifacts, jars


def test_a_tool_runs_on_the_stacks_java_and_kafka_classpath(tmp_path: Path) -> None:
    artifacts, jars = _cached_artifacts(tmp_path)
    java = JavaRuntime(Path("/opt/jdk-17/bin/java"), 17)
    argv = kafka_tool_argv(
        CONSOLE_CONSUMER,
        ["--topic", "anomalies", "--isolation-level", "read_committed"],
        java=java,
        artifacts=artifacts,
    )
    assert argv[0] == "/opt/jdk-17/bin/java"
    assert argv[argv.index("-cp") + 1] == f"{jars[0]}:{jars[1]}"
    assert f"-Dlog4j2.configurationFile={TOOLS_LOG4J2_CONFIG}" in argv
    assert "-Xmx256m" in argv
    # The class, then the tool's options as given, nothing added after the classpath.
    assert argv[argv.index("-cp") + 2 :] == [
        "org.apache.kafka.tools.consumer.ConsoleConsumer",
        "--topic",
        "anomalies",
        "--isolation-level",
        "read_committed",
    ]


def test_the_artifacts_default_to_the_cache_under_the_configs_home(tmp_path: Path) -> None:
    _, jars = _cached_artifacts(tmp_path)
    java = JavaRuntime(Path("/usr/bin/java"), 17)
    config = MillstreamConfig(home=tmp_path)
    argv = kafka_tool_argv(CONSOLE_CONSUMER, config=config, java=java)
    assert argv[argv.index("-cp") + 1] == f"{jars[0]}:{jars[1]}"


def test_the_tools_log_to_stderr_so_stdout_is_their_output() -> None:
    settings = dict(
        line.split(" = ", 1)
        for line in TOOLS_LOG4J2_CONFIG.read_text().splitlines()
        if line and not line.startswith("#")
    )
    assert settings["appender.stderr.target"] == "SYSTEM_ERR"
    assert settings["rootLogger.appenderRef.stderr.ref"] == "STDERR"
    assert not any(value == "SYSTEM_OUT" for value in settings.values())


def test_the_tools_profile_pins_kafka_tools_at_the_brokers_version_apart_from_it() -> None:
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    profiles = ET.parse(pom_path()).getroot().findall("m:profiles/m:profile", ns)

    def versions(profile: str) -> dict[str | None, str | None]:
        (found,) = [p for p in profiles if p.findtext("m:id", namespaces=ns) == profile]
        return {
            d.findtext("m:artifactId", namespaces=ns): d.findtext("m:version", namespaces=ns)
            for d in found.findall("m:dependencies/m:dependency", ns)
        }

    assert versions("kafka-tools")["kafka-tools"] == "${kafka.version}"
    assert versions("kafka")["kafka_${scala.binary.version}"] == "${kafka.version}"
    assert "kafka-tools" not in versions("kafka")  # Connect's runtime stays off the broker


def test_main_without_a_class_prints_its_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ended:
        kafka_tools.main([])
    assert ended.value.code == 2
    assert "usage: python -m millstream.devtools.local.kafka_tools CLASS" in capsys.readouterr().err
    with pytest.raises(SystemExit) as ended:
        kafka_tools.main(["--help"])
    assert ended.value.code == 0
