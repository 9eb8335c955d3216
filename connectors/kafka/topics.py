"""Kafka topics: their names, their creation and deletion, and their end offsets.

Streams are topics of the same name (:func:`stream_topic`); the watermark topic is compacted
(:func:`create_watermark_topic`); wake and alarm topics start batches (:func:`wake_topic`,
:func:`alarm_topic`).
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType

from millstream.connectors.kafka.clients import UNREACHABLE, client_settings
from millstream.engine.config import MillstreamConfig
from millstream.engine.errors import ConfigError
from millstream.engine.watermarks import Offsets

__all__ = [
    "WAKE_TOPIC_CONFIG",
    "WATERMARK_TOPIC_CONFIG",
    "admin_client",
    "alarm_topic",
    "create_topics",
    "create_wake_topics",
    "create_watermark_topic",
    "delete_topics",
    "delete_wake_topics",
    "end_offsets",
    "start_offsets",
    "stream_topic",
    "wake_topic",
    "when_ready",
]

_log = logging.getLogger(__name__)

_T = TypeVar("_T")


def admin_client(config: MillstreamConfig) -> AdminClient:
    return AdminClient(client_settings(config))


def create_topics(
    config: MillstreamConfig,
    names: Sequence[str],
    partitions: int = 1,
    replication: int | None = None,
    topic_config: Mapping[str, str] | None = None,
    timeout: float = 30.0,
) -> None:
    """Create topics; ones that already exist are left as they are.

    Each partition gets ``replication`` replicas, by default ``config.kafka_replication``, so
    every topic millstream creates (streams, dead letters, the watermark, wake and alarm
    topics) is replicated as configured. How many replicas must acknowledge a write is the
    brokers' ``min.insync.replicas`` (or ``topic_config``'s).
    """
    replicas = config.kafka_replication if replication is None else replication
    admin = admin_client(config)
    futures = admin.create_topics(
        [NewTopic(name, partitions, replicas, config=dict(topic_config or {})) for name in names],
        operation_timeout=timeout,
    )
    for future in futures.values():
        try:
            _result(admin, future, timeout)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise


def delete_topics(config: MillstreamConfig, names: Sequence[str], timeout: float = 30.0) -> None:
    """Delete topics; ones that do not exist are ignored."""
    if not names:
        return
    admin = admin_client(config)
    for future in admin.delete_topics(list(names), operation_timeout=timeout).values():
        try:
            _result(admin, future, timeout)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise


def _result(admin: AdminClient, future: Future[None], timeout: float) -> None:
    """``future.result(timeout)``, serving the admin client's error callback meanwhile: refused
    credentials then fail at once with a :class:`ConfigError` (see :func:`client_settings`),
    not as a timeout. No answer in time raises a ``KafkaException`` of ``_TIMED_OUT``."""
    deadline = time.monotonic() + timeout
    while not future.done() and time.monotonic() < deadline:
        admin.poll(0.1)
    try:
        future.result(timeout=max(0.0, deadline - time.monotonic()))
    except TimeoutError:  # concurrent.futures' own since Python 3.11
        # As librdkafka's own timeouts are: an outage that names Kafka (a bare TimeoutError
        # says neither which service nor what it was asked).
        raise _admin_timeout(timeout) from None


def _admin_timeout(timeout: float) -> KafkaException:
    """What :func:`_result` raises for an admin request Kafka did not answer in ``timeout``."""
    return KafkaException(
        KafkaError(
            KafkaError._TIMED_OUT, f"Kafka did not answer an admin request within {timeout:g} s"
        )
    )


def stream_topic(stream: str) -> str:
    """The Kafka topic that carries ``stream``: the same name."""
    return stream


# What a topic reports between its creation and its partitions getting a leader.
_NOT_READY = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._UNKNOWN_PARTITION,
        KafkaError._UNKNOWN_TOPIC,
        # Between two leaders of a partition (a broker of a replicated cluster restarted and
        # took its partitions back): a new leader whose high watermark has not caught up
        # answers ListOffsets with OFFSET_NOT_AVAILABLE, and epochs are briefly out of step.
        # These carry no retriable flag from get_watermark_offsets (found by the proving
        # ground on the 3-broker cluster: a driver died as the killed broker came back).
        KafkaError.OFFSET_NOT_AVAILABLE,
        KafkaError.UNKNOWN_LEADER_EPOCH,
        KafkaError.FENCED_LEADER_EPOCH,
        KafkaError.REPLICA_NOT_AVAILABLE,
        KafkaError.REQUEST_TIMED_OUT,
        # A killed broker of a replicated cluster drops out of the metadata and librdkafka
        # decommissions its handle, failing what was in flight on it; the next call goes to
        # the partition's new leader (found by the proving ground on the 3-broker cluster).
        KafkaError._DESTROY_BROKER,
    }
)


def end_offsets(reader: Consumer, topics: Sequence[str], timeout: float = 10.0) -> Offsets:
    """The offset the next message of each partition of ``topics`` will get.

    Retriable broker errors (a topic just created has no leader yet) are retried until
    ``timeout``.
    """
    return when_ready(lambda: _offsets(reader, topics, timeout, _HIGH), timeout)


def start_offsets(reader: Consumer, topics: Sequence[str], timeout: float = 10.0) -> Offsets:
    """The first offset each partition of ``topics`` still keeps (retention and deleted
    records move it), retried as :func:`end_offsets` is."""
    return when_ready(lambda: _offsets(reader, topics, timeout, _LOW), timeout)


def when_ready(call: Callable[[], _T], timeout: float) -> _T:
    """``call()``, retried while Kafka answers with a retriable error or one of a topic not
    ready yet (just created: no leader, or not known to every broker), until ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return call()
        except KafkaException as exc:
            error = exc.args[0]
            if not isinstance(error, KafkaError) or not (
                error.retriable() or error.code() in _NOT_READY
            ):
                raise
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.1)


_LOW, _HIGH = 0, 1  # which of a partition's watermark offsets


def _offsets(reader: Consumer, topics: Sequence[str], timeout: float, which: int) -> Offsets:
    try:
        return _offsets_once(reader, topics, timeout, which)
    except KafkaException as exc:
        # What a client that never got past authentication reports instead.
        unreachable = exc.args[0].code() in UNREACHABLE
        if unreachable and not reader.assignment():
            # Nothing to consume, so a poll only serves the error callback, which raises
            # ConfigError if the brokers refused our credentials (the real cause to report).
            reader.poll(0)
        raise


def _offsets_once(reader: Consumer, topics: Sequence[str], timeout: float, which: int) -> Offsets:
    found: dict[str, dict[int, int]] = {}
    for topic in topics:
        metadata = reader.list_topics(topic, timeout=timeout).topics[topic]
        if metadata.error is not None:
            raise KafkaException(metadata.error)
        found[topic] = {
            partition: reader.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=timeout
            )[which]
            for partition in metadata.partitions
        }
    return found


WATERMARK_TOPIC_CONFIG: Mapping[str, str] = {
    # Only each source's latest report matters; compaction keeps it forever.
    "cleanup.policy": "compact",
    # Reports are small and frequent: roll and compact hourly, not weekly.
    "segment.ms": "3600000",
    "min.cleanable.dirty.ratio": "0.1",
    # A retired source (tombstone) disappears after a day.
    "delete.retention.ms": "86400000",
}


def create_watermark_topic(config: MillstreamConfig, timeout: float = 30.0) -> None:
    """Create the compacted watermark topic (one partition: reports stay in order), or check
    that the existing one is compacted.

    A topic that deletes old messages would lose a quiet source's last report, and with it
    the floor that keeps a restarted computation's watermark from going backwards.
    """
    topic = config.kafka_watermark_topic
    create_topics(config, [topic], partitions=1, topic_config=WATERMARK_TOPIC_CONFIG)
    resource = ConfigResource(ResourceType.TOPIC, topic)
    admin = admin_client(config)  # kept alive: its futures fail once it is collected
    # Just created, the topic may not be known to the broker that answers yet.
    entries = when_ready(
        lambda: admin.describe_configs([resource])[resource].result(timeout=timeout), timeout
    )
    policy = entries["cleanup.policy"].value
    if "compact" not in (policy or "").split(","):
        raise ConfigError(
            f"the watermark topic {topic!r} exists with cleanup.policy={policy!r}, not "
            f"compact (was it auto-created?); run `kafka-configs.sh --alter --entity-type topics "
            f"--entity-name {topic} --add-config cleanup.policy=compact` or name another topic "
            "in [kafka] watermark_topic"
        )


WAKE_TOPIC_CONFIG: Mapping[str, str] = {
    # A wake-up message only starts a batch; nobody reads it after that.
    "cleanup.policy": "delete",
    "retention.ms": "3600000",
    "segment.ms": "3600000",
}

_MAX_TOPIC_NAME = 249


def _bounded_topic(prefix: str, name: str) -> str:
    topic = f"{prefix}{name}"
    if len(topic) <= _MAX_TOPIC_NAME:
        return topic
    return f"{prefix}{hashlib.sha256(name.encode()).hexdigest()[:32]}"


def wake_topic(config: MillstreamConfig, stream: str) -> str:
    """The topic whose messages start a batch of every consumer of ``stream``.

    A query reads its data topics and the wake topics of its input streams, not the watermark
    topic: a report wakes only the consumers of the streams it names, never its own
    computation (whose report names its outputs). The driver reads the reports themselves.
    """
    return _bounded_topic(f"{config.kafka_watermark_topic}.wake.", stream)


def alarm_topic(config: MillstreamConfig, topology: str, computation: str) -> str:
    """The topic whose messages start a batch of one computation: its wall-time alarms, and
    its start (so a restarted computation runs its pending timers and productions)."""
    return _bounded_topic(f"{config.kafka_watermark_topic}.alarm.", f"{topology}.{computation}")


def create_wake_topics(config: MillstreamConfig, topics: Sequence[str]) -> None:
    """Create wake or alarm topics (one partition, short retention); existing ones stay."""
    create_topics(config, topics, partitions=1, topic_config=WAKE_TOPIC_CONFIG)


def delete_wake_topics(config: MillstreamConfig, timeout: float = 30.0) -> None:
    """Delete every wake and alarm topic of ``config``'s watermark topic."""
    prefixes = tuple(f"{config.kafka_watermark_topic}.{kind}." for kind in ("wake", "alarm"))
    admin = admin_client(config)
    names = admin.list_topics(timeout=timeout).topics
    delete_topics(config, sorted(n for n in names if n.startswith(prefixes)), timeout)
