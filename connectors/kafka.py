"""Kafka plumbing shared by the engine, injectors, examples and tests.

Streams are Kafka topics of the same name: stream ``searches`` is topic ``searches``, and a
computation's dead letters go to ``<computation>.dead-letters``. Stream names are restricted
to Kafka's topic alphabet (see :mod:`millstream.engine.topology`) so the mapping is the
identity; :func:`stream_topic` is the one place that says so.

Low-watermark reports (:mod:`millstream.engine.watermarks`) travel on one compacted topic,
``config.kafka_watermark_topic`` (default ``millstream.watermarks``), keyed by source name,
so Kafka keeps each source's latest report: :func:`create_watermark_topic`,
:class:`WatermarkPublisher`, :class:`WatermarkReader`.
"""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence, Set
from concurrent.futures import Future
from functools import partial
from typing import Any, TypeVar

from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType

from millstream.engine.config import MillstreamConfig, setting_name
from millstream.engine.errors import ConfigError, WatermarkReportError
from millstream.engine.productions import Production
from millstream.engine.watermarks import (
    ExpectedSet,
    Offsets,
    WatermarkMessage,
    WatermarkReport,
    decode_watermark_message,
)

__all__ = [
    "WAKE_TOPIC_CONFIG",
    "WATERMARK_TOPIC_CONFIG",
    "KafkaProductionSink",
    "KafkaWatermarkChannel",
    "WatermarkPublisher",
    "WatermarkReader",
    "admin_client",
    "alarm_topic",
    "client_settings",
    "consumer",
    "create_topics",
    "create_wake_topics",
    "create_watermark_topic",
    "delete_topics",
    "delete_wake_topics",
    "end_offsets",
    "java_client_settings",
    "producer",
    "refusal",
    "stream_topic",
    "wake_topic",
]

_log = logging.getLogger(__name__)

_T = TypeVar("_T")


# Codes librdkafka reports when the brokers refuse the credentials, and when TLS fails
# (a certificate the CA does not vouch for, or no TLS at the other end).
_REFUSED = frozenset({KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED})
_TLS_FAILED = frozenset({KafkaError._SSL})
_UNREACHABLE = frozenset(
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
    return settings


def refusal(config: MillstreamConfig, error: KafkaError) -> ConfigError | None:
    """The :class:`ConfigError` for a Kafka error that means the security settings are
    wrong (credentials refused, TLS failed), or None for any other error. The message names
    the settings and never shows the password."""
    if error.code() in _REFUSED:
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


def admin_client(config: MillstreamConfig) -> AdminClient:
    return AdminClient(client_settings(config), logger=_log)


def producer(config: MillstreamConfig, **settings: str | int | bool) -> Producer:
    """An idempotent producer: a retried send never writes a record twice."""
    return Producer(
        {
            **client_settings(config),
            "enable.idempotence": True,
            "acks": "all",
            # The Java client's partitioner, so a key lands where Java producers put it too.
            "partitioner": "murmur2_random",
            **settings,
        },
        logger=_log,
    )


def consumer(config: MillstreamConfig, purpose: str, **settings: str | int | bool) -> Consumer:
    """A reader in a consumer group of its own that never commits offsets.

    millstream's progress lives in Spark checkpoints, never in consumer groups; this is for
    reading topics directly (offsets, tests, benchmarks). Without an explicit position it
    starts at the earliest offset. ``purpose`` prefixes the throwaway group id.
    """
    return Consumer(
        {
            **client_settings(config),
            "group.id": f"{purpose}-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "logger": _log,
            **settings,
        }
    )


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
    not as a timeout."""
    deadline = time.monotonic() + timeout
    while not future.done() and time.monotonic() < deadline:
        admin.poll(0.1)
    future.result(timeout=max(0.0, deadline - time.monotonic()))


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
    return _when_ready(lambda: _end_offsets(reader, topics, timeout), timeout)


def _when_ready(call: Callable[[], _T], timeout: float) -> _T:
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


def _end_offsets(reader: Consumer, topics: Sequence[str], timeout: float) -> Offsets:
    try:
        return _end_offsets_once(reader, topics, timeout)
    except KafkaException as exc:
        # What a client that never got past authentication reports instead.
        unreachable = exc.args[0].code() in _UNREACHABLE
        if unreachable and not reader.assignment():
            # Nothing to consume, so a poll only serves the error callback, which raises
            # ConfigError if the brokers refused our credentials (the real cause to report).
            reader.poll(0)
        raise


def _end_offsets_once(reader: Consumer, topics: Sequence[str], timeout: float) -> Offsets:
    ends: dict[str, dict[int, int]] = {}
    for topic in topics:
        metadata = reader.list_topics(topic, timeout=timeout).topics[topic]
        if metadata.error is not None:
            raise KafkaException(metadata.error)
        ends[topic] = {
            partition: reader.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=timeout
            )[1]
            for partition in metadata.partitions
        }
    return ends


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
    entries = _when_ready(
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


class WatermarkPublisher:
    """Publishes :class:`~millstream.engine.watermarks.WatermarkReport` s, keyed by source.

    For an injector or any producer of a stream: after writing records, call
    :meth:`report_streams` with the watermark those writes reached; it covers them with the
    streams' current end offsets, so no consumer applies it before reading them.
    """

    def __init__(self, config: MillstreamConfig) -> None:
        self.config = config
        self.topic = config.kafka_watermark_topic
        # Before the first write, which would otherwise auto-create it uncompacted.
        create_watermark_topic(config)
        self._producer = producer(config)
        self._wake_topics: set[str] = set()  # known to exist
        self._errors: list[KafkaError] = []

    def publish(self, report: WatermarkReport, timeout: float = 30.0) -> None:
        """Write one report, wait for Kafka to acknowledge it, then wake the consumers of the
        streams it names (after: a woken batch must find the report)."""
        self._write(self.topic, report.source, report.encode(), timeout)
        if report.streams:
            self.wake([wake_topic(self.config, s) for s in report.streams], report.source, timeout)

    def wake(self, topics: Sequence[str], source: str, timeout: float = 30.0) -> None:
        """Write an empty message to each wake or alarm topic (created if missing)."""
        missing = [t for t in topics if t not in self._wake_topics]
        if missing:
            create_wake_topics(self.config, missing)
            self._wake_topics.update(missing)
        for topic in topics:
            self._write(topic, source, b"", timeout, flush=False)
        self._flush(source, timeout)

    def report_streams(
        self,
        reader: Consumer,
        source: str,
        streams: Sequence[str],
        watermark: int,
        sequence: int,
        timeout: float = 30.0,
        *,
        records: int | None = None,
    ) -> WatermarkReport:
        """Report that ``source`` writes nothing older than ``watermark`` to ``streams`` any
        more; ``sequence`` must grow with every report of the source (e.g. wall-clock µs).
        ``records``: how many records it wrote, its weight in percentile watermarks."""
        offsets = end_offsets(reader, [stream_topic(s) for s in streams], timeout)
        report = WatermarkReport(
            source, tuple(streams), watermark, sequence, offsets, records=records
        )
        self.publish(report, timeout)
        return report

    def retire(self, source: str, timeout: float = 30.0) -> None:
        """Forget a source for good (a tombstone): it no longer holds any watermark."""
        self._write(self.topic, source, None, timeout)

    def declare(self, expected: ExpectedSet, timeout: float = 30.0) -> None:
        """Publish an injector's expected set (then wake its streams' consumers)."""
        self._write(self.topic, expected.key, expected.encode(), timeout)
        if expected.streams:
            self.wake([wake_topic(self.config, s) for s in expected.streams], expected.key, timeout)

    def close(self, timeout: float = 30.0) -> None:
        self._producer.flush(timeout)

    def _write(
        self, topic: str, source: str, value: bytes | None, timeout: float, flush: bool = True
    ) -> None:
        def delivered(error: KafkaError | None, _message: Message) -> None:
            if error is not None:
                self._errors.append(error)

        self._producer.produce(topic, key=source.encode(), value=value, on_delivery=delivered)
        if flush:
            self._flush(source, timeout)

    def _flush(self, source: str, timeout: float) -> None:
        unflushed = self._producer.flush(timeout)  # runs the delivery callbacks
        errors, self._errors = self._errors, []
        if unflushed or errors:
            raise KafkaException(
                errors[0] if errors else KafkaError(KafkaError._MSG_TIMED_OUT),
                f"watermark report or wake-up of {source!r} was not acknowledged by Kafka "
                f"within {timeout} s; is Kafka up?",
            )


class WatermarkReader:
    """Reads the watermark topic from its beginning, a call at a time up to its current end.

    :meth:`read` returns ``(source, report)`` pairs in topic order; ``report`` is ``None`` for
    a retired source. Messages that are not reports are logged and counted in ``skipped``
    (one bad producer must not stop every consumer's watermark).
    """

    def __init__(self, config: MillstreamConfig) -> None:
        self.topic = config.kafka_watermark_topic
        self._config = config
        self._consumer = self._new_consumer()
        self._next: dict[int, int] = {}
        self._assigned = False
        self.skipped = 0

    def read(self, timeout: float = 30.0) -> list[tuple[str, WatermarkMessage | None]]:
        """The messages after those read before, up to the topic's end now.

        A read that fails (Kafka down, a timeout) returns nothing and moves nothing: the next
        read starts where this one did, so no report is ever skipped.
        """
        ends = end_offsets(self._consumer, [self.topic], timeout)[self.topic]
        if not self._assigned or ends.keys() - self._next.keys():
            # Assigned once (again only if partitions are added, or after a failed read):
            # re-assigning resets the fetcher, which then takes a second or more to deliver.
            for partition in ends:
                self._next.setdefault(partition, 0)
            self._consumer.assign(
                [TopicPartition(self.topic, p, self._next[p]) for p in sorted(ends)]
            )
            self._assigned = True
        position = dict(self._next)
        wanted = {p: end for p, end in ends.items() if position[p] < end}
        found: list[tuple[str, WatermarkMessage | None]] = []
        deadline = time.monotonic() + timeout
        try:
            while any(position[p] < end for p, end in wanted.items()):
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"could not read {self.topic!r} up to its end within {timeout} s"
                    )
                message = self._consumer.poll(0.1)
                if message is None:
                    # Compaction leaves gaps in the offsets; the fetch position skips them.
                    for fetched in self._consumer.position(
                        [TopicPartition(self.topic, p) for p in wanted]
                    ):
                        if fetched.offset >= 0:
                            position[fetched.partition] = max(
                                position[fetched.partition], fetched.offset
                            )
                    continue
                if message.error() is not None:
                    raise KafkaException(message.error())
                at, offset = message.partition(), message.offset()
                # Both are set on a consumed message.
                assert at is not None
                assert offset is not None
                position[at] = offset + 1
                found.extend(self._parse(message))
        except BaseException:
            self._assigned = False  # the consumer's position is past ours: seek back
            raise
        self._next = position
        return found

    def _new_consumer(self) -> Consumer:
        # Fetches return at once: a driver reads before every batch and must not wait.
        return consumer(self._config, "millstream-watermarks", **{"fetch.wait.max.ms": 10})

    def reconnect(self) -> None:
        """Replace the Kafka consumer (after an outage left it failing); the next read goes
        on from the last message a read returned."""
        old, self._consumer = self._consumer, self._new_consumer()
        self._assigned = False
        old.close()

    def _parse(self, message: Message) -> list[tuple[str, WatermarkMessage | None]]:
        source = (message.key() or b"").decode(errors="replace")
        value = message.value()
        if value is None:
            return [(source, None)]
        try:
            decoded = decode_watermark_message(value)
        except WatermarkReportError as exc:
            self.skipped += 1
            _log.warning("skipping %s@%d: %s", self.topic, message.offset(), exc)
            return []
        if isinstance(decoded, ExpectedSet):
            return [(decoded.key, decoded)]
        return [(decoded.source, decoded)]

    def close(self) -> None:
        self._consumer.close()


class KafkaWatermarkChannel:
    """The watermark topic as an injector process uses it (``injectors.process``'s
    ``WatermarkChannel``): publish and read reports and expected sets, and the end offsets a
    report covers."""

    def __init__(self, config: MillstreamConfig) -> None:
        self.publisher = WatermarkPublisher(config)
        self.reader = WatermarkReader(config)
        self._offsets = consumer(config, "millstream-injector-offsets")

    def publish(self, report: WatermarkReport) -> None:
        self.publisher.publish(report)

    def declare(self, expected: ExpectedSet) -> None:
        self.publisher.declare(expected)

    def retire(self, source: str) -> None:
        self.publisher.retire(source)

    def end_offsets(self, streams: Sequence[str]) -> Offsets:
        return end_offsets(self._offsets, [stream_topic(s) for s in streams])

    def read(self) -> list[tuple[str, WatermarkMessage | None]]:
        return self.reader.read()

    def close(self) -> None:
        self._offsets.close()
        self.reader.close()
        self.publisher.close()


class KafkaProductionSink:
    """The :class:`~millstream.engine.productions.ProductionSink` that writes to Kafka.

    Each production becomes one Kafka message on :func:`stream_topic` of its stream, keyed by
    the record's key, valued by its Avro envelope. ``send`` returns the IDs whose delivery
    the broker acknowledged (``acks=all``, idempotent producer) within ``timeout``; the rest
    stay queued in the producer and may still arrive, which is why the engine keeps them
    pending and consumers deduplicate by record ID.
    """

    def __init__(self, config: MillstreamConfig, **settings: str | int | bool) -> None:
        self._producer = producer(config, **settings)

    def send(self, productions: Sequence[Production], timeout: float) -> Set[bytes]:
        acknowledged: set[bytes] = set()
        deadline = time.monotonic() + timeout

        def delivered(error: KafkaError | None, message: Message, record_id: bytes) -> None:
            if error is None:
                acknowledged.add(record_id)
            else:
                _log.warning("production %s not delivered: %s", record_id.hex(), error)

        for production in productions:
            record = production.record
            while True:
                try:
                    self._producer.produce(
                        stream_topic(production.stream),
                        key=record.key.encode(),
                        value=production.envelope,
                        on_delivery=partial(delivered, record_id=record.record_id),
                    )
                    break
                except BufferError:
                    # The local queue is full: let deliveries drain it, unless time is up.
                    if time.monotonic() >= deadline:
                        return frozenset(acknowledged)
                    self._producer.poll(0.05)
        self._producer.flush(max(0.0, deadline - time.monotonic()))
        # A copy: deliveries acknowledged after the deadline must not change the answer.
        return frozenset(acknowledged)

    def close(self, timeout: float = 30.0) -> int:
        """Deliver what is queued; returns how many messages are still undelivered."""
        return self._producer.flush(timeout)
