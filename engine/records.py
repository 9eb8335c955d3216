"""Records on the wire: the envelope, its Avro encoding, and the record ID rules.

Every stream carries ``millstream.Envelope`` records (``schemas/envelope.avsc``): MillWheel's
``(key, value, timestamp)`` triple plus a 16-byte ``record_id``. ``value`` is opaque bytes.

Encoding is Avro *single-object encoding*: the marker ``C3 01``, the 8-byte little-endian
CRC-64-AVRO fingerprint of the writer schema's parsing canonical form, then the schemaless
Avro body. A reader looks the fingerprint up in a :class:`SchemaRegistry`, so it can tell
which schema wrote a record and resolve an evolved one against its own.

Decoding never crashes on bad input: it raises :class:`~millstream.engine.errors.UnknownSchemaError`
or :class:`~millstream.engine.errors.MalformedRecordError`, which the engine turns into
dead letters.

Record IDs are deterministic, so retries reproduce them and consumers deduplicate by them:

* an injector derives an ID from the source position (:func:`injector_record_id`);
* a computation derives an ID from (computation, cause, index of the production within the
  call) (:func:`production_record_id`), where the cause is the input record's ID or the
  firing timer's :func:`timer_identity`;
* a :class:`Deletion` (a Kafka tombstone taken as a delete) has no envelope to carry an ID,
  so it gets one from its position on the stream (:func:`deletion_record_id`).

IDs are BLAKE2b digests (``digest_size=16``) of an unambiguous, type-tagged, length-prefixed
encoding of their parts, with a distinct domain per rule. BLAKE2b rather than mmh3: two
distinct causes must never share an ID (a collision silently drops a record as a duplicate),
and the parts (file names, keys, tags) are partly user-controlled, so the hash must resist
crafted collisions, which MurmurHash does not. It is in the standard library and costs about a
microsecond per ID.
"""

from __future__ import annotations

import hashlib
import io
import json
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache, lru_cache
from importlib import resources
from typing import Any

from fastavro import parse_schema, schemaless_reader, schemaless_writer
from fastavro.schema import fingerprint, to_parsing_canonical_form

from millstream.engine.errors import (
    AbsurdTimestampError,
    MalformedRecordError,
    OversizedRecordError,
    UnknownSchemaError,
)
from millstream.engine.slots import slot_constructor

__all__ = [
    "ENVELOPE_SCHEMA_NAME",
    "MAX_EVENT_TIME",
    "MAX_RECORD_BYTES",
    "MIN_EVENT_TIME",
    "RECORD_ID_BYTES",
    "SINGLE_OBJECT_MARKER",
    "Deletion",
    "Record",
    "RegisteredSchema",
    "SchemaRegistry",
    "check_event_time",
    "check_record_size",
    "clamp_event_time",
    "dead_letter_record_id",
    "decode_record",
    "decode_single_object",
    "default_registry",
    "deletion_record_id",
    "encode_record",
    "encode_single_object",
    "envelope_key",
    "envelope_key_bytes",
    "injector_record_id",
    "production_record_id",
    "shipped_schema",
    "timer_identity",
    "unchecked_record",
]

SINGLE_OBJECT_MARKER = b"\xc3\x01"
RECORD_ID_BYTES = 16
ENVELOPE_SCHEMA_NAME = "millstream.Envelope"

# Kafka's default max.message.bytes is 1 MiB including batch overhead and headers; staying
# below it means a production that passes this check is never refused by the broker.
MAX_RECORD_BYTES = 1_000_000

# Event times outside [1970-01-01, 9999-12-31T23:59:59.999999] UTC are treated as absurd:
# they are almost always a unit mistake (ms or ns for µs) and would wreck low watermarks.
MIN_EVENT_TIME = 0
MAX_EVENT_TIME = 253_402_300_799_999_999

_FINGERPRINT_BYTES = 8
_HEADER_BYTES = len(SINGLE_OBJECT_MARKER) + _FINGERPRINT_BYTES
_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1
_ID_PERSON = b"millstream.id.v1"
_SCHEMA_PACKAGE = "millstream.schemas"


@dataclass(frozen=True, slots=True)
class Record:
    """One record: key, opaque value, event time in µs since the epoch (UTC), unique ID."""

    key: str
    value: bytes
    timestamp: int
    record_id: bytes

    def __post_init__(self) -> None:
        if not isinstance(self.key, str):
            raise TypeError(f"record key must be str, got {type(self.key).__name__}")
        if not isinstance(self.value, bytes):
            raise TypeError(
                f"record value must be bytes, got {type(self.value).__name__}; "
                "encode it first (e.g. with a codec from millstream.engine.codecs)"
            )
        if not isinstance(self.timestamp, int) or isinstance(self.timestamp, bool):
            raise TypeError(
                f"record timestamp must be int microseconds since the epoch, "
                f"got {type(self.timestamp).__name__}"
            )
        if not _LONG_MIN <= self.timestamp <= _LONG_MAX:
            raise ValueError(f"record timestamp {self.timestamp} does not fit an Avro long")
        if not isinstance(self.record_id, bytes) or len(self.record_id) != RECORD_ID_BYTES:
            raise ValueError(
                f"record_id must be {RECORD_ID_BYTES} bytes, got {self.record_id!r}; "
                "derive it with injector_record_id or production_record_id"
            )


unchecked_record: Callable[[str, bytes, int, bytes], Record] = slot_constructor(Record)
"""``unchecked_record(key, value, timestamp, record_id)``: a :class:`Record` of fields the
caller vouches for (the envelope's reader, the engine after checking what user code gave
it), made without :class:`Record`'s checks, which cost as much as the rest of its making on
every record a worker decodes or produces."""


@dataclass(frozen=True, slots=True)
class Deletion:
    """A Kafka tombstone (a message with a key and no value) taken as the deletion of
    ``key``, for computations that opt in (``ComputationOptions(tombstones="deliver")``).

    ``key`` is the Kafka message key (UTF-8), ``timestamp`` the Kafka message timestamp in
    µs, ``stream`` the stream it came on. A tombstone carries no record ID, so
    ``record_id`` is derived from its position (:func:`deletion_record_id`): a replayed batch
    delivers the same position, whose ID the engine finds among the dedup IDs; a producer
    sending the tombstone again writes a new position, a second deletion.
    """

    key: str
    timestamp: int
    stream: str
    record_id: bytes

    def __post_init__(self) -> None:
        if not isinstance(self.key, str):
            raise TypeError(f"deletion key must be str, got {type(self.key).__name__}")
        if not isinstance(self.timestamp, int) or isinstance(self.timestamp, bool):
            raise TypeError(
                f"deletion timestamp must be int microseconds since the epoch, "
                f"got {type(self.timestamp).__name__}"
            )
        if not isinstance(self.record_id, bytes) or len(self.record_id) != RECORD_ID_BYTES:
            raise ValueError(
                f"record_id must be {RECORD_ID_BYTES} bytes, got {self.record_id!r}; "
                "derive it with deletion_record_id"
            )


@dataclass(frozen=True, slots=True)
class RegisteredSchema:
    """A schema known to a registry: its full name, fingerprint and fastavro-parsed form."""

    name: str
    fingerprint: bytes
    canonical_form: str
    parsed: Any


class SchemaRegistry:
    """Avro schemas by single-object fingerprint, so readers can tell each writer's schema.

    Logical-type annotations are dropped when a schema is registered: millstream hands values
    to user code as their underlying Avro types (a ``timestamp-micros`` stays an ``int``).
    Fingerprints are unaffected, since the parsing canonical form ignores annotations.

    Register every schema that ever wrote to a stream (old envelope and value schema versions
    included) before reading it; registration is idempotent.
    """

    def __init__(self) -> None:
        self._by_fingerprint: dict[bytes, RegisteredSchema] = {}
        self._latest_by_name: dict[str, RegisteredSchema] = {}

    @classmethod
    def from_package(cls, package: str = _SCHEMA_PACKAGE) -> SchemaRegistry:
        """A registry holding every ``.avsc`` file shipped in ``package``."""
        registry = cls()
        for entry in sorted(resources.files(package).iterdir(), key=lambda e: e.name):
            if entry.name.endswith(".avsc"):
                registry.register(entry.read_text(encoding="utf-8"))
        return registry

    def register(self, schema: str | Mapping[str, Any]) -> RegisteredSchema:
        """Add a schema (JSON text or parsed JSON); the latest one registered wins its name."""
        raw = json.loads(schema) if isinstance(schema, str) else schema
        parsed = parse_schema(_without_logical_types(raw), named_schemas={})
        canonical = to_parsing_canonical_form(parsed)
        registered = RegisteredSchema(
            name=_schema_name(parsed),
            fingerprint=bytes.fromhex(fingerprint(canonical, "CRC-64-AVRO")),
            canonical_form=canonical,
            parsed=parsed,
        )
        self._by_fingerprint.setdefault(registered.fingerprint, registered)
        self._latest_by_name[registered.name] = self._by_fingerprint[registered.fingerprint]
        return self._by_fingerprint[registered.fingerprint]

    def lookup(self, schema_fingerprint: bytes) -> RegisteredSchema:
        """The schema with this fingerprint, or :class:`UnknownSchemaError`."""
        try:
            return self._by_fingerprint[schema_fingerprint]
        except KeyError:
            raise UnknownSchemaError(
                f"no registered schema has fingerprint {schema_fingerprint.hex()}; register "
                "the writer's schema with SchemaRegistry.register in this reader"
            ) from None

    def named(self, name: str) -> RegisteredSchema:
        """The latest schema registered under a full name such as ``millstream.Envelope``."""
        try:
            return self._latest_by_name[name]
        except KeyError:
            raise UnknownSchemaError(
                f"no schema named {name!r} is registered; known: {sorted(self._latest_by_name)}"
            ) from None

    def __contains__(self, schema_fingerprint: object) -> bool:
        return schema_fingerprint in self._by_fingerprint

    def __len__(self) -> int:
        return len(self._by_fingerprint)


@cache
def default_registry() -> SchemaRegistry:
    """The process-wide registry, preloaded with the schemas shipped in ``millstream.schemas``."""
    return SchemaRegistry.from_package()


def encode_single_object(datum: Any, schema: RegisteredSchema) -> bytes:
    """Avro single-object encoding of ``datum`` written with ``schema``."""
    body = io.BytesIO()
    body.write(SINGLE_OBJECT_MARKER)
    body.write(schema.fingerprint)
    schemaless_writer(body, schema.parsed, datum, strict=True)
    return body.getvalue()


def decode_single_object(
    data: bytes, reader: RegisteredSchema, registry: SchemaRegistry | None = None
) -> Any:
    """Decode single-object-encoded ``data``, resolving its writer schema against ``reader``.

    Raises :class:`UnknownSchemaError` if the writer's fingerprint is not in ``registry``
    (default: :func:`default_registry`) and :class:`MalformedRecordError` for a bad marker, a
    truncated or corrupt body, trailing bytes, or a writer schema that cannot be resolved
    against ``reader`` (such as a field the reader requires and the writer lacks).
    """
    registry = default_registry() if registry is None else registry
    if len(data) < _HEADER_BYTES:
        raise MalformedRecordError(
            f"{len(data)} bytes is shorter than the {_HEADER_BYTES}-byte Avro single-object "
            "header; the producer must use millstream's encoding"
        )
    if data[:2] != SINGLE_OBJECT_MARKER:
        raise MalformedRecordError(
            f"bytes start with {data[:2].hex()}, not the Avro single-object marker c301; "
            "the producer must use Avro single-object encoding"
        )
    writer = registry.lookup(bytes(data[2:_HEADER_BYTES]))
    body = io.BytesIO(data)
    body.seek(_HEADER_BYTES)
    try:
        datum = schemaless_reader(body, writer.parsed, None if writer is reader else reader.parsed)
    except Exception as exc:
        # fastavro signals corrupt input with whatever its decoder hit (EOFError, ValueError,
        # UnicodeDecodeError, SchemaResolutionError, ...); all of them mean "not a readable
        # record", which callers handle as one dead-letter case.
        raise MalformedRecordError(
            f"cannot decode a {writer.name} body as {reader.name}: {type(exc).__name__}: {exc}"
        ) from exc
    if body.tell() != len(data):
        raise MalformedRecordError(
            f"{len(data) - body.tell()} trailing bytes after a {writer.name} body; "
            "one message must hold exactly one record"
        )
    return datum


def encode_record(record: Record) -> bytes:
    """The envelope of ``record`` in Avro single-object encoding.

    Written here rather than by fastavro, since every production pays it (a third of the
    time): the envelope's fields in order, a string, bytes, a long and a 16-byte fixed.
    :class:`Record` has checked every field's type and range already, which is what
    fastavro's strict mode would check; a test holds the bytes equal to fastavro's.
    """
    key = record.key.encode("utf-8")
    value = record.value
    return b"".join(
        (
            _envelope_header(),
            _avro_long(len(key)),
            key,
            _avro_long(len(value)),
            value,
            _avro_long(record.timestamp),
            record.record_id,
        )
    )


def envelope_key(data: bytes) -> str | None:
    """The key of a record in the current envelope, read from its first field without
    decoding the rest; ``None`` if ``data`` does not begin as one (another schema version,
    not an envelope, a key length past the end, a key that is not UTF-8).

    Where :func:`decode_record` succeeds on bytes of the current envelope, the record's key
    is this: a reader can tell a record's key, and so where it goes, without the cost of
    decoding it (the Spark executor's tasks skip the records of other tasks so).
    """
    key = envelope_key_bytes(data)
    if key is None:
        return None
    try:
        return key.decode("utf-8")
    except UnicodeDecodeError:
        return None


def envelope_key_bytes(data: bytes) -> bytes | None:
    """:func:`envelope_key` before its UTF-8 decoding: the key's bytes, or ``None`` if
    ``data`` does not begin as an envelope of the current version with a key in bounds.

    Bytes that do not decode as UTF-8 are returned too (no record has that key). Equal keys
    have equal bytes, so a reader can remember what it found for a key by these alone.
    """
    header = _envelope_header()
    if not data.startswith(header):
        return None
    begins, ends = _read_length(data, len(header))
    if begins < 0:
        return None
    return data[begins:ends]


@cache
def _envelope_header() -> bytes:
    return SINGLE_OBJECT_MARKER + _envelope().fingerprint


def _avro_long(value: int) -> bytes:
    """Avro's encoding of a long: zig-zag, then 7 bits a byte, least significant first."""
    zigzag = (value << 1) ^ (value >> 63)
    if zigzag < 0x80:
        return _SMALL_LONGS[zigzag]
    if 1 << 49 <= zigzag < 1 << 56:
        # Eight bytes (an event time in µs): the 7-bit groups spread in three steps, as
        # _read_long packs them, then the continuation bit on all but the last.
        bits = (zigzag & 0x000000000FFFFFFF) | ((zigzag & 0x00FFFFFFF0000000) << 4)
        bits = (bits & 0x00003FFF00003FFF) | ((bits & 0x0FFFC0000FFFC000) << 2)
        bits = (bits & 0x007F007F007F007F) | ((bits & 0x3F803F803F803F80) << 1)
        return (bits | _EIGHT_BYTE_LONG).to_bytes(8, "little")
    out = bytearray()
    while zigzag >= 0x80:
        out.append((zigzag & 0x7F) | 0x80)
        zigzag >>= 7
    out.append(zigzag)
    return bytes(out)


_SMALL_LONGS = tuple(bytes((n,)) for n in range(0x80))


def decode_record(data: bytes, registry: SchemaRegistry | None = None) -> Record:
    """Decode an envelope written with any registered envelope schema version.

    Raises :class:`UnknownSchemaError` or :class:`MalformedRecordError`; never anything else
    for bad bytes.
    """
    header = _envelope_header()
    fields = None
    if (
        type(data) is bytes
        and data.startswith(header)
        and (registry is None or header[2:] in registry)
    ):
        fields = _envelope_fields(data, len(header))
    try:
        if fields is not None:
            # Typed, an Avro long and RECORD_ID_BYTES long by the reader's own checks.
            return unchecked_record(*fields)
        # Another schema version, or bytes the fast path will not vouch for: fastavro
        # decodes them, or says what is wrong with them.
        datum = decode_single_object(data, _envelope(), registry)
        return Record(
            key=datum["key"],
            value=datum["value"],
            timestamp=datum["timestamp"],
            record_id=datum["record_id"],
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise MalformedRecordError(f"decoded envelope is not a valid record: {exc}") from exc


def _envelope_fields(data: bytes, at: int) -> tuple[str, bytes, int, bytes] | None:
    """The fields of a body of the current envelope starting at ``at``, read by hand as
    :func:`encode_record` writes them (fastavro's reader costs four times as much, on every
    record a task routes); ``None`` for anything that is not exactly one such body (a test
    holds the two readers equal)."""
    key_at, key_end = _read_length(data, at)
    value_at, value_end = _read_length(data, key_end)
    timestamp, at = _read_long(data, value_end)
    if value_end < 0 or at < 0 or at + RECORD_ID_BYTES != len(data):
        return None
    if not _LONG_MIN <= timestamp <= _LONG_MAX:  # ten bytes may hold up to 70 bits
        return None
    try:
        key = data[key_at:key_end].decode("utf-8")
    except UnicodeDecodeError:
        return None
    return key, data[value_at:value_end], timestamp, data[at:]


def _read_length(data: bytes, at: int) -> tuple[int, int]:
    """Where the string or bytes whose length is at ``at`` begins and ends; ``(-1, -1)``
    if the length is not one or the data end first."""
    if at < 0:
        return -1, -1
    if at < len(data) and (byte := data[at]) < 0x80:
        # One byte (a length under 64, zig-zag doubling it): most keys and values.
        if byte & 1:
            return -1, -1  # negative
        ends = at + 1 + (byte >> 1)
        return (at + 1, ends) if ends <= len(data) else (-1, -1)
    length, begins = _read_long(data, at)
    ends = begins + length
    if begins < 0 or length < 0 or ends > len(data):
        return -1, -1
    return begins, ends


_HIGH_BITS = 0x8080808080808080
_EIGHT_BYTE_LONG = 0x0080808080808080


def _read_long(data: bytes, at: int) -> tuple[int, int]:
    """The Avro long at ``at`` and where it ends; ``(-1, -1)`` if ``data`` ends first or
    it runs past 64 bits (a value of -1 ends at 0 or later)."""
    eight = data[at : at + 8]
    if len(eight) == 8:
        # Eight bytes, the continuation bit set on the first seven only: an event time in µs
        # (2^49 to 2^56), read without a loop, its 7-bit groups packed in three steps.
        bits = int.from_bytes(eight, "little")
        if bits & _HIGH_BITS == _EIGHT_BYTE_LONG:
            bits &= 0x7F7F7F7F7F7F7F7F
            bits = (bits & 0x007F007F007F007F) | ((bits & 0x7F007F007F007F00) >> 1)
            bits = (bits & 0x00003FFF00003FFF) | ((bits & 0x3FFF00003FFF0000) >> 2)
            bits = (bits & 0x000000000FFFFFFF) | ((bits & 0x0FFFFFFF00000000) >> 4)
            return (bits >> 1) ^ -(bits & 1), at + 8
    zigzag = shift = 0
    for byte in data[at : at + 10]:  # 7 bits a byte, least significant first, then zig-zag
        at += 1
        zigzag |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (zigzag >> 1) ^ -(zigzag & 1), at
        shift += 7
    return -1, -1


def check_record_size(data: bytes) -> None:
    """Raise :class:`OversizedRecordError` if an encoded record is too large for a stream."""
    if len(data) > MAX_RECORD_BYTES:
        raise OversizedRecordError(
            f"encoded record is {len(data)} bytes, over the {MAX_RECORD_BYTES}-byte limit; "
            "keep large payloads elsewhere and produce a reference to them"
        )


def clamp_event_time(timestamp: int) -> int:
    """The event time nearest ``timestamp`` that :func:`check_event_time` accepts: what a
    dead letter of an input with an absurd timestamp carries."""
    return min(max(timestamp, MIN_EVENT_TIME), MAX_EVENT_TIME)


def check_event_time(timestamp: int) -> None:
    """Raise :class:`AbsurdTimestampError` for an event time outside the plausible range."""
    if not MIN_EVENT_TIME <= timestamp <= MAX_EVENT_TIME:
        raise AbsurdTimestampError(
            f"event time {timestamp} is outside [{MIN_EVENT_TIME}, {MAX_EVENT_TIME}]; "
            "timestamps are integer microseconds since the Unix epoch (not ms or ns)"
        )


def injector_record_id(source: str, partition_or_file: str | int, offset: int) -> bytes:
    """The ID of a record an injector reads at a source position.

    ``source`` names the source (a topic, a log directory, a feed), ``partition_or_file`` the
    partition number or the file identity (e.g. ``"<inode>:<creation time>"``, not only its
    path, which may be reused), ``offset`` the position within it. A restarted injector that
    re-reads a position re-sends the same ID.
    """
    if not source:
        raise ValueError("source must be a non-empty name")
    if offset < 0:
        raise ValueError(f"offset must be non-negative, got {offset}")
    return _derive_id("injector", source, partition_or_file, offset)


def deletion_record_id(stream: str, partition: int, offset: int) -> bytes:
    """The ID of the :class:`Deletion` a tombstone at ``offset`` of ``partition`` of
    ``stream`` means: the same for every read of that message, distinct from every other
    rule's IDs (an injector reading a topic named like the stream included)."""
    if not stream:
        raise ValueError("stream must be a non-empty name")
    if offset < 0:
        raise ValueError(f"offset must be non-negative, got {offset}")
    return _derive_id("deletion", stream, partition, offset)


def production_record_id(computation: str, cause_id: bytes, index: int) -> bytes:
    """The ID of the ``index``-th production of a call, so a retried call reproduces it.

    ``cause_id`` is the input record's ID, or :func:`timer_identity` of the firing timer.
    """
    if not computation:
        raise ValueError("computation must be a non-empty name")
    if not cause_id:
        raise ValueError("cause_id must be the input record's ID or a timer identity")
    if index < 0:
        raise ValueError(f"index must be non-negative, got {index}")
    # _derive_id("production", computation, cause_id, index), from a copy of the digest
    # that has hashed the first two parts already: every production pays this.
    digest = _production_digest(computation).copy()
    # The two frames in one update, the usual ones made once: a record ID or timer identity
    # as cause, and a call's first few productions.
    cause = _ID_FRAME + cause_id if len(cause_id) == RECORD_ID_BYTES else _frame(cause_id)
    digest.update(cause + (_INDEX_FRAMES[index] if index < _FRAMED_INDEXES else _frame(index)))
    return digest.digest()


_FRAMED_INDEXES = 16
_INDEX_FRAMES = tuple(b"i" + struct.pack(">q", index) for index in range(_FRAMED_INDEXES))
_ID_FRAME = b"b" + struct.pack(">I", RECORD_ID_BYTES)


@lru_cache(maxsize=1024)
def _production_digest(computation: str) -> hashlib.blake2b:
    return _digest("production", computation)


def dead_letter_record_id(computation: str, cause_id: bytes) -> bytes:
    """The ID of the dead letter a call or a rejected input turns into (at most one per cause)."""
    if not cause_id:
        raise ValueError("cause_id must identify the failed record, timer or input position")
    return _derive_id("dead-letter", computation, cause_id)


def timer_identity(key: str, tag: str, timestamp: int, set_by: bytes = b"") -> bytes:
    """The identity of one setting of a timer, the cause of the productions of its firing.

    ``set_by`` is the cause ID of the call that set the timer. It tells apart two settings of
    the same (key, tag, timestamp), e.g. a window timer set again by a late record after the
    first one fired: without it the corrected window's productions would reuse the first
    firing's record IDs and be dropped downstream as duplicates.
    """
    return _derive_id("timer", key, tag, timestamp, set_by)


def _derive_id(domain: str, *parts: str | bytes | int) -> bytes:
    return _digest(domain, *parts).digest()


def _digest(*parts: str | bytes | int) -> hashlib.blake2b:
    """The record-ID hash with ``parts`` framed into it, to be finished or copied on."""
    digest = hashlib.blake2b(digest_size=RECORD_ID_BYTES, person=_ID_PERSON)
    for part in parts:
        digest.update(_frame(part))
    return digest


def _frame(part: str | bytes | int) -> bytes:
    # Type tag plus length prefix: ("ab", "c") and ("a", "bc"), or partition 3 and file "3",
    # must never hash alike.
    if isinstance(part, bool):
        raise TypeError("record ID parts must be str, bytes or int, not bool")
    if isinstance(part, int):
        if not _LONG_MIN <= part <= _LONG_MAX:
            raise ValueError(f"record ID part {part} does not fit 64 bits")
        return b"i" + struct.pack(">q", part)
    raw = part.encode("utf-8") if isinstance(part, str) else bytes(part)
    return (b"s" if isinstance(part, str) else b"b") + struct.pack(">I", len(raw)) + raw


@cache
def shipped_schema(file_name: str) -> RegisteredSchema:
    """A schema file of ``millstream.schemas`` as registered in :func:`default_registry`.

    This is the version this code reads and writes, even if a newer one is registered too.
    """
    shipped = resources.files(_SCHEMA_PACKAGE).joinpath(file_name)
    return default_registry().register(shipped.read_text(encoding="utf-8"))


def _envelope() -> RegisteredSchema:
    return shipped_schema("envelope.avsc")


def _schema_name(parsed: Any) -> str:
    if isinstance(parsed, dict):
        return str(parsed.get("name", parsed["type"]))
    return parsed if isinstance(parsed, str) else "union"


def _without_logical_types(schema: Any) -> Any:
    if isinstance(schema, dict):
        return {k: _without_logical_types(v) for k, v in schema.items() if k != "logicalType"}
    if isinstance(schema, list):
        return [_without_logical_types(item) for item in schema]
    return schema
