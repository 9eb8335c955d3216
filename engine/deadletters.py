"""Dead letters: input or work a computation gave up on, kept with its origin and error.

A malformed record, an unknown schema, an absurd timestamp, or an exception in user code never
stops a partition: the engine turns the input into a :class:`DeadLetter` and produces it to the
computation's dead-letter stream (``<computation>.dead-letters`` unless configured otherwise),
atomically with the key's commit. It is then counted and out of the way.

On the wire a dead letter is a normal envelope whose value is a ``millstream.DeadLetter`` Avro
record (``schemas/dead_letter.avsc``) in single-object encoding; the envelope's key is the
failed input's key (empty if it had none) and its timestamp the input's event time. Its record
ID is derived from the computation and the failed cause, so a retry yields the same ID.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from millstream.engine.records import (
    MAX_RECORD_BYTES,
    Record,
    RegisteredSchema,
    SchemaRegistry,
    dead_letter_record_id,
    decode_single_object,
    encode_single_object,
    injector_record_id,
    shipped_schema,
)
from millstream.engine.slots import slot_constructor

__all__ = [
    "DEAD_LETTER_SCHEMA_NAME",
    "MAX_ERROR_MESSAGE_CHARS",
    "MAX_RAW_BYTES",
    "DeadLetter",
    "Origin",
    "decode_dead_letter",
    "default_dead_letter_stream",
    "encode_dead_letter",
    "stream_origin",
]

DEAD_LETTER_SCHEMA_NAME = "millstream.DeadLetter"
MAX_ERROR_MESSAGE_CHARS = 4_000
# Leaves room for the dead letter's own fields so that it always fits on a stream.
MAX_RAW_BYTES = MAX_RECORD_BYTES - 64 * 1024


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a failed input came from; parts that do not apply are ``None``.

    A record read from a stream has ``stream``, ``partition`` and ``offset`` (and ``record_id``
    and ``key`` once decoded); a timer firing has ``key``, ``timer_tag`` and ``timer_timestamp``.
    """

    stream: str | None = None
    partition: int | None = None
    offset: int | None = None
    record_id: bytes | None = None
    key: str | None = None
    timer_tag: str | None = None
    timer_timestamp: int | None = None

    def cause_id(self) -> bytes:
        """Identifies the failed input: its record ID, else its stream position."""
        if self.record_id is not None:
            return self.record_id
        if self.stream is None or self.partition is None or self.offset is None:
            raise ValueError(
                "an origin without a record ID needs stream, partition and offset to be "
                f"identified: {self}"
            )
        return injector_record_id(self.stream, self.partition, self.offset)


_make_origin = slot_constructor(Origin)


def stream_origin(stream: str, partition: int, offset: int) -> Origin:
    """``Origin(stream=stream, partition=partition, offset=offset)``, made at a third of the
    cost (:mod:`~millstream.engine.slots`): a router makes one for every message."""
    origin: Origin = _make_origin(stream, partition, offset, None, None, None, None)
    return origin


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """Why ``computation`` gave up on an input, and the input's bytes (possibly a prefix)."""

    computation: str
    origin: Origin
    error_type: str
    error_message: str
    raw: bytes = b""
    raw_size: int = 0

    @classmethod
    def from_error(
        cls, computation: str, origin: Origin, error: BaseException, raw: bytes = b""
    ) -> DeadLetter:
        """A dead letter for ``error``, with the message and raw bytes cut to fit a stream."""
        return cls(
            computation=computation,
            origin=origin,
            error_type=type(error).__qualname__,
            error_message=str(error)[:MAX_ERROR_MESSAGE_CHARS],
            raw=raw[:MAX_RAW_BYTES],
            raw_size=len(raw),
        )

    def to_record(self, cause_id: bytes, timestamp: int) -> Record:
        """The envelope that carries this dead letter; ``cause_id`` names the failed input."""
        return Record(
            key=self.origin.key or "",
            value=encode_dead_letter(self),
            timestamp=timestamp,
            record_id=dead_letter_record_id(self.computation, cause_id),
        )


def default_dead_letter_stream(computation: str) -> str:
    """The dead-letter stream of a computation that does not name one."""
    return f"{computation}.dead-letters"


def encode_dead_letter(dead_letter: DeadLetter) -> bytes:
    origin = dead_letter.origin
    datum: dict[str, Any] = {
        "computation": dead_letter.computation,
        "origin": {
            "stream": origin.stream,
            "partition": origin.partition,
            "offset": origin.offset,
            "record_id": origin.record_id,
            "key": origin.key,
            "timer_tag": origin.timer_tag,
            "timer_timestamp": origin.timer_timestamp,
        },
        "error_type": dead_letter.error_type,
        "error_message": dead_letter.error_message,
        "raw": dead_letter.raw,
        "raw_size": dead_letter.raw_size,
    }
    return encode_single_object(datum, _schema())


def decode_dead_letter(data: bytes, registry: SchemaRegistry | None = None) -> DeadLetter:
    """Read a dead letter's value; raises the errors of ``decode_single_object``."""
    datum = decode_single_object(data, _schema(), registry)
    return DeadLetter(
        computation=datum["computation"],
        origin=Origin(**datum["origin"]),
        error_type=datum["error_type"],
        error_message=datum["error_message"],
        raw=datum["raw"],
        raw_size=datum["raw_size"],
    )


def _schema() -> RegisteredSchema:
    return shipped_schema("dead_letter.avsc")
