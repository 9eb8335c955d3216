"""The local stack as a user drives it: `millstream up/status`, reuse, Paxos v2, timer slack,
taken ports."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from confluent_kafka import KafkaError, Producer

from millstream.connectors.kafka import admin_client, delete_topics
from millstream.connectors.maven import MavenArtifacts
from millstream.devtools.local.cassandra import CassandraService
from millstream.devtools.local.java import JavaRuntime
from millstream.devtools.local.kafka import KafkaService
from millstream.devtools.local.process import thread_timer_slacks
from millstream.devtools.local.stack import LocalStack
from millstream.engine.config import MillstreamConfig
from millstream.engine.errors import PortInUseError

if TYPE_CHECKING:
    from cassandra.cluster import Session


@pytest.mark.integration
def test_status_reports_each_service_healthy_with_pid_and_memory(
    services: MillstreamConfig,
) -> None:
    statuses = {status.name: status for status in LocalStack(services, print).status()}
    assert set(statuses) == {"kafka", "cassandra"}
    for status in statuses.values():
        assert status.healthy, status
        assert status.pid is not None
        assert status.rss_bytes is not None
        assert status.rss_bytes > 50 * 2**20
    assert statuses["kafka"].address == services.kafka_bootstrap
    assert statuses["cassandra"].address == f"127.0.0.1:{services.cassandra_port}"


@pytest.mark.integration
def test_up_again_reuses_the_running_services(services: MillstreamConfig) -> None:
    stack = LocalStack(services, print)
    before = {status.name: status.pid for status in stack.status()}
    after = {status.name: status.pid for status in stack.up()}
    assert after == before


@pytest.mark.integration
def test_the_cli_reports_status(services: MillstreamConfig) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "millstream.cli", "status"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert any(line.startswith("kafka") and "healthy" in line for line in lines), lines
    assert any(line.startswith("cassandra") and "healthy" in line for line in lines), lines


@pytest.mark.integration
def test_a_deleted_topic_stays_deleted_when_a_client_asks_for_it(
    services: MillstreamConfig,
) -> None:
    # What a producer that still knows a deleted topic does: ask for its metadata, allowing the
    # broker to create it (librdkafka's producer default, and every Java producer's).
    name = f"gone-{uuid.uuid4().hex}"
    asker = Producer(
        {"bootstrap.servers": services.kafka_bootstrap, "allow.auto.create.topics": True}
    )
    try:
        answer = asker.list_topics(name, timeout=10).topics[name]
        assert answer.error is not None
        assert answer.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
        time.sleep(1)  # a topic the broker created would be listed by now
        assert name not in admin_client(services).list_topics(timeout=10).topics
    finally:
        if name in admin_client(services).list_topics(timeout=10).topics:
            delete_topics(services, [name])


@pytest.mark.integration
def test_cassandra_runs_paxos_v2(cassandra: Session) -> None:
    row = cassandra.execute(
        "SELECT value FROM system_views.settings WHERE name = 'paxos_variant'"
    ).one()
    assert row is not None
    assert row.value == "v2"
    purging = cassandra.execute(
        "SELECT value FROM system_views.settings WHERE name = 'paxos_state_purging'"
    ).one()
    assert purging is not None
    assert purging.value == "gc_grace"


@pytest.mark.integration
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="timer slack is Linux's")
def test_every_thread_of_the_cassandra_node_has_its_timer_slack(services: MillstreamConfig) -> None:
    statuses = {status.name: status for status in LocalStack(services, print).status()}
    pid = statuses["cassandra"].pid
    assert pid is not None
    assert set(thread_timer_slacks(pid).values()) == {CassandraService.timer_slack_ns}


@pytest.mark.unit
def test_a_port_held_by_another_process_stops_up_before_anything_starts(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        config = MillstreamConfig(home=tmp_path, kafka_bootstrap=f"127.0.0.1:{port}")
        service = KafkaService(
            config,
            JavaRuntime(Path("/usr/bin/java"), 17),
            MavenArtifacts(tmp_path / "artifacts", print, mvn=str(tmp_path / "no-mvn")),
            print,
        )
        with pytest.raises(PortInUseError, match=f"broker port 127.0.0.1:{port}"):
            service.up()
    assert service.process.running_pid() is None
    assert not (tmp_path / "kafka" / "data").exists()


@pytest.mark.unit
def test_every_node_of_both_backends_stops_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stack = LocalStack(MillstreamConfig(home=tmp_path), print, nodes=3)
    # Each stop returns only once all six are stopping: one backend after the other would
    # break the barrier.
    together = threading.Barrier(len(stack.services), timeout=10)
    for service in stack.services:
        monkeypatch.setattr(service, "down", lambda: together.wait() >= 0)
    assert stack.down() == [True] * 6


def test_a_node_that_fails_before_the_stop_is_raised_once_every_node_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stack = LocalStack(MillstreamConfig(home=tmp_path), print, nodes=3)
    stopped: list[str] = []

    def stop(name: str) -> bool:
        stopped.append(name)
        return True

    for service in stack.services:
        monkeypatch.setattr(service, "down", lambda name=service.name: stop(name))
    first = stack.services[0]

    def unexpected() -> None:
        raise RuntimeError("the node's tables could not be read")

    monkeypatch.setattr(first, "before_down", unexpected)
    with pytest.raises(RuntimeError, match="could not be read"):
        stack.down()
    assert sorted(stopped) == sorted(service.name for service in stack.services)
