import contextlib
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from millstream.engine.errors import (
    AbsurdTimestampError,
    MalformedRecordError,
    OversizedRecordError,
    RecordDecodeError,
    UnknownSchemaError,
)
from millstream.engine.records import (
    MAX_EVENT_TIME,
    MAX_RECORD_BYTES,
    SINGLE_OBJECT_MARKER,
    Record,
    SchemaRegistry,
    check_event_time,
    check_record_size,
    dead_letter_record_id,
    decode_record,
    decode_single_object,
    default_registry,
    encode_record,
    encode_single_object,
    envelope_key,
    envelope_key_bytes,
    injector_record_id,
    production_record_id,
    timer_identity,
    unchecked_record,
)

pytestmark = pytest.mark.unit

RID = bytes(range(16))
records = st.builds(
    Record,
    key=st.text(),
    value=st.binary(),
    timestamp=st.integers(-(2**63), 2**63 - 1),
    record_id=st.binary(min_size=16, max_size=16),
)


@given(records)
def test_encode_decode_round_trips(record: Record) -> None:
    assert decode_record(encode_record(record)) == record


@given(records)
def test_the_envelope_is_encoded_as_fastavro_encodes_it(record: Record) -> None:
    envelope = default_registry().named("millstream.Envelope")
    datum = {
        "key": record.key,
        "value": record.value,
        "timestamp": record.timestamp,
        "record_id": record.record_id,
    }
    assert encode_record(record) == encode_single_object(datum, envelope)


@given(st.integers(-(2**8), 2**8))
def test_longs_at_the_edges_of_eight_bytes_are_encoded_as_fastavro_encodes_them(near: int) -> None:
    # An event time in µs takes eight bytes, which encode_record writes without a loop.
    envelope = default_registry().named("millstream.Envelope")
    for edge in (2**48, 2**55):  # zig-zag: the first and the last long of eight bytes
        for value in (edge + near, -edge + near):
            datum = {"key": "k", "value": b"v", "timestamp": value, "record_id": RID}
            assert encode_record(Record("k", b"v", value, RID)) == encode_single_object(
                datum, envelope
            )


def _fastavro_record(data: bytes) -> Record | None:
    """What fastavro's generic reader makes of ``data``: the record, or ``None``."""
    try:
        datum = decode_single_object(data, default_registry().named("millstream.Envelope"))
        return Record(datum["key"], datum["value"], datum["timestamp"], datum["record_id"])
    except (RecordDecodeError, KeyError, TypeError, ValueError):
        return None


def _decoded(data: bytes) -> Record | None:
    try:
        return decode_record(data)
    except RecordDecodeError:
        return None


@given(records, st.integers(0, 200), st.integers(0, 255), st.sampled_from(["set", "cut", "add"]))
def test_the_hand_reader_decodes_what_fastavro_decodes(
    record: Record, at: int, byte: int, change: str
) -> None:
    # decode_record reads the current envelope by hand; on every envelope, and on every
    # envelope with a byte changed, cut short or added to, it agrees with fastavro.
    data = encode_record(record)
    at = 10 + at % (len(data) - 10)  # past the header: another fingerprint is another path
    changed = {
        "set": data[:at] + bytes([byte]) + data[at + 1 :],
        "cut": data[:at],
        "add": data + bytes([byte]),
    }[change]
    assert _decoded(data) == record
    assert _decoded(changed) == _fastavro_record(changed)


@given(st.binary(max_size=64))
def test_the_hand_reader_agrees_with_fastavro_on_any_body(body: bytes) -> None:
    data = encode_record(Record("k", b"v", 1, RID))[:10] + body
    assert _decoded(data) == _fastavro_record(data)


@given(st.binary(max_size=12), st.integers(-(2**8), 2**8))
def test_the_hand_reader_agrees_with_fastavro_on_any_timestamp_bytes(
    timestamp: bytes, near: int
) -> None:
    # An event time in µs is an eight-byte long, which the hand reader reads without a
    # loop; any bytes in its place, and every long around the edges of eight bytes, decode
    # as fastavro decodes them.
    head = encode_record(Record("k", b"v", 0, RID))[:-17]  # header, key, value
    data = head + timestamp + RID
    assert _decoded(data) == _fastavro_record(data)
    for edge in (2**48, 2**55):  # zig-zag: the first and the last long of eight bytes
        for value in (edge + near, -edge + near):
            record = Record("k", b"v", value, RID)
            assert _decoded(encode_record(record)) == record


def test_a_timestamp_of_more_than_64_bits_decodes_as_fastavro_decodes_it() -> None:
    # Ten bytes of a long hold up to 70 bits: the hand reader leaves those to fastavro.
    head = encode_record(Record("k", b"v", 0, RID))[:-17]  # header, key, value
    for last in (0x01, 0x02, 0x7F):  # 64 bits (the least long), then 65 and 70
        data = head + b"\xff" * 9 + bytes([last]) + RID
        assert _decoded(data) == _fastavro_record(data)
        assert _decoded(data) is not None


@given(records)
def test_a_record_decodes_from_any_bytes_like_as_from_bytes(record: Record) -> None:
    data = encode_record(record)
    for like in (bytearray(data), memoryview(data)):
        decoded = decode_record(like)  # type: ignore[arg-type]
        assert decoded == record
        assert type(decoded.value) is bytes
        assert type(decoded.record_id) is bytes


@given(records)
def test_an_unchecked_record_is_the_record_its_fields_make(record: Record) -> None:
    made = unchecked_record(record.key, record.value, record.timestamp, record.record_id)
    assert made == record
    assert hash(made) == hash(record)
    assert repr(made) == repr(record)


@given(records)
def test_an_envelopes_key_reads_without_decoding_it(record: Record) -> None:
    data = encode_record(record)
    assert envelope_key(data) == record.key
    # Whatever follows the key does not matter; a key cut short is no key.
    key_end = len(encode_record(Record(record.key, b"", 0, RID))) - 18  # value 1, time 1, ID 16
    assert envelope_key(data[:key_end]) == record.key
    if record.key:
        assert envelope_key(data[: key_end - 1]) is None


@given(st.binary(max_size=64))
def test_a_key_that_decodes_is_the_key_envelope_key_reads(body: bytes) -> None:
    header = encode_record(Record("k", b"v", 1, RID))[:10]
    with contextlib.suppress(RecordDecodeError):
        assert envelope_key(header + body) == decode_record(header + body).key
    assert envelope_key(body) is None or body.startswith(header)


@given(records)
def test_an_envelopes_key_bytes_are_its_key_encoded(record: Record) -> None:
    assert envelope_key_bytes(encode_record(record)) == record.key.encode("utf-8")


def test_key_bytes_are_read_whatever_they_decode_to_and_nothing_else() -> None:
    data = encode_record(Record("k", b"v", 1, RID))
    assert envelope_key_bytes(data[:10] + b"\x04\xff\xfe") == b"\xff\xfe"  # not UTF-8
    assert envelope_key_bytes(b"plain text") is None
    assert envelope_key_bytes(data[:2] + bytes(8) + data[10:]) is None  # another schema
    assert envelope_key_bytes(data[:10] + b"\x03") is None  # a negative length
    assert envelope_key_bytes(data[:10] + b"\x06ab") is None  # a key past the end


def test_no_key_is_read_from_what_is_not_the_current_envelope() -> None:
    assert envelope_key(b"") is None
    assert envelope_key(b"plain text") is None
    data = encode_record(Record("k", b"v", 1, RID))
    other_schema = data[:2] + bytes(8) + data[10:]
    assert envelope_key(other_schema) is None
    assert envelope_key(data[:10] + b"\x04\xff\xfe") is None  # not UTF-8
    assert envelope_key(data[:10] + b"\x03") is None  # a negative length
    assert envelope_key(data[:10] + b"\xff" * 11) is None  # a length past 64 bits


def test_encoding_is_single_object_with_the_envelope_fingerprint() -> None:
    data = encode_record(Record("k", b"v", 1, RID))
    envelope = default_registry().named("millstream.Envelope")
    assert data[:2] == SINGLE_OBJECT_MARKER
    assert data[2:10] == envelope.fingerprint
    assert '"logicalType"' not in envelope.canonical_form


def test_fingerprint_is_little_endian_crc64_avro() -> None:
    # The Avro specification's single-object example: the "int" schema's header.
    registered = SchemaRegistry().register('"int"')
    assert SINGLE_OBJECT_MARKER + registered.fingerprint == bytes.fromhex("c3018f5c393f1ad57572")


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"record_id": b"short"}, ValueError),
        ({"record_id": "x" * 16}, ValueError),
        ({"timestamp": 1.5}, TypeError),
        ({"timestamp": True}, TypeError),
        ({"timestamp": 2**63}, ValueError),
        ({"key": b"k"}, TypeError),
        ({"value": "v"}, TypeError),
    ],
)
def test_record_validates_its_fields(kwargs: dict[str, object], error: type[Exception]) -> None:
    fields: dict[str, object] = {"key": "k", "value": b"v", "timestamp": 1, "record_id": RID}
    fields.update(kwargs)
    with pytest.raises(error):
        Record(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xc3\x01\x00",
        b"\x00\x01" + bytes(8) + b"\x00",
    ],
)
def test_bad_header_is_malformed(data: bytes) -> None:
    with pytest.raises(MalformedRecordError):
        decode_record(data)


def test_unknown_fingerprint_is_unknown_schema() -> None:
    data = encode_record(Record("k", b"v", 1, RID))
    with pytest.raises(UnknownSchemaError):
        decode_record(data[:2] + bytes(8) + data[10:])


def test_truncated_body_is_malformed() -> None:
    data = encode_record(Record("key", b"value", 1, RID))
    with pytest.raises(MalformedRecordError):
        decode_record(data[:-1])


def test_trailing_bytes_are_malformed() -> None:
    data = encode_record(Record("key", b"value", 1, RID))
    with pytest.raises(MalformedRecordError, match="trailing"):
        decode_record(data + b"\x00")


@given(st.binary(max_size=64))
def test_any_body_either_decodes_or_raises_a_decode_error(body: bytes) -> None:
    header = encode_record(Record("k", b"v", 1, RID))[:10]
    with contextlib.suppress(RecordDecodeError):
        decode_record(header + body)


def test_a_registered_schema_missing_envelope_fields_is_malformed() -> None:
    registry = SchemaRegistry.from_package()
    older = registry.register(
        {
            "type": "record",
            "name": "Envelope",
            "namespace": "millstream",
            "fields": [{"name": "key", "type": "string"}],
        }
    )
    data = encode_single_object({"key": "k"}, older)
    with pytest.raises(MalformedRecordError, match="cannot decode"):
        decode_record(data, registry)


def test_an_evolved_envelope_is_resolved_against_the_readers() -> None:
    registry = SchemaRegistry.from_package()
    envelope = json.loads(default_registry().named("millstream.Envelope").canonical_form)
    envelope["fields"].append({"name": "trace", "type": "string"})
    newer = registry.register(envelope)
    datum = {"key": "k", "value": b"v", "timestamp": 7, "record_id": RID, "trace": "t"}
    assert decode_record(encode_single_object(datum, newer), registry) == Record("k", b"v", 7, RID)
    with pytest.raises(UnknownSchemaError):
        decode_record(encode_single_object(datum, newer), SchemaRegistry.from_package())


def test_user_value_schemas_can_evolve_with_defaults() -> None:
    registry = SchemaRegistry()
    v1 = registry.register(
        {"type": "record", "name": "app.Click", "fields": [{"name": "url", "type": "string"}]}
    )
    v2 = registry.register(
        {
            "type": "record",
            "name": "app.Click",
            "fields": [
                {"name": "url", "type": "string"},
                {"name": "referrer", "type": "string", "default": ""},
            ],
        }
    )
    assert registry.named("app.Click") is v2
    old_bytes = encode_single_object({"url": "/a"}, v1)
    assert decode_single_object(old_bytes, v2, registry) == {"url": "/a", "referrer": ""}


def test_registry_loads_every_shipped_schema() -> None:
    names = {"millstream.Envelope", "millstream.DeadLetter"}
    registry = SchemaRegistry.from_package()
    assert all(registry.named(name).fingerprint in registry for name in names)


def test_registration_is_idempotent() -> None:
    registry = SchemaRegistry()
    first = registry.register('"string"')
    assert registry.register('"string"') is first
    assert len(registry) == 1


def test_record_size_limit() -> None:
    check_record_size(bytes(MAX_RECORD_BYTES))
    with pytest.raises(OversizedRecordError):
        check_record_size(bytes(MAX_RECORD_BYTES + 1))


def test_event_time_bounds() -> None:
    check_event_time(0)
    check_event_time(MAX_EVENT_TIME)
    for absurd in (-1, MAX_EVENT_TIME + 1):
        with pytest.raises(AbsurdTimestampError):
            check_event_time(absurd)


def test_record_ids_are_16_bytes_and_deterministic() -> None:
    ids = [
        injector_record_id("clicks", 3, 42),
        production_record_id("counter", RID, 0),
        timer_identity("k", "window", 10),
        dead_letter_record_id("counter", RID),
    ]
    assert all(len(i) == 16 for i in ids)
    assert ids == [
        injector_record_id("clicks", 3, 42),
        production_record_id("counter", RID, 0),
        timer_identity("k", "window", 10),
        dead_letter_record_id("counter", RID),
    ]
    assert len(set(ids)) == len(ids)


@pytest.mark.parametrize(
    ("computation", "cause_id", "index", "expected"),
    [
        ("counter", RID, 0, "6546220f9b4b290a02c2d60499b6331e"),
        ("counter", RID, 7, "ef1999e72da52b10c6dcd890a343befe"),
        ("zeitgeist.model", bytes(16), 2**40, "c59f56ccdcff3cf0ff5992116e90b5da"),
        ("counter", RID, 15, "ec45381671c7ef1283344193d988ebb5"),
        ("counter", b"abc", 16, "db0d6ac8c17d2ac1a5ea503de63b48fb"),
    ],
)
def test_production_ids_stay_those_earlier_versions_wrote(
    computation: str, cause_id: bytes, index: int, expected: str
) -> None:
    # Downstream deduplication matches a retried production by its ID: the derivation may
    # get faster but never change (values from the version before it was cached).
    assert production_record_id(computation, cause_id, index).hex() == expected


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (injector_record_id("t", 3, 1), injector_record_id("t", "3", 1)),
        (injector_record_id("ab", "c", 1), injector_record_id("a", "bc", 1)),
        (injector_record_id("t", 0, 1), injector_record_id("t", 0, 2)),
        (production_record_id("c", RID, 0), production_record_id("c", RID, 1)),
        (production_record_id("c", RID, 0), production_record_id("d", RID, 0)),
        (timer_identity("k", "t", 1), timer_identity("k", "t", 1, set_by=RID)),
        (timer_identity("k", "t", 1), timer_identity("k", "t", 2)),
        (dead_letter_record_id("c", RID), production_record_id("c", RID, 0)),
    ],
)
def test_record_ids_separate_their_inputs(a: bytes, b: bytes) -> None:
    assert a != b


@pytest.mark.parametrize(
    "call",
    [
        lambda: injector_record_id("", 0, 0),
        lambda: injector_record_id("t", 0, -1),
        lambda: production_record_id("c", b"", 0),
        lambda: production_record_id("c", RID, -1),
        lambda: production_record_id("", RID, 0),
    ],
)
def test_record_id_arguments_are_validated(call: object) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - each case has its own message
        call()  # type: ignore[operator]
