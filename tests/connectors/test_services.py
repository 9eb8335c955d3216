"""A service not running as a run starts: waits, then an error, that name it and say what to
do."""

from __future__ import annotations

import socket

import pytest

from millstream.connectors.services import reaching, start_through_outage, unreachable
from millstream.engine.config import MillstreamConfig
from millstream.engine.errors import ServiceOutageError
from millstream.engine.outages import unreachable_service
from tests.engine.test_outages import Clock

pytestmark = pytest.mark.unit


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


@pytest.fixture
def listening() -> socket.socket:
    """A port that accepts connections, standing in for a running service."""
    return socket.create_server(("127.0.0.1", 0))


def test_a_service_down_is_named_with_its_address_and_what_to_do(
    listening: socket.socket,
) -> None:
    kafka = closed_port()
    config = MillstreamConfig(
        kafka_bootstrap=f"127.0.0.1:{kafka}",
        cassandra_port=listening.getsockname()[1],
    )
    with listening:
        assert unreachable(config) == [f"Kafka at 127.0.0.1:{kafka} (connection refused)"]
        with pytest.raises(ServiceOutageError) as failed, reaching(config):
            raise TimeoutError()  # what Kafka's admin client raises when nobody answers
    message = str(failed.value)
    assert message.startswith(f"Kafka at 127.0.0.1:{kafka} (connection refused) cannot be")
    assert "`millstream up` starts it" in message
    assert "[kafka] bootstrap (MILLSTREAM_KAFKA_BOOTSTRAP)" in message
    assert "cassandra" not in message.lower()
    assert isinstance(failed.value.__cause__, TimeoutError)


def test_both_services_down_are_both_named() -> None:
    port = closed_port()
    config = MillstreamConfig(kafka_bootstrap=f"localhost:{port}", cassandra_port=port)
    both = r"^Kafka at .* and Cassandra at 127\.0\.0\.1"
    with pytest.raises(ServiceOutageError, match=both) as failed, reaching(config):
        raise RuntimeError("NoHostAvailable: ('Unable to connect to any servers', {})")
    assert failed.value.down == (
        f"Kafka at localhost:{port} (connection refused)",
        f"Cassandra at 127.0.0.1:{port} (connection refused)",
    )
    assert unreachable_service(failed.value) == "Kafka and Cassandra"


def test_other_failures_and_outages_of_services_that_answer_go_through_as_they_are(
    listening: socket.socket,
) -> None:
    port = listening.getsockname()[1]
    config = MillstreamConfig(kafka_bootstrap=f"127.0.0.1:{port}", cassandra_port=port)
    with listening:
        with pytest.raises(ValueError, match="a bug"), reaching(config):
            raise ValueError("a bug")
        with pytest.raises(TimeoutError, match="slow"), reaching(config):
            raise TimeoutError("slow")  # everything answers: not for this module to explain


NO_HOST = "NoHostAvailable: ('Unable to connect to any servers', {})"


def test_a_start_during_an_outage_waits_saying_what_to_do_and_starts_once_it_is_over(
    listening: socket.socket, caplog: pytest.LogCaptureFixture
) -> None:
    cassandra = closed_port()
    config = MillstreamConfig(
        kafka_bootstrap=f"127.0.0.1:{listening.getsockname()[1]}", cassandra_port=cassandra
    )
    clock = Clock()
    failures = [RuntimeError(NO_HOST), RuntimeError(NO_HOST)]

    def start() -> str:
        if failures:
            raise failures.pop()
        return "started"

    caplog.set_level("WARNING", logger="millstream.engine.outages")
    with listening:
        started = start_through_outage(
            config,
            "injector 'a' starting",
            start,
            60.0,
            sleep=clock.sleep,
            monotonic=lambda: clock.now,
        )
    assert started == "started"
    assert clock.slept == [0.5, 1.0]
    first, second = (m for m in caplog.messages if ": waiting for " in m)
    # Where the service was looked for, and at the first wait what to do.
    where = f"Cassandra at 127.0.0.1:{cassandra} (connection refused)"
    assert first == (
        "injector 'a' starting: waiting for Cassandra (0 s so far; if it stopped, `millstream "
        f"status` shows the local stack, `millstream up` starts it): {where}"
    )
    assert second == f"injector 'a' starting: waiting for Cassandra (0 s so far): {where}"


def test_a_service_down_past_the_timeout_stops_the_start_naming_it(
    listening: socket.socket,
) -> None:
    kafka = closed_port()
    config = MillstreamConfig(
        kafka_bootstrap=f"127.0.0.1:{kafka}", cassandra_port=listening.getsockname()[1]
    )
    clock = Clock()
    attempts: list[float] = []

    def start() -> None:
        attempts.append(clock.now)
        raise TimeoutError()  # what Kafka's admin client raises when nobody answers

    with listening, pytest.raises(ServiceOutageError) as failed:
        start_through_outage(
            config,
            "topology 't' starting",
            start,
            30.0,
            sleep=clock.sleep,
            monotonic=lambda: clock.now,
        )
    message = str(failed.value)
    assert message.startswith("topology 't' starting: Kafka unreachable for 3")
    assert f"last error: Kafka at 127.0.0.1:{kafka} (connection refused). Bring Kafka" in message
    assert "`millstream up` starts it" in message
    # What reaching() said, with the settings that point elsewhere, is its cause.
    assert "[kafka] bootstrap" in str(failed.value.__cause__)
    assert max(attempts) >= 30.0
    assert max(clock.slept) == 5.0


def test_a_start_that_fails_otherwise_is_not_waited_on() -> None:
    port = closed_port()
    config = MillstreamConfig(kafka_bootstrap=f"127.0.0.1:{port}", cassandra_port=port)
    clock = Clock()

    def start() -> None:
        raise ValueError("a bug")

    with pytest.raises(ValueError, match="a bug"):
        start_through_outage(
            config, "s", start, 60.0, sleep=clock.sleep, monotonic=lambda: clock.now
        )
    assert clock.slept == []
