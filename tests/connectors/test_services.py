"""A service not running as a run starts: an error that names it and says what to do."""

from __future__ import annotations

import socket

import pytest

from millstream.connectors.services import reaching, unreachable
from millstream.engine.config import MillstreamConfig
from millstream.engine.errors import ServiceOutageError

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
    with pytest.raises(ServiceOutageError, match=both), reaching(config):
        raise RuntimeError("NoHostAvailable: ('Unable to connect to any servers', {})")


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
