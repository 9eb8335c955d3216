"""Every message Kafka can carry, fuzzed through the decoder and the consumer's routing.

Whatever the bytes (or their absence), :func:`decode_record` raises one of its two record
errors or returns a record, and :func:`decode_delivery` never raises: a message is either a
delivery under its key or rejected with an error saying why.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from millstream.engine.computation import Computation
from millstream.engine.context import Context
from millstream.engine.errors import (
    MalformedRecordError,
    OversizedRecordError,
    RecordDecodeError,
    RecordError,
    TombstoneError,
    UnknownSchemaError,
)
from millstream.engine.records import (
    MAX_RECORD_BYTES,
    RECORD_ID_BYTES,
    SINGLE_OBJECT_MARKER,
    Deletion,
    Record,
    decode_record,
    encode_record,
)
from millstream.engine.routing import decode_delivery, decode_tombstone
from millstream.engine.topology import (
    ComputationOptions,
    ComputationSpec,
    KeyExtractor,
    Tombstones,
    Topology,
)

pytestmark = pytest.mark.unit

FUZZ = settings(max_examples=150, deadline=None)

INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
RECORDS = st.builds(
    Record,
    key=st.text(max_size=20),
    value=st.binary(max_size=40),
    timestamp=INT64,
    record_id=st.binary(min_size=RECORD_ID_BYTES, max_size=RECORD_ID_BYTES),
)
ENVELOPE_FINGERPRINT = encode_record(Record("", b"", 0, b"\0" * 16))[2:10]


class Keyed(Computation):
    def process_record(self, ctx: Context, record: Record) -> None:
        pass

    def process_deletion(self, ctx: Context, deletion: Deletion) -> None:
        pass


def by_value(record: Record) -> str:
    """A user's extractor: the value as text, refusing values that are not UTF-8."""
    return record.value.decode("utf-8")


def consumer(
    extractor: KeyExtractor | None = None, tombstones: Tombstones = "dead-letter"
) -> ComputationSpec:
    topology = Topology("fuzz", streams=["in"])
    return topology.add_computation(
        "c",
        Keyed(),
        inputs={"in": extractor},
        options=ComputationOptions(key_intervals=4, tombstones=tombstones),
    )


DEFAULT = consumer()
BY_VALUE = consumer(by_value)
DELETIONS = consumer(tombstones="deliver")


@FUZZ
@given(RECORDS)
def test_an_envelope_decodes_to_what_was_encoded(record: Record) -> None:
    assert decode_record(encode_record(record)) == record


@FUZZ
@given(st.binary(max_size=200))
def test_arbitrary_bytes_are_a_record_or_a_decode_error(data: bytes) -> None:
    try:
        record = decode_record(data)
    except RecordDecodeError:
        return
    # Avro accepts non-minimal varints, so the bytes need not be the record's own encoding.
    assert decode_record(encode_record(record)) == record


@FUZZ
@given(st.binary(max_size=64))
def test_a_body_under_an_unknown_fingerprint_is_an_unknown_schema(body: bytes) -> None:
    fingerprint = struct.pack("<Q", 0x0123456789ABCDEF)
    assert fingerprint != ENVELOPE_FINGERPRINT
    with pytest.raises(UnknownSchemaError):
        decode_record(SINGLE_OBJECT_MARKER + fingerprint + body)


@FUZZ
@given(RECORDS)
def test_every_truncation_of_an_envelope_is_malformed(record: Record) -> None:
    encoded = encode_record(record)
    for length in range(len(encoded)):
        with pytest.raises(MalformedRecordError):
            decode_record(encoded[:length])


@FUZZ
@given(RECORDS, st.integers(min_value=1, max_value=255))
def test_an_envelope_mutated_at_any_byte_decodes_or_is_rejected(record: Record, flip: int) -> None:
    encoded = encode_record(record)
    for index in range(len(encoded)):
        mutated = bytearray(encoded)
        mutated[index] ^= flip
        data = bytes(mutated)
        for spec in (DEFAULT, BY_VALUE):
            decoded, key, error = decode_delivery(spec, "in", data)
            if error is None:
                assert decoded is not None
                assert key == spec.key_extractor("in")(decoded)
            elif decoded is None and 2 <= index < 10:  # the writer schema's fingerprint
                assert isinstance(error, UnknownSchemaError | MalformedRecordError)
            elif decoded is None:  # the marker or the body
                assert isinstance(error, MalformedRecordError)
            else:  # decoded, then the user's extractor refused it
                assert spec is BY_VALUE
                assert isinstance(error, UnicodeDecodeError)


@FUZZ
@given(st.one_of(st.none(), st.binary(max_size=100), RECORDS.map(encode_record)))
def test_decode_delivery_never_raises_and_says_why(raw: bytes | None) -> None:
    for spec in (DEFAULT, BY_VALUE, DELETIONS):
        record, key, error = decode_delivery(spec, "in", raw)
        if error is None:
            assert record is not None
            assert isinstance(key, str)
            assert raw is not None
            assert decode_record(raw) == record
            continue
        assert key is None
        assert str(error)
        if raw is None:
            assert isinstance(error, TombstoneError)
        elif record is None:
            assert isinstance(error, RecordError)
        else:
            assert isinstance(error, UnicodeDecodeError)


def test_an_oversized_message_is_rejected_before_it_is_decoded() -> None:
    oversized = encode_record(Record("k", b"x" * MAX_RECORD_BYTES, 1, b"\0" * 16))
    for spec in (DEFAULT, DELETIONS):
        record, key, error = decode_delivery(spec, "in", oversized)
        assert (record, key) == (None, None)
        assert isinstance(error, OversizedRecordError)


@FUZZ
@given(
    key=st.one_of(st.none(), st.binary(max_size=12), st.text(max_size=12).map(str.encode)),
    partition=st.integers(min_value=0, max_value=2**31 - 1),
    offset=st.integers(min_value=0, max_value=2**63 - 1),
    timestamp=INT64,
)
def test_a_tombstone_is_a_deletion_of_its_utf8_key_or_a_tombstone_error(
    key: bytes | None, partition: int, offset: int, timestamp: int
) -> None:
    deletion, error = decode_tombstone(DEFAULT, "in", key, partition, offset, timestamp)
    assert deletion is None
    assert isinstance(error, TombstoneError)

    deletion, error = decode_tombstone(DELETIONS, "in", key, partition, offset, timestamp)
    try:
        text = None if key is None else key.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is None:
        assert deletion is None
        assert isinstance(error, TombstoneError)
    else:
        assert error is None
        assert deletion is not None
        assert (deletion.key, deletion.timestamp, deletion.stream) == (text, timestamp, "in")
        again, _ = decode_tombstone(DELETIONS, "in", key, partition, offset, timestamp)
        assert again == deletion  # a replay of the position is the same deletion
