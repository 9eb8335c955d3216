"""Routing: from a message of a stream to the key interval of a consumer that works it.

A consumer reads each of its input streams with that stream's key extractor (user code); the
key decides the key interval (:func:`~millstream.engine.keys.key_interval`) and so which
:class:`~millstream.engine.protocol.IntervalWorker` runs the record. A message that cannot be
delivered (oversized, undecodable, an unknown schema, a key extractor that raises or returns
no ``str``) is rejected into the interval of the empty key, where it becomes a dead letter;
a rejection that names a key (``Origin.key``: the Spark executor names the key of an envelope
it could read that far, when the stream is keyed by the record's key) goes to that key's
interval, where its dead letter's exactly-once bookkeeping is kept.

A *tombstone* (a Kafka message with no value) is no record: it is rejected with a
:class:`~millstream.engine.errors.TombstoneError`, unless the consumer takes tombstones
(``ComputationOptions(tombstones="deliver")``), which gets it as a
:class:`~millstream.engine.records.Deletion` of its Kafka message key
(:func:`decode_tombstone`).

The Spark runtime and :mod:`millstream.engine.testing` both route with these functions, so a
user's test sees the same keys, intervals and rejections as the real run.
"""

from __future__ import annotations

from collections.abc import Iterable

from millstream.engine.deadletters import Origin
from millstream.engine.errors import TombstoneError
from millstream.engine.keys import key_interval
from millstream.engine.layout import IntervalLayout
from millstream.engine.protocol import Delivery, Rejected
from millstream.engine.records import (
    Deletion,
    Record,
    check_record_size,
    decode_record,
    deletion_record_id,
    encode_record,
)
from millstream.engine.topology import ComputationSpec, KeyExtractor

__all__ = [
    "decode_delivery",
    "decode_tombstone",
    "deliver",
    "deliver_tombstone",
    "interval_of",
    "key_of",
    "rejected_interval",
    "split_by_interval",
]


def key_of(
    spec: ComputationSpec, stream: str, record: Record, extractor: KeyExtractor | None = None
) -> str:
    """The consumer's key of a record of ``stream``; raises what the extractor raised, or
    ``TypeError`` if it returned no ``str``. ``extractor``: the stream's, when the caller
    holds it (``spec.key_extractor(stream)``, looked up otherwise: a router keys every
    message)."""
    key = (extractor or spec.key_extractor(stream))(record)
    if not isinstance(key, str):
        raise TypeError(
            f"the key extractor of {spec.name!r} for stream {stream!r} returned "
            f"{type(key).__name__}, not str; return the key as a string"
        )
    return key


def decode_delivery(
    spec: ComputationSpec, stream: str, raw: bytes | None, extractor: KeyExtractor | None = None
) -> tuple[Record | None, str | None, Exception | None]:
    """The record and the consumer's key of one message value of ``stream``, or why it
    cannot be delivered.

    The error is one of the record errors, or whatever the key extractor raised (user code
    must not stop a partition). The record is returned whenever it decoded, to locate the
    dead letter by its record ID. A tombstone (``raw`` is ``None``) is a
    :class:`TombstoneError` here; a consumer that takes tombstones decodes them with
    :func:`decode_tombstone`, which needs the message's key and position. ``extractor`` as
    for :func:`key_of`.
    """
    if raw is None:
        return None, None, _tombstone_not_taken(spec, stream)
    try:
        check_record_size(raw)
        record = decode_record(raw)
    except Exception as exc:
        return None, None, exc
    try:
        key = key_of(spec, stream, record, extractor)
    except Exception as exc:
        return record, None, exc
    return record, key, None


def decode_tombstone(
    spec: ComputationSpec,
    stream: str,
    key: bytes | None,
    partition: int,
    offset: int,
    timestamp: int,
) -> tuple[Deletion | None, TombstoneError | None]:
    """What a tombstone (a message with no value) of ``stream`` at ``offset`` of
    ``partition`` means to the consumer: the :class:`Deletion` of its Kafka message ``key``
    if the consumer takes tombstones, else why it is a dead letter.

    ``timestamp`` is the message's Kafka timestamp (µs). The deletion's record ID is derived
    from the position (:func:`~millstream.engine.records.deletion_record_id`), so every read
    of the message, a replayed batch's included, yields the same deletion.
    """
    if spec.options.tombstones != "deliver":
        return None, _tombstone_not_taken(spec, stream)
    where = f"of stream {stream!r} at partition {partition} offset {offset}"
    if key is None:
        return None, TombstoneError(
            f"a tombstone {where} has no key, so it names nothing to delete; producers of "
            f"deletions for {spec.name!r} must key each tombstone by what it deletes"
        )
    try:
        text = key.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, TombstoneError(
            f"the key of a tombstone {where} is not UTF-8 ({exc}), so it names no key of "
            f"{spec.name!r}; key tombstones by the UTF-8 encoding of the key they delete"
        )
    return Deletion(text, timestamp, stream, deletion_record_id(stream, partition, offset)), None


def deliver_tombstone(
    spec: ComputationSpec, stream: str, key: bytes | None, timestamp: int, origin: Origin
) -> Delivery | Rejected:
    """A tombstone of ``stream`` at ``origin`` (which has its partition and offset) as the
    consumer's input: a delivery of its :class:`Deletion`, or a rejection."""
    if origin.partition is None or origin.offset is None:
        raise ValueError(f"a tombstone is identified by its position; {origin} has none")
    deletion, error = decode_tombstone(
        spec, stream, key, origin.partition, origin.offset, timestamp
    )
    if error is not None:
        return Rejected(origin, b"", error, timestamp)
    assert deletion is not None
    return Delivery(deletion.key, deletion, origin)


def _tombstone_not_taken(spec: ComputationSpec, stream: str) -> TombstoneError:
    if spec.options.tombstones == "deliver":
        return TombstoneError(
            f"a tombstone of stream {stream!r} reached the record decoder; {spec.name!r} "
            "takes tombstones as deletions, which decode_tombstone makes from their key"
        )
    return TombstoneError(
        f"a tombstone (a message with no value) of stream {stream!r} is no record; "
        f"{spec.name!r} does not take deletions. If a tombstone on this stream means a "
        "delete, set ComputationOptions(tombstones='deliver') and override "
        "Computation.process_deletion"
    )


def deliver(
    spec: ComputationSpec, stream: str, record: Record, origin: Origin
) -> Delivery | Rejected:
    """A decoded record of ``stream`` as the consumer's input: a delivery under its key, or,
    if its key extractor fails, a rejection carrying the encoded record."""
    try:
        key = key_of(spec, stream, record)
    except Exception as exc:
        # The extractor is user code: its failure dead-letters the record, never stops input.
        return Rejected(origin, encode_record(record), exc, record.timestamp)
    return Delivery(key, record, origin)


def rejected_interval(spec: ComputationSpec, layout: IntervalLayout | None = None) -> int:
    """The key interval that works rejected input: the empty key's (in ``layout``, default:
    the intervals the computation starts with)."""
    if layout is not None:
        return layout.interval_of("")
    return key_interval("", spec.options.starting_intervals())


def interval_of(
    spec: ComputationSpec, item: Delivery | Rejected, layout: IntervalLayout | None = None
) -> int:
    """The key interval that works ``item``: its key's, or for a rejection the key its origin
    names (the empty key's, :func:`rejected_interval`, if none), in ``layout`` (default: the
    intervals the computation starts with)."""
    key = item.key if isinstance(item, Delivery) else item.origin.key or ""
    if layout is not None:
        return layout.interval_of(key)
    return key_interval(key, spec.options.starting_intervals())


def split_by_interval(
    spec: ComputationSpec,
    items: Iterable[Delivery | Rejected],
    layout: IntervalLayout | None = None,
) -> dict[int, list[Delivery | Rejected]]:
    """``items`` per key interval, each interval's in their given order."""
    split: dict[int, list[Delivery | Rejected]] = {}
    for item in items:
        split.setdefault(interval_of(spec, item, layout), []).append(item)
    return split
