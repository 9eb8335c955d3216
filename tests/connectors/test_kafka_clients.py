"""Which Kafka client errors mean the security settings are wrong, and which are a connection
lost that the client retries by itself."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError

from millstream.connectors.kafka import refusal
from millstream.engine.config import MillstreamConfig, Secret

pytestmark = pytest.mark.unit


def _config() -> MillstreamConfig:
    return MillstreamConfig(
        kafka_security_protocol="SASL_PLAINTEXT",
        kafka_sasl_mechanism="SCRAM-SHA-512",
        kafka_username="millstream",
        kafka_password=Secret("s3cret-password"),
    )


def test_credentials_the_broker_refused_are_a_config_error_naming_the_settings() -> None:
    error = KafkaError(
        KafkaError._AUTHENTICATION,
        "SASL authentication error: Authentication failed during authentication due to "
        "invalid credentials with SASL mechanism SCRAM-SHA-512 (after 3ms in state AUTH_REQ)",
    )
    refused = refusal(_config(), error)
    assert refused is not None
    assert "refused the credentials of user 'millstream' (SCRAM-SHA-512)" in str(refused)
    assert "MILLSTREAM_KAFKA_PASSWORD" in str(refused)
    assert "s3cret-password" not in str(refused)


def test_a_mechanism_the_broker_does_not_offer_is_a_config_error() -> None:
    error = KafkaError(
        KafkaError._AUTHENTICATION,
        "SASL SCRAM-SHA-512 mechanism handshake failed: Broker: Unsupported SASL mechanism: "
        "broker's supported mechanisms: PLAIN",
    )
    assert refusal(_config(), error) is not None


def test_a_connection_lost_during_the_handshake_is_no_refusal() -> None:
    # What CI saw once while `millstream tail` closed its consumer against the secured
    # broker: librdkafka reports the dropped handshake as an authentication error.
    error = KafkaError(
        KafkaError._AUTHENTICATION,
        "GroupCoordinator: SASL SCRAM-SHA-512 mechanism handshake failed: Local: Broker "
        "transport failure: broker's supported mechanisms: (n/a) (after 0ms in state DOWN)",
    )
    assert refusal(_config(), error) is None


def test_failed_tls_is_a_config_error_and_other_errors_are_not() -> None:
    tls = KafkaError(KafkaError._SSL, "SSL handshake failed: certificate verify failed")
    assert "TLS to Kafka" in str(refusal(_config(), tls))
    down = KafkaError(KafkaError._TRANSPORT, "Connection refused (after 0ms in state CONNECT)")
    assert refusal(_config(), down) is None
