"""Codecs between rich values and the bytes that state and record values are made of.

MillWheel state is an opaque byte string per key (paper 4.4); the user brings the
serialization. A :class:`Codec` is that serialization: ``decode(encode(v)) == v``.
``ctx.state(codec)`` gives typed access to a key's state through one.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from typing import Any, Generic, Protocol, TypeVar

from millstream.engine.records import (
    RegisteredSchema,
    SchemaRegistry,
    decode_single_object,
    default_registry,
    encode_single_object,
)

__all__ = ["AvroCodec", "BytesCodec", "Codec", "IntCodec", "JsonCodec"]

T = TypeVar("T")


class Codec(Protocol[T]):
    """Turns values of one type into bytes and back; ``decode(encode(v)) == v``."""

    def encode(self, value: T, /) -> bytes: ...

    def decode(self, data: bytes, /) -> T: ...


class BytesCodec:
    """Bytes as they are."""

    def encode(self, value: bytes, /) -> bytes:
        return bytes(value)

    def decode(self, data: bytes, /) -> bytes:
        return data


class IntCodec:
    """A signed 64-bit integer, 8 bytes big-endian."""

    def encode(self, value: int, /) -> bytes:
        return struct.pack(">q", value)

    def decode(self, data: bytes, /) -> int:
        (value,) = struct.unpack(">q", data)
        return int(value)


class JsonCodec:
    """Any JSON-serializable value, as compact UTF-8 JSON with sorted keys (stable bytes)."""

    def encode(self, value: Any, /) -> bytes:
        return json.dumps(value, separators=(",", ":"), sort_keys=True).encode("utf-8")

    def decode(self, data: bytes, /) -> Any:
        return json.loads(data)


class AvroCodec(Generic[T]):
    """Avro single-object encoding with a registered schema, so stored values can evolve.

    Values written with an older registered schema are resolved against this codec's schema on
    read; register every older version in ``registry`` before reading them.
    """

    def __init__(
        self, schema: str | Mapping[str, Any], registry: SchemaRegistry | None = None
    ) -> None:
        self._registry = default_registry() if registry is None else registry
        self._schema: RegisteredSchema = self._registry.register(schema)

    def encode(self, value: T, /) -> bytes:
        return encode_single_object(value, self._schema)

    def decode(self, data: bytes, /) -> T:
        result: T = decode_single_object(data, self._schema, self._registry)
        return result
