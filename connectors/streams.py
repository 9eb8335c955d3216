"""Looking at streams from a shell: write JSON lines to a stream, print a stream as JSON lines.

:func:`produce_lines` (``millstream produce``) turns lines such as
``{"key": "u1", "value": {"q": "kafka"}, "timestamp": 1700000000000000, "id": "e-17"}`` into
records on a stream's topic (see :func:`parse_line` for the rules). Record IDs are stable, so
producing the same input again yields the same IDs, which consumers drop as duplicates: a line
with an ``id`` gets an ID derived from the source name and that ``id``, any other line one
derived from the source name, the stream and its line number. A line that is not a valid
record is reported with its line number and skipped; the rest are still sent.

With ``report_watermark`` the producer then publishes a low-watermark report as the source
``injector/produce-<source>/0``: it writes nothing older than the newest event time it sent
(plus 1 µs) any more. A stream no source reported holds its consumers' watermark at the
beginning of time, so a stream fed only by hand needs this for event-time timers to fire. The
source then counts among the stream's sources for good: the stream's watermark does not pass
the value it reported until it reports again (or is retired), and records it sends older than
that later are late.

:func:`tail_stream` (``millstream tail``) prints a stream's messages, one JSON object each
(see :func:`render_message`); dead letters (a stream named ``<computation>.dead-letters``)
are decoded, and a message that is not a record is printed as an error entry, not skipped.

Kafka that cannot be reached, or that does not acknowledge what was sent, raises
:class:`~millstream.engine.errors.MillstreamError`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Literal, NoReturn, TextIO, get_args

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from millstream.connectors import kafka
from millstream.connectors.provisioning import provision
from millstream.connectors.stream_reader import kafka_down, read_messages
from millstream.engine.clock import Clock, SystemClock
from millstream.engine.config import DEFAULT_PARTITIONS, MillstreamConfig
from millstream.engine.deadletters import DeadLetter, decode_dead_letter
from millstream.engine.errors import ConfigError, MillstreamError, RecordDecodeError, RecordError
from millstream.engine.records import (
    MAX_EVENT_TIME,
    RECORD_ID_BYTES,
    Record,
    check_event_time,
    check_record_size,
    decode_record,
    encode_record,
    injector_record_id,
)
from millstream.engine.topology import Topology
from millstream.engine.watermarks import WatermarkReport, injector_source

__all__ = [
    "DEAD_LETTER_SUFFIX",
    "DEFAULT_PARTITIONS",
    "VALUE_FORMATS",
    "ProduceSummary",
    "ValueFormat",
    "event_time_iso",
    "parse_line",
    "produce_lines",
    "render_message",
    "render_record",
    "render_value",
    "tail_stream",
]

ValueFormat = Literal["text", "json", "hex"]
"""How :func:`render_value` shows bytes: UTF-8 text, parsed JSON, or hexadecimal."""

VALUE_FORMATS: Final[tuple[ValueFormat, ...]] = get_args(ValueFormat)
# The suffix of default_dead_letter_stream(computation): its streams hold dead letters.
DEAD_LETTER_SUFFIX: Final = ".dead-letters"

_LINE_FIELDS = frozenset({"key", "value", "timestamp", "id"})
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class ProduceSummary:
    """What :func:`produce_lines` did: records sent (all acknowledged by Kafka), lines rejected,
    the earliest and latest event time sent (``None`` if nothing was), and the watermark report
    it published (``None`` without ``report_watermark``, or if nothing was sent)."""

    stream: str
    sent: int
    rejected: int
    earliest: int | None = None
    latest: int | None = None
    report: WatermarkReport | None = None

    @property
    def exit_code(self) -> int:
        """0 if every line was sent, 1 if any was rejected."""
        return 1 if self.rejected else 0

    def describe(self) -> str:
        """One line for the operator."""
        text = (
            f"{self.sent} record{_plural(self.sent)} sent to stream {self.stream!r}, "
            f"{self.rejected} line{_plural(self.rejected)} rejected"
        )
        if self.earliest is not None and self.latest is not None:
            text += (
                f"; event times {self.earliest} ({event_time_iso(self.earliest)}) to "
                f"{self.latest} ({event_time_iso(self.latest)})"
            )
        if self.report is not None:
            text += f"; watermark {self.report.watermark} reported as {self.report.source!r}"
        return text


def parse_line(
    line: str, line_number: int, *, stream: str, now: int, source: str = "stdin"
) -> tuple[Record, bytes]:
    """The record a JSON line stands for, and its encoding (checked for size).

    The line is an object with ``key`` (a string), ``value`` (any JSON: a string becomes its
    UTF-8 bytes, anything else its compact JSON encoding), optionally ``timestamp`` (integer
    µs since the epoch; default ``now``) and ``id`` (a string naming the record; see the
    module docstring for the record ID). Other fields are refused, so that a misspelt
    ``timestamp`` does not silently become ``now``.

    Raises :class:`~millstream.engine.errors.RecordError` saying what is wrong (its
    subclasses for an absurd timestamp or an oversized record).
    """
    try:
        document = _loads(line)
    except (ValueError, RecursionError) as exc:
        raise RecordError(f"not JSON: {exc}") from None
    if not isinstance(document, dict):
        raise RecordError(f"a line must be a JSON object, not {_json_type(document)}")
    unknown = sorted(document.keys() - _LINE_FIELDS)
    if unknown:
        raise RecordError(
            f"unknown field{_plural(len(unknown))} {', '.join(map(repr, unknown))}; "
            "a line has key, value, and optionally timestamp and id"
        )
    key = document.get("key")
    if not isinstance(key, str):
        raise RecordError(
            "missing key" if key is None else f"key must be a string, not {_json_type(key)}"
        )
    _utf8(key, "key")
    if "value" not in document:
        raise RecordError('missing value (give "value": null for an empty one)')
    value = _value_bytes(document["value"])
    timestamp = document.get("timestamp", now)
    if not isinstance(timestamp, int) or isinstance(timestamp, bool):
        raise RecordError(
            f"timestamp must be an integer (µs since the epoch), not {_json_type(timestamp)}"
        )
    check_event_time(timestamp)
    name = document.get("id")
    if name is None:
        record_id = injector_record_id(f"produce/{source}", stream, line_number)
    elif isinstance(name, str) and name:
        record_id = hashlib.blake2b(
            _utf8(f"produce/{source}/{name}", "id"), digest_size=RECORD_ID_BYTES
        ).digest()
    else:
        raise RecordError(f"id must be a non-empty string, not {_json_type(name)}")
    record = Record(key, value, timestamp, record_id)
    data = encode_record(record)
    check_record_size(data)
    return record, data


def produce_lines(
    config: MillstreamConfig,
    stream: str,
    lines: Iterable[str | bytes],
    *,
    source: str = "stdin",
    clock: Clock | None = None,
    partitions: int | None = None,
    report_watermark: bool = False,
    errors: TextIO | None = None,
    timeout: float = 30.0,
) -> ProduceSummary:
    """Send each JSON line of ``lines`` (numbered from 1) as a record to ``stream``.

    The stream's topic is provisioned (:func:`millstream.connectors.provision`) if missing, with
    ``partitions`` (default: ``config.run``'s for the stream); with ``report_watermark`` so is
    the watermark topic. The Kafka key is the record key. A rejected line (see
    :func:`parse_line`; also one that is not UTF-8) is reported on ``errors`` (default: standard
    error) with its number, and skipped; blank lines are skipped silently. Returns once Kafka
    acknowledged every record sent, then (``report_watermark``) once it acknowledged the
    watermark report, whose sequence is ``clock.now()``.

    Raises :class:`~millstream.engine.errors.MillstreamError` if the topic cannot be created
    or Kafka did not acknowledge everything within ``timeout`` seconds: some records may be
    on the stream then; producing the same input again sends them with the same IDs.
    """
    Topology().add_stream(stream)  # the rule for stream names: raises TopologyError
    if not source:
        raise ConfigError("the source must be a non-empty name")
    if partitions is not None and partitions < 1:
        raise ConfigError(f"a stream needs at least one partition, not {partitions}")
    clock = SystemClock() if clock is None else clock
    errors = sys.stderr if errors is None else errors
    topic = kafka.stream_topic(stream)
    settings = config.run
    if partitions is not None:
        counts = {**settings.topic_partitions, stream: partitions}
        settings = dataclasses.replace(settings, topic_partitions=counts)
    try:
        provision(
            config,
            settings,
            streams=[stream],
            store=False,
            watermark_topic=report_watermark,
            timeout=timeout,
        )
    except (KafkaException, TimeoutError) as exc:
        kafka_down(config, f"could not create topic {topic!r}: {exc}", timeout)
    sender = kafka.producer(config)
    failures: list[KafkaError] = []

    def delivered(error: KafkaError | None, _message: Message) -> None:
        if error is not None:
            failures.append(error)

    sent = rejected = 0
    earliest: int | None = None
    latest: int | None = None
    for number, raw in enumerate(lines, start=1):
        try:
            line = raw.decode() if isinstance(raw, bytes) else raw
            if not line.strip():
                continue
            record, data = parse_line(line, number, stream=stream, now=clock.now(), source=source)
        except (RecordError, UnicodeDecodeError) as exc:
            reason = f"not UTF-8: {exc}" if isinstance(exc, UnicodeDecodeError) else str(exc)
            print(f"line {number} rejected: {reason}", file=errors, flush=True)
            rejected += 1
            continue
        _send(sender, topic, record.key.encode(), data, delivered, timeout, config)
        sent += 1
        earliest = record.timestamp if earliest is None else min(earliest, record.timestamp)
        latest = record.timestamp if latest is None else max(latest, record.timestamp)
    unacknowledged = sender.flush(timeout)  # runs the delivery callbacks
    if unacknowledged or failures:
        cause = f": {failures[0]}" if failures else ""
        raise MillstreamError(
            f"{unacknowledged + len(failures)} of {sent} records to stream {stream!r} were not "
            f"acknowledged by Kafka at {config.kafka_bootstrap} within {timeout} s{cause}; is "
            "Kafka up? Producing the same input again resends them with the same record IDs"
        )
    report = None
    if report_watermark and latest is not None:
        report = _report(config, stream, source, min(latest + 1, MAX_EVENT_TIME), clock, timeout)
    return ProduceSummary(stream, sent, rejected, earliest, latest, report)


def render_value(data: bytes, value_format: ValueFormat, field: str = "value") -> dict[str, Any]:
    """``{field: ...}`` showing ``data`` in ``value_format``, plus ``field + "_encoding"``
    naming what it shows instead where ``data`` is not in that format.

    ``text`` is the UTF-8 text, or hex (``"hex"``) for other bytes; ``json`` the parsed JSON
    document, or the ``text`` rendering (``"text"`` or ``"hex"``) for bytes that are not JSON;
    ``hex`` is always hex.
    """
    if value_format == "hex":
        return {field: data.hex()}
    try:
        text = data.decode()
    except UnicodeDecodeError:
        return {field: data.hex(), f"{field}_encoding": "hex"}
    if value_format == "text":
        return {field: text}
    try:
        return {field: _loads(text)}
    except (ValueError, RecursionError):
        return {field: text, f"{field}_encoding": "text"}


def render_message(
    stream: str,
    partition: int,
    offset: int,
    data: bytes | None,
    value_format: ValueFormat = "text",
) -> dict[str, Any]:
    """The JSON object :func:`tail_stream` prints for one message of ``stream``.

    A record: ``stream``, ``partition``, ``offset``, ``key``, ``timestamp`` (µs),
    ``time`` (ISO 8601, UTC; ``null`` outside the calendar), ``record_id`` (hex) and the value
    (:func:`render_value`). On a dead-letter stream the value is decoded instead, under
    ``dead_letter`` (its ``raw`` bytes rendered like a value); a value that is not a dead
    letter is rendered as a value, with an ``error``. A message that is not a record:
    ``stream``, ``partition``, ``offset``, ``error`` and ``raw_hex``.
    """
    position: dict[str, Any] = {"stream": stream, "partition": partition, "offset": offset}
    if data is None:
        return {**position, "error": "a message without a value is not a record", "raw_hex": ""}
    try:
        record = decode_record(data)
    except RecordDecodeError as exc:
        return {**position, "error": str(exc), "raw_hex": data.hex()}
    return position | render_record(stream, record, value_format)


def render_record(
    stream: str, record: Record, value_format: ValueFormat = "text"
) -> dict[str, Any]:
    """The fields :func:`render_message` shows for a decoded record of ``stream``, from
    ``key`` on; apart, so that records read from elsewhere than a topic (the pending
    productions ``millstream state`` finds in the store) print the same way."""
    entry: dict[str, Any] = {
        "key": record.key,
        "timestamp": record.timestamp,
        "time": event_time_iso(record.timestamp),
        "record_id": record.record_id.hex(),
    }
    if not stream.endswith(DEAD_LETTER_SUFFIX):
        return entry | render_value(record.value, value_format)
    try:
        dead_letter = decode_dead_letter(record.value)
    except RecordDecodeError as exc:
        return (
            entry
            | {"error": f"value is not a dead letter: {exc}"}
            | render_value(record.value, value_format)
        )
    return entry | {"dead_letter": _dead_letter_fields(dead_letter, value_format)}


def tail_stream(
    config: MillstreamConfig,
    stream: str,
    *,
    out: TextIO,
    from_beginning: bool = False,
    follow: bool = False,
    dedup: bool = False,
    max_records: int | None = None,
    value_format: ValueFormat = "text",
    stop: threading.Event | None = None,
    timeout: float = 30.0,
) -> int:
    """Print the messages of ``stream`` to ``out``, one :func:`render_message` object per
    line, in offset order within each partition (partitions interleave); returns how many.

    It starts at each partition's beginning (``from_beginning``) or its end at the call.
    Without ``follow`` it returns once it reached the end offsets it found at the call; with
    ``follow`` it waits for more until ``stop`` is set (checked every 0.2 s) or an interrupt.
    Either way it returns after ``max_records`` lines. ``dedup`` prints each record ID once
    (keeping every ID seen in memory); messages that are not records are always printed.
    Partitions added to the topic after the call are not read. (From Python, read records
    with :func:`millstream.connectors.read_stream` instead.)

    Raises :class:`~millstream.engine.errors.MillstreamError` if the stream has no topic, or
    Kafka does not answer (or, without ``follow``, delivers nothing) for ``timeout`` seconds.
    """
    if max_records is not None and max_records < 1:
        raise ConfigError(f"max_records must be at least 1, not {max_records}")
    printed = 0
    seen: set[str] = set()
    messages = read_messages(
        config, stream, from_beginning=from_beginning, follow=follow, stop=stop, timeout=timeout
    )
    with contextlib.closing(messages):
        for partition, offset, data in messages:
            entry = render_message(stream, partition, offset, data, value_format)
            if dedup and "record_id" in entry:
                if entry["record_id"] in seen:
                    continue
                seen.add(entry["record_id"])
            out.write(json.dumps(entry, ensure_ascii=False) + "\n")
            out.flush()
            printed += 1
            if max_records is not None and printed >= max_records:
                break
    return printed


def _send(
    sender: Producer,
    topic: str,
    key: bytes,
    data: bytes,
    delivered: Callable[[KafkaError | None, Message], None],
    timeout: float,
    config: MillstreamConfig,
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            sender.produce(topic, key=key, value=data, on_delivery=delivered)
            sender.poll(0)  # runs the callbacks of earlier deliveries
            return
        except BufferError:
            # The local queue is full: Kafka is slow or away; wait for it to drain.
            if time.monotonic() >= deadline:
                kafka_down(config, f"Kafka took no record to {topic!r}", timeout)
            sender.poll(0.05)


def _report(
    config: MillstreamConfig,
    stream: str,
    source: str,
    watermark: int,
    clock: Clock,
    timeout: float,
) -> WatermarkReport:
    try:
        publisher = kafka.KafkaWatermarkTopic(config)
        try:
            reader = kafka.consumer(config, "millstream-produce")
            try:
                return publisher.report_streams(
                    reader,
                    injector_source(f"produce-{source}"),
                    [stream],
                    watermark,
                    sequence=clock.now(),
                    timeout=timeout,
                )
            finally:
                reader.close()
        finally:
            publisher.close(timeout)
    except (KafkaException, TimeoutError) as exc:
        kafka_down(config, f"the watermark report was not published: {exc}", timeout)


def _dead_letter_fields(dead_letter: DeadLetter, value_format: ValueFormat) -> dict[str, Any]:
    origin = dataclasses.asdict(dead_letter.origin)
    if dead_letter.origin.record_id is not None:
        origin["record_id"] = dead_letter.origin.record_id.hex()
    return {
        "computation": dead_letter.computation,
        "origin": origin,
        "error_type": dead_letter.error_type,
        "error_message": dead_letter.error_message,
        **render_value(dead_letter.raw, value_format, "raw"),
        "raw_size": dead_letter.raw_size,
    }


def _value_bytes(value: Any) -> bytes:
    if isinstance(value, str):
        return _utf8(value, "value")
    return _utf8(json.dumps(value, ensure_ascii=False, separators=(",", ":")), "value")


def _utf8(text: str, what: str) -> bytes:
    try:
        return text.encode()
    except UnicodeEncodeError as exc:
        # json.loads accepts escaped lone surrogates ("\ud800"), which no UTF-8 holds.
        raise RecordError(f"{what} is not valid Unicode: {exc.reason}") from None


def _loads(text: str) -> Any:
    """Strict JSON: no NaN or Infinity, which json.dumps would write back as invalid JSON."""
    return json.loads(text, parse_constant=_no_constant, parse_float=_finite)


def _no_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    number = float(text)
    if math.isinf(number):
        raise ValueError(f"{text} is too large for a JSON number")
    return number


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return f"the number {value}"
    if isinstance(value, str):
        return f"the string {value!r}"
    return "an array" if isinstance(value, list) else "an object"


def event_time_iso(timestamp: int) -> str | None:
    """An event time (µs) as ISO-8601 UTC, or ``None`` if no date can show it."""
    try:
        moment = _EPOCH + timedelta(microseconds=timestamp)
    except OverflowError:
        return None
    return moment.isoformat(timespec="microseconds").replace("+00:00", "Z")


def _plural(count: int) -> str:
    return "" if count == 1 else "s"
