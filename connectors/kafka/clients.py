"""The Kafka clients millstream builds: where they connect and how they authenticate.

:func:`client_settings` for every librdkafka client (:func:`producer`, :func:`consumer`, and
the admin client of :mod:`~millstream.connectors.kafka.topics`), :func:`java_client_settings`
for the Java client of the Spark Kafka source and sink, and :func:`refusal`, which turns
refused credentials and failed TLS into a :class:`~millstream.engine.errors.ConfigError`.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer

from millstream.connectors.logs import LIBRDKAFKA_LOGGER
from millstream.engine.config import MillstreamConfig, setting_name
from millstream.engine.errors import ConfigError

__all__ = [
    "UNREACHABLE",
    "client_settings",
    "consumer",
    "java_client_settings",
    "producer",
    "refusal",
]

_log = logging.getLogger(__name__)


# Codes librdkafka reports when the brokers refuse the credentials, and when TLS fails
# (a certificate the CA does not vouch for, or no TLS at the other end).
_REFUSED = frozenset({KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED})
_TLS_FAILED = frozenset({KafkaError._SSL})
# What an operation reports when it cannot get through to the brokers: down, unreachable,
# or (seen from a client that never got past authentication) refusing the credentials.
UNREACHABLE = frozenset(
    {KafkaError._TRANSPORT, KafkaError._TIMED_OUT, KafkaError._ALL_BROKERS_DOWN, *_REFUSED}
)


def client_settings(config: MillstreamConfig) -> dict[str, Any]:
    """Where and how every librdkafka client millstream builds connects: the bootstrap
    servers and the security settings of ``config``, and an error callback that turns
    refused credentials and failed TLS into a :class:`ConfigError` naming the settings to
    fix, raised from the client's next ``poll``/``flush``/``consume`` (see :func:`refusal`).
    """
    settings: dict[str, Any] = {
        "bootstrap.servers": config.kafka_bootstrap,
        "security.protocol": config.kafka_security_protocol.lower(),
    }
    if config.kafka_sasl:
        # Checked by MillstreamConfig: SASL has both.
        assert config.kafka_username is not None
        assert config.kafka_password is not None
        settings["sasl.mechanisms"] = config.kafka_sasl_mechanism
        settings["sasl.username"] = config.kafka_username
        settings["sasl.password"] = config.kafka_password.reveal()
    if config.kafka_tls and config.kafka_ca_file is not None:
        settings["ssl.ca.location"] = str(config.kafka_ca_file)

    def on_error(error: KafkaError) -> None:
        refused = refusal(config, error)
        if refused is not None:
            raise refused
        # Anything else (a broker down, a timeout) the client retries by itself; the
        # operation that cannot finish reports it.
        _log.debug("kafka client: %s", error)

    settings["error_cb"] = on_error
    # librdkafka's own messages go to the run's log file (millstream.connectors.logs).
    settings["logger"] = logging.getLogger(LIBRDKAFKA_LOGGER)
    return settings


def refusal(config: MillstreamConfig, error: KafkaError) -> ConfigError | None:
    """The :class:`ConfigError` for a Kafka error that means the security settings are
    wrong (credentials refused, TLS failed), or None for any other error. The message names
    the settings and never shows the password."""
    if error.code() in _REFUSED and not _lost_during_handshake(error):
        return ConfigError(
            f"Kafka at {config.kafka_bootstrap} refused the credentials of user "
            f"{config.kafka_username!r} ({config.kafka_sasl_mechanism}): {error.str()}; "
            f"fix {setting_name('kafka', 'username', 'password')}"
        )
    if error.code() in _TLS_FAILED:
        return ConfigError(
            f"TLS to Kafka at {config.kafka_bootstrap} failed: {error.str()}; check "
            f"{setting_name('kafka', 'ca_file')} (the CA that signed the brokers' "
            f"certificates) and {setting_name('kafka', 'security_protocol')}"
        )
    return None


def _lost_during_handshake(error: KafkaError) -> bool:
    """Whether ``error`` is librdkafka's "SASL ... mechanism handshake failed" caused by a
    local error (the connection dropped before the broker answered) rather than by the broker.

    librdkafka reports every failed handshake as an authentication error, its cause in the
    text: ``Local: ...`` for its own errors, ``Broker: ...`` for the broker's answer. A
    connection lost mid-handshake (a busy broker, a client closing) is retried like any
    other, and says nothing about the credentials."""
    return "mechanism handshake failed: Local:" in error.str()


def java_client_settings(config: MillstreamConfig) -> dict[str, str]:
    """The same connection and security settings for Kafka's Java client (the Spark Kafka
    source and sink take them prefixed with ``kafka.``): SASL through a JAAS login module,
    the CA as a PEM truststore. ``sasl.jaas.config`` holds the password; Spark redacts
    options whose value matches ``spark.redaction.regex`` (``password`` does)."""
    settings = {
        "bootstrap.servers": config.kafka_bootstrap,
        "security.protocol": config.kafka_security_protocol,
    }
    if config.kafka_sasl:
        # Checked by MillstreamConfig: SASL has both.
        assert config.kafka_username is not None
        assert config.kafka_password is not None
        module = (
            "org.apache.kafka.common.security.plain.PlainLoginModule"
            if config.kafka_sasl_mechanism == "PLAIN"
            else "org.apache.kafka.common.security.scram.ScramLoginModule"
        )
        settings["sasl.mechanism"] = config.kafka_sasl_mechanism
        settings["sasl.jaas.config"] = (
            f'{module} required username="{_jaas_quoted(config.kafka_username)}" '
            f'password="{_jaas_quoted(config.kafka_password.reveal())}";'
        )
    if config.kafka_tls and config.kafka_ca_file is not None:
        settings["ssl.truststore.type"] = "PEM"
        settings["ssl.truststore.location"] = str(config.kafka_ca_file)
    return settings


def _jaas_quoted(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def producer(config: MillstreamConfig, **settings: str | int | bool) -> Producer:
    """An idempotent producer: a retried send never writes a record twice."""
    return Producer(
        {
            **client_settings(config),
            "enable.idempotence": True,
            "acks": "all",
            # The Java client's partitioner, so a key lands where Java producers put it too.
            "partitioner": "murmur2_random",
            # librdkafka producers (unlike its consumers) ask the broker to create a topic
            # they write to or know of; a stream's topic has the partitions its topology
            # gave it, so one that is missing (deleted under a live producer) is an error,
            # never a new topic with the broker's default partitions.
            "allow.auto.create.topics": False,
            **settings,
        }
    )


def consumer(config: MillstreamConfig, purpose: str, **settings: str | int | bool) -> Consumer:
    """A reader in a consumer group of its own that never commits offsets.

    millstream's progress lives in Spark checkpoints, never in consumer groups; this is for
    reading topics directly (offsets, tests, benchmarks). Without an explicit position it
    starts at the earliest offset. It reads committed data only: never the records of an
    aborted or open transaction. ``purpose`` prefixes the throwaway group id.
    """
    return Consumer(
        {
            **client_settings(config),
            "group.id": f"{purpose}-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            # librdkafka's default too; said here because every millstream reader must skip
            # aborted transactions, as the Spark source does (spark.session.SOURCE_OPTIONS).
            "isolation.level": "read_committed",
            # Once a partition's local queue holds queued.min.messages (100,000), librdkafka
            # waits this long before its next fetch: 1 s by default, which a reader that
            # drains its queue at once (a Spark task reading its batch) spends idle every
            # 100,000 messages. 10 ms read 200,000 messages in 0.13 s instead of 1.1 s.
            "fetch.queue.backoff.ms": 10,
            **settings,
        }
    )
