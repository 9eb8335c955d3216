"""The executor's router, fuzzed without Spark or Kafka.

Arbitrary Kafka messages (values ``None``, empty, random, valid envelopes, mutated and
truncated ones, unknown schemas, oversized; keys ``None`` or any bytes; every timestamp) go
through :func:`~millstream.spark.executor.message_router`. Whatever comes, the router does not
raise, and each message yields exactly one input, in an interval: a record as it was encoded,
a deletion, or a rejection carrying its error.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from millstream.connectors.stream_reader import InputMessage
from millstream.engine import errors
from millstream.engine.computation import Computation
from millstream.engine.context import Context
from millstream.engine.errors import RecordError, TombstoneError
from millstream.engine.layout import IntervalLayout
from millstream.engine.protocol import Delivery, Rejected
from millstream.engine.records import (
    MAX_RECORD_BYTES,
    RECORD_ID_BYTES,
    SINGLE_OBJECT_MARKER,
    Deletion,
    Record,
    decode_record,
    deletion_record_id,
    encode_record,
    envelope_key,
)
from millstream.engine.routing import rejected_interval
from millstream.engine.topology import (
    ComputationOptions,
    ComputationSpec,
    KeyExtractor,
    Tombstones,
    Topology,
    record_key,
)
from millstream.spark.executor import message_router

pytestmark = pytest.mark.unit

FUZZ = settings(max_examples=80, deadline=None)
INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
TOPIC = "in"  # stream_topic("in"): streams are topics of their own name
RECORDS = st.builds(
    Record,
    key=st.text(max_size=16),
    value=st.binary(max_size=32),
    timestamp=INT64,
    record_id=st.binary(min_size=RECORD_ID_BYTES, max_size=RECORD_ID_BYTES),
)
# Built once: an envelope over the engine's size limit (the broker's is larger).
OVERSIZED = encode_record(Record("big", b"x" * MAX_RECORD_BYTES, 1, b"\1" * RECORD_ID_BYTES))
# The classes an error description may name: the engine's, and what the user's extractor
# below raises.
ERROR_NAMES = frozenset(
    name for name in errors.__all__ if issubclass(getattr(errors, name), RecordError)
) | {"UnicodeDecodeError"}


class Keyed(Computation):
    def process_record(self, ctx: Context, record: Record) -> None:
        pass

    def process_deletion(self, ctx: Context, deletion: Deletion) -> None:
        pass


def by_value(record: Record) -> str:
    """A user's extractor: the value as text, refusing values that are not UTF-8."""
    return record.value.decode("utf-8")


def consumer(extractor: KeyExtractor | None, tombstones: Tombstones) -> ComputationSpec:
    topology = Topology("fuzz", streams=[TOPIC])
    return topology.add_computation(
        "c",
        Keyed(),
        inputs={TOPIC: extractor},
        options=ComputationOptions(key_intervals=8, tombstones=tombstones),
    )


SPECS = [consumer(None, "dead-letter"), consumer(by_value, "dead-letter")]
SPECS += [consumer(None, "deliver"), consumer(by_value, "deliver")]


@dataclass(frozen=True)
class Message:
    """One Kafka message, and the record it encodes if it is a valid envelope."""

    value: bytes | None
    key: bytes | None
    kafka_ts: int
    encodes: Record | None = None


@st.composite
def values(draw: st.DrawFn) -> tuple[bytes | None, Record | None]:
    kind = draw(
        st.sampled_from(
            ["tombstone", "empty", "garbage", "valid", "mutated", "truncated", "unknown", "big"]
        )
    )
    if kind == "tombstone":
        return None, None
    if kind == "empty":
        return b"", None
    if kind == "garbage":
        return draw(st.binary(min_size=1, max_size=64)), None
    if kind == "unknown":
        return SINGLE_OBJECT_MARKER + draw(st.binary(min_size=8, max_size=40)), None
    if kind == "big":
        return OVERSIZED, None
    record = draw(RECORDS)
    encoded = encode_record(record)
    if kind == "valid":
        return encoded, record
    index = draw(st.integers(min_value=0, max_value=len(encoded) - 1))
    if kind == "truncated":
        return encoded[:index], None
    mutated = bytearray(encoded)
    mutated[index] ^= draw(st.integers(min_value=1, max_value=255))
    return bytes(mutated), None


@st.composite
def messages(draw: st.DrawFn) -> Message:
    value, encodes = draw(values())
    key = draw(st.one_of(st.none(), st.binary(max_size=8), st.text(max_size=8).map(str.encode)))
    return Message(value, key, draw(INT64), encodes)


def input_message(message: Message, number: int) -> InputMessage:
    """``message`` as read from partition ``number % 3`` at offset ``number``."""
    return InputMessage(TOPIC, number % 3, number, message.kafka_ts, message.key, message.value)


@FUZZ
@given(st.lists(messages(), min_size=1, max_size=30))
def test_every_message_yields_one_input_that_is_a_record_a_deletion_or_a_rejection(
    sent: list[Message],
) -> None:
    layout = IntervalLayout.initial(8)
    for spec in SPECS:
        takes_tombstones = spec.options.tombstones == "deliver"
        route = message_router(spec, layout)
        for number, message in enumerate(sent):
            interval, item = route(input_message(message, number))
            origin = (item.origin.stream, item.origin.partition, item.origin.offset)
            assert origin == (TOPIC, number % 3, number)
            if isinstance(item, Rejected):
                assert type(item.error).__qualname__ in ERROR_NAMES, item.error
                # Under its envelope's key if that can be read and keys the stream, so that
                # the task owning the key's interval finds it without decoding it.
                key = None if message.value is None else envelope_key(message.value)
                if key is not None and spec.key_extractor(TOPIC) is record_key:
                    assert (interval, item.origin.key) == (layout.interval_of(key), key)
                else:
                    assert interval == rejected_interval(spec, layout)
                    assert item.origin.key is None
                assert item.raw == (message.value or b"")
                if message.value is None:
                    assert isinstance(item.error, TombstoneError)
                assert message.encodes is None or spec.key_extractor(TOPIC) is by_value
                continue
            assert isinstance(item, Delivery)
            assert interval == layout.interval_of(item.key)
            if isinstance(item.record, Deletion):  # a deletion of the message's key
                assert takes_tombstones
                assert message.value is None
                assert message.key is not None
                assert item.key == message.key.decode("utf-8")
                assert item.record.timestamp == message.kafka_ts
                assert item.record.record_id == deletion_record_id(TOPIC, number % 3, number)
            else:
                assert message.value is not None
                record = decode_record(message.value)
                assert message.encodes in (None, record)  # a valid envelope is what it encodes
                assert item.record == record
                assert item.key == spec.key_extractor(TOPIC)(record)
                assert envelope_key(message.value) == record.key
