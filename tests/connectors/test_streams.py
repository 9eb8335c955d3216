"""``millstream produce`` and ``millstream tail`` as functions: line parsing and value
rendering without Kafka, then produce and tail on the real broker."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import socket
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from millstream.connectors import kafka as kafka_connector
from millstream.connectors.streams import (
    ProduceSummary,
    ValueFormat,
    parse_line,
    produce_lines,
    render_message,
    render_value,
    tail_stream,
)
from millstream.engine.clock import ManualClock
from millstream.engine.config import MillstreamConfig
from millstream.engine.deadletters import DeadLetter, Origin, default_dead_letter_stream
from millstream.engine.errors import (
    AbsurdTimestampError,
    MillstreamError,
    OversizedRecordError,
    RecordError,
    TopologyError,
)
from millstream.engine.records import (
    MAX_RECORD_BYTES,
    Record,
    decode_record,
    encode_record,
    injector_record_id,
)
from millstream.engine.watermarks import WatermarkReport, injector_source
from tests.waiting import wait_until
from tests.watermark_topics import delete_watermark_topics

NOW = 1_700_000_000_000_000  # 2023-11-14T22:13:20Z in µs
NOW_ISO = "2023-11-14T22:13:20.000000Z"


def named_id(source: str, name: str) -> bytes:
    """The record ID of a line with ``"id": name``."""
    return hashlib.blake2b(f"produce/{source}/{name}".encode(), digest_size=16).digest()


# -- parsing lines -----------------------------------------------------------------------------


@pytest.mark.unit
def test_a_line_becomes_a_record_with_a_stable_id_from_its_line_number() -> None:
    record, data = parse_line(
        '{"key": "u1", "value": "hé", "timestamp": 5}', 3, stream="clicks", now=NOW
    )
    assert record == Record(
        "u1", "hé".encode(), 5, injector_record_id("produce/stdin", "clicks", 3)
    )
    assert decode_record(data) == record
    again, _ = parse_line(
        '{"key": "u1", "value": "hé", "timestamp": 5}', 3, stream="clicks", now=NOW + 1
    )
    assert again.record_id == record.record_id
    elsewhere = [
        parse_line('{"key": "u1", "value": "hé"}', 4, stream="clicks", now=NOW)[0],
        parse_line('{"key": "u1", "value": "hé"}', 3, stream="views", now=NOW)[0],
        parse_line('{"key": "u1", "value": "hé"}', 3, stream="clicks", now=NOW, source="f")[0],
    ]
    assert len({r.record_id for r in [record, *elsewhere]}) == 4


@pytest.mark.unit
def test_a_line_with_an_id_gets_the_same_record_id_at_any_line_and_on_any_stream() -> None:
    first, _ = parse_line('{"key": "k", "value": 1, "id": "e-7"}', 1, stream="a", now=NOW)
    later, _ = parse_line('{"key": "k", "value": 2, "id": "e-7"}', 9, stream="b", now=NOW)
    assert first.record_id == later.record_id == named_id("stdin", "e-7")
    other, _ = parse_line(
        '{"key": "k", "value": 1, "id": "e-7"}', 1, stream="a", now=NOW, source="batch-2"
    )
    assert other.record_id == named_id("batch-2", "e-7")


@pytest.mark.unit
@pytest.mark.parametrize(
    ("value", "stored"),
    [
        ('"plain text"', b"plain text"),
        ('"{\\"a\\": 1}"', b'{"a": 1}'),
        ('{"q": "café", "n": [1, 2.5, true, null]}', '{"q":"café","n":[1,2.5,true,null]}'.encode()),
        ("null", b"null"),
        ("42", b"42"),
        ('""', b""),
    ],
)
def test_a_string_value_is_its_utf8_bytes_anything_else_its_compact_json(
    value: str, stored: bytes
) -> None:
    record, _ = parse_line(f'{{"key": "k", "value": {value}}}', 1, stream="s", now=NOW)
    assert record.value == stored
    assert record.timestamp == NOW


@pytest.mark.unit
@pytest.mark.parametrize(
    ("line", "error", "says"),
    [
        ("not json", RecordError, "not JSON"),
        ('{"key": "k", "value": 1', RecordError, "not JSON"),
        ('[{"key": "k", "value": 1}]', RecordError, "must be a JSON object, not an array"),
        ('"k"', RecordError, "must be a JSON object, not the string 'k'"),
        ('{"value": 1}', RecordError, "missing key"),
        ('{"key": 7, "value": 1}', RecordError, "key must be a string, not the number 7"),
        ('{"key": null, "value": 1}', RecordError, "missing key"),
        ('{"key": "k"}', RecordError, "missing value"),
        ('{"key": "k", "vlaue": 1}', RecordError, "unknown field 'vlaue'"),
        ('{"key": "k", "value": 1, "timestmp": 5}', RecordError, "unknown field 'timestmp'"),
        ('{"key": "k", "value": 1, "timestamp": 1.5}', RecordError, "not the number 1.5"),
        ('{"key": "k", "value": 1, "timestamp": "5"}', RecordError, "must be an integer"),
        ('{"key": "k", "value": 1, "timestamp": true}', RecordError, "not a boolean"),
        ('{"key": "k", "value": 1, "timestamp": -1}', AbsurdTimestampError, "not ms or ns"),
        (
            '{"key": "k", "value": 1, "timestamp": 1700000000000000000}',
            AbsurdTimestampError,
            "outside",
        ),
        ('{"key": "k", "value": 1, "id": ""}', RecordError, "id must be a non-empty string"),
        ('{"key": "k", "value": 1, "id": 3}', RecordError, "id must be a non-empty string"),
        ('{"key": "\\ud800", "value": 1}', RecordError, "key is not valid Unicode"),
        ('{"key": "k", "value": ["\\udfff"]}', RecordError, "value is not valid Unicode"),
        ('{"key": "k", "value": NaN}', RecordError, "NaN is not JSON"),
        ('{"key": "k", "value": 1e400}', RecordError, "too large"),
        ("[" * 100_000, RecordError, "not JSON"),
    ],
)
def test_a_bad_line_is_refused_saying_why(line: str, error: type[Exception], says: str) -> None:
    with pytest.raises(error) as raised:
        parse_line(line, 1, stream="s", now=NOW)
    assert says in str(raised.value)


@pytest.mark.unit
def test_a_line_whose_record_would_be_too_large_for_a_stream_is_refused() -> None:
    line = json.dumps({"key": "k", "value": "x" * MAX_RECORD_BYTES})
    with pytest.raises(OversizedRecordError, match="over the 1000000-byte limit"):
        parse_line(line, 1, stream="s", now=NOW)


@pytest.mark.unit
def test_the_summary_says_what_was_sent_and_exits_1_if_a_line_was_rejected() -> None:
    report = WatermarkReport(injector_source("produce-stdin"), ("s",), NOW + 1, 9)
    summary = ProduceSummary("s", 2, 1, NOW - 1_000_000, NOW, report)
    assert summary.exit_code == 1
    assert summary.describe() == (
        "2 records sent to stream 's', 1 line rejected; event times "
        f"{NOW - 1_000_000} (2023-11-14T22:13:19.000000Z) to {NOW} ({NOW_ISO}); "
        f"watermark {NOW + 1} reported as 'injector/produce-stdin/0'"
    )
    assert ProduceSummary("s", 0, 0).exit_code == 0
    assert ProduceSummary("s", 0, 0).describe() == "0 records sent to stream 's', 0 lines rejected"


@pytest.mark.unit
def test_an_unreachable_kafka_is_an_error_naming_it() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free_port = probe.getsockname()[1]
    nowhere = MillstreamConfig(kafka_bootstrap=f"127.0.0.1:{free_port}")
    with pytest.raises(MillstreamError, match=r"is Kafka up at 127\.0\.0\.1:\d+\?"):
        produce_lines(nowhere, "s", ['{"key": "k", "value": 1}'], errors=io.StringIO(), timeout=1)
    with pytest.raises(MillstreamError, match="is Kafka up"):
        tail_stream(nowhere, "s", out=io.StringIO(), timeout=1)


@pytest.mark.unit
def test_a_stream_name_kafka_cannot_carry_is_refused_before_connecting() -> None:
    nowhere = MillstreamConfig(kafka_bootstrap="127.0.0.1:1")
    with pytest.raises(TopologyError, match="stream name 'a b' is invalid"):
        produce_lines(nowhere, "a b", [], errors=io.StringIO())


# -- rendering messages ------------------------------------------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize(
    ("data", "value_format", "shown"),
    [
        (b"h\xc3\xa9", "text", {"value": "hé"}),
        (b'{"a": 1}', "text", {"value": '{"a": 1}'}),
        (b"\xff\x00", "text", {"value": "ff00", "value_encoding": "hex"}),
        (b'{"a": [1, null]}', "json", {"value": {"a": [1, None]}}),
        (b'"s"', "json", {"value": "s"}),
        (b"plain", "json", {"value": "plain", "value_encoding": "text"}),
        (b"NaN", "json", {"value": "NaN", "value_encoding": "text"}),
        (b"", "json", {"value": "", "value_encoding": "text"}),
        (b"\xff", "json", {"value": "ff", "value_encoding": "hex"}),
        (b"abc", "hex", {"value": "616263"}),
    ],
)
def test_values_are_shown_as_asked_or_say_how_they_are_shown(
    data: bytes, value_format: ValueFormat, shown: dict[str, Any]
) -> None:
    assert render_value(data, value_format) == shown


@pytest.mark.unit
def test_a_record_is_shown_with_its_position_time_and_id() -> None:
    record = Record("k", b"v", NOW, injector_record_id("t", 0, 1))
    assert render_message("s", 1, 7, encode_record(record)) == {
        "stream": "s",
        "partition": 1,
        "offset": 7,
        "key": "k",
        "timestamp": NOW,
        "time": NOW_ISO,
        "record_id": record.record_id.hex(),
        "value": "v",
    }
    outside = Record("k", b"v", -(2**62), injector_record_id("t", 0, 1))
    assert render_message("s", 0, 0, encode_record(outside))["time"] is None


@pytest.mark.unit
def test_a_message_that_is_not_a_record_is_shown_as_an_error() -> None:
    assert render_message("s", 0, 3, b"junk") == {
        "stream": "s",
        "partition": 0,
        "offset": 3,
        "error": "4 bytes is shorter than the 10-byte Avro single-object header; the producer "
        "must use millstream's encoding",
        "raw_hex": "6a756e6b",
    }
    assert render_message("s", 0, 4, None)["error"] == "a message without a value is not a record"


@pytest.mark.unit
def test_a_dead_letter_is_decoded() -> None:
    raw = b"\xc3\x01broken"
    dead = DeadLetter.from_error(
        "count",
        Origin(stream="clicks", partition=1, offset=9, record_id=b"\x01" * 16, key="u1"),
        ValueError("boom"),
        raw,
    )
    stream = default_dead_letter_stream("count")
    entry = render_message(stream, 0, 0, encode_record(dead.to_record(b"\x01" * 16, NOW)))
    assert entry["dead_letter"] == {
        "computation": "count",
        "origin": {
            "stream": "clicks",
            "partition": 1,
            "offset": 9,
            "record_id": "01" * 16,
            "key": "u1",
            "timer_tag": None,
            "timer_timestamp": None,
        },
        "error_type": "ValueError",
        "error_message": "boom",
        "raw": raw.hex(),
        "raw_encoding": "hex",
        "raw_size": len(raw),
    }
    assert "value" not in entry
    plain = Record("k", b"not a dead letter", NOW, injector_record_id("t", 0, 1))
    confused = render_message(stream, 0, 1, encode_record(plain))
    assert confused["error"].startswith("value is not a dead letter: ")
    assert confused["value"] == "not a dead letter"


# -- on Kafka ----------------------------------------------------------------------------------


@pytest.fixture
def stream_name(
    services: MillstreamConfig, unique: Callable[[str], str]
) -> Iterator[Callable[[], str]]:
    """Factory of unique stream names; their topics (created by produce) go at the end."""
    names: list[str] = []

    def make() -> str:
        names.append(unique("stream"))
        return names[-1]

    yield make
    kafka_connector.delete_topics(services, names)


def tail(config: MillstreamConfig, stream: str, **options: Any) -> list[dict[str, Any]]:
    out = io.StringIO()
    printed = tail_stream(config, stream, out=out, **options)
    lines = out.getvalue().splitlines()
    assert printed == len(lines)
    return [json.loads(line) for line in lines]


LINES = [
    '{"key": "u1", "value": {"q": "kafka"}, "timestamp": 1700000000000000}\n',
    "not json\n",
    '{"key": "u2", "value": "plain text", "id": "click-2"}\n',
    "\n",
    '{"value": 1}\n',
    '{"key": "u1", "value": 3, "timestamp": 1700000000000000000}\n',
    '{"key": "u3", "value": null, "timestamp": 1699999999000000}\n',
]


@pytest.mark.integration
def test_produced_lines_are_tailed_as_they_were_given(
    services: MillstreamConfig, stream_name: Callable[[], str]
) -> None:
    stream = stream_name()
    errors = io.StringIO()
    summary = produce_lines(
        services, stream, LINES, clock=ManualClock(NOW + 5), partitions=1, errors=errors
    )
    assert summary == ProduceSummary(stream, 3, 3, NOW - 1_000_000, NOW + 5)
    assert errors.getvalue().splitlines() == [
        "line 2 rejected: not JSON: Expecting value: line 1 column 1 (char 0)",
        "line 5 rejected: missing key",
        "line 6 rejected: event time 1700000000000000000 is outside "
        "[0, 253402300799999999]; timestamps are integer microseconds since the Unix epoch "
        "(not ms or ns)",
    ]
    assert end_offsets(services, stream) == {0: 3}

    def entry(offset: int, key: str, value: str, at: int, record_id: bytes) -> dict[str, Any]:
        return {
            "stream": stream,
            "partition": 0,
            "offset": offset,
            "key": key,
            "timestamp": at,
            "time": _iso(at),
            "record_id": record_id.hex(),
            "value": value,
        }

    expected = [
        entry(0, "u1", '{"q":"kafka"}', NOW, injector_record_id("produce/stdin", stream, 1)),
        entry(1, "u2", "plain text", NOW + 5, named_id("stdin", "click-2")),
        entry(2, "u3", "null", NOW - 1_000_000, injector_record_id("produce/stdin", stream, 7)),
    ]
    assert tail(services, stream, from_beginning=True) == expected
    as_json = tail(services, stream, from_beginning=True, value_format="json")
    assert [e["value"] for e in as_json] == [{"q": "kafka"}, "plain text", None]
    assert "value_encoding" not in as_json[0]
    assert as_json[1]["value_encoding"] == "text"
    assert tail(services, stream, from_beginning=True, max_records=2) == expected[:2]
    # From the end, without following: nothing.
    assert tail(services, stream) == []


@pytest.mark.integration
def test_the_same_input_produced_twice_shows_once_with_dedup(
    services: MillstreamConfig, stream_name: Callable[[], str]
) -> None:
    stream = stream_name()
    lines = [json.dumps({"key": f"user-{n}", "value": n, "timestamp": NOW + n}) for n in range(20)]
    lines.append(json.dumps({"key": "user-0", "value": "named", "id": "x"}))
    for _ in range(2):
        summary = produce_lines(services, stream, lines, errors=io.StringIO())
        assert (summary.sent, summary.rejected, summary.exit_code) == (21, 0, 0)

    everything = tail(services, stream, from_beginning=True)
    assert len(everything) == 42
    assert {e["partition"] for e in everything} == {0, 1}  # default: 2 partitions
    once = tail(services, stream, from_beginning=True, dedup=True)
    assert len(once) == 21
    ids = [e["record_id"] for e in everything]
    assert sorted(e["record_id"] for e in once) == sorted(set(ids))
    assert all(ids.count(i) == 2 for i in ids)
    # Each partition is printed in offset order; the first copy is the one kept.
    for partition in (0, 1):
        offsets = [e["offset"] for e in once if e["partition"] == partition]
        assert offsets == sorted(offsets)
        assert offsets == list(range(len(offsets)))


@pytest.mark.integration
def test_follow_prints_what_arrives_later(
    services: MillstreamConfig, stream_name: Callable[[], str]
) -> None:
    stream = stream_name()
    produce_lines(services, stream, ['{"key": "a", "value": "1"}'], errors=io.StringIO())
    out = io.StringIO()
    stop = threading.Event()
    printed: list[int] = []
    follower = threading.Thread(
        target=lambda: printed.append(
            tail_stream(
                services,
                stream,
                out=out,
                from_beginning=True,
                follow=True,
                max_records=3,
                stop=stop,
            )
        )
    )
    follower.start()
    try:
        wait_until("the first record is printed", out.getvalue, every=0.05)
        later = ['{"key": "b", "value": "2"}', '{"key": "c", "value": "3"}']
        produce_lines(services, stream, later, source="later", errors=io.StringIO())
        follower.join(30)
    finally:
        stop.set()
        follower.join(10)
    assert printed == [3]
    shown = [json.loads(line) for line in out.getvalue().splitlines()]
    assert sorted(e["value"] for e in shown) == ["1", "2", "3"]

    # Stopped from outside before anything more arrived.
    stop = threading.Event()
    stop.set()
    assert tail_stream(services, stream, out=io.StringIO(), follow=True, stop=stop) == 0


@pytest.mark.integration
def test_dead_letters_and_messages_that_are_not_records_are_shown_decoded(
    services: MillstreamConfig, unique: Callable[[str], str]
) -> None:
    stream = default_dead_letter_stream(unique("count"))
    raw = b"\xc3\x01\x00"
    dead = DeadLetter.from_error(
        "count", Origin(stream="clicks", partition=0, offset=4), ValueError("bad"), raw
    )
    cause = dead.origin.cause_id()
    record = dead.to_record(cause, NOW)
    writer = kafka_connector.producer(services)
    try:
        kafka_connector.create_topics(services, [stream], partitions=1)
        writer.produce(stream, key=b"", value=encode_record(record))
        writer.produce(stream, key=b"x", value=b"not a record")
        assert writer.flush(30) == 0
        shown = tail(services, stream, from_beginning=True)
    finally:
        kafka_connector.delete_topics(services, [stream])
    assert shown == [
        {
            "stream": stream,
            "partition": 0,
            "offset": 0,
            "key": "",
            "timestamp": NOW,
            "time": NOW_ISO,
            "record_id": record.record_id.hex(),
            "dead_letter": {
                "computation": "count",
                "origin": {
                    "stream": "clicks",
                    "partition": 0,
                    "offset": 4,
                    "record_id": None,
                    "key": None,
                    "timer_tag": None,
                    "timer_timestamp": None,
                },
                "error_type": "ValueError",
                "error_message": "bad",
                "raw": "c30100",
                "raw_encoding": "hex",
                "raw_size": 3,
            },
        },
        {
            "stream": stream,
            "partition": 0,
            "offset": 1,
            "error": "bytes start with 6e6f, not the Avro single-object marker c301; the "
            "producer must use Avro single-object encoding",
            "raw_hex": b"not a record".hex(),
        },
    ]


@pytest.mark.integration
def test_a_stream_without_a_topic_is_an_error(
    services: MillstreamConfig, unique: Callable[[str], str]
) -> None:
    stream = unique("missing")
    with pytest.raises(MillstreamError) as raised:
        tail_stream(services, stream, out=io.StringIO(), from_beginning=True)
    assert str(raised.value) == f"stream {stream!r} has no topic; nothing was produced to it yet"
    # Looking did not create it.
    admin = kafka_connector.admin_client(services)
    assert stream not in admin.list_topics(timeout=10).topics


@pytest.fixture
def watermarks(
    services: MillstreamConfig, unique: Callable[[str], str]
) -> Iterator[MillstreamConfig]:
    """The services' configuration with a watermark topic of this test's own."""
    config = dataclasses.replace(services, kafka_watermark_topic=unique("watermarks"))
    yield config
    delete_watermark_topics(config)


@pytest.mark.integration
def test_report_watermark_publishes_a_report_past_the_newest_time_sent(
    watermarks: MillstreamConfig, stream_name: Callable[[], str]
) -> None:
    stream = stream_name()
    clock = ManualClock(NOW)
    lines = [json.dumps({"key": f"k{n}", "value": n, "timestamp": NOW - 10 * n}) for n in range(6)]
    summary = produce_lines(
        watermarks,
        stream,
        lines,
        source="backfill",
        clock=clock,
        report_watermark=True,
        errors=io.StringIO(),
    )
    source = injector_source("produce-backfill")
    ends = end_offsets(watermarks, stream)
    assert sum(ends.values()) == 6
    assert summary.report == WatermarkReport(source, (stream,), NOW + 1, NOW, {stream: ends})
    reader = kafka_connector.KafkaWatermarkTopic(watermarks, create=False)
    try:
        assert reader.read() == [(source, summary.report)]
    finally:
        reader.close()


def _iso(timestamp: int) -> str:
    moment = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=timestamp)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def end_offsets(config: MillstreamConfig, stream: str) -> dict[int, int]:
    reader = kafka_connector.consumer(config, "test")
    try:
        return dict(kafka_connector.end_offsets(reader, [stream])[stream])
    finally:
        reader.close()
