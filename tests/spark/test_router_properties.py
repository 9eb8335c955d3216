"""The Spark router and the interval task's reading of its rows, fuzzed without Spark.

Batches of arbitrary Kafka messages (values ``None``, empty, random, valid envelopes, mutated
and truncated ones, unknown schemas, oversized; keys ``None`` or any bytes; every timestamp)
go through :func:`~millstream.spark.executor.router` as Arrow record batches, and its rows
back into the interval task's inputs. Whatever comes, the router does not raise, each
message yields exactly one row, and each row is a record as it was encoded, a deletion, or a
rejection naming its error; the interval task turns each row into exactly one input.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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
)
from millstream.engine.routing import rejected_interval
from millstream.engine.topology import (
    ComputationOptions,
    ComputationSpec,
    KeyExtractor,
    Tombstones,
    Topology,
)
from millstream.spark import executor
from millstream.spark.executor import IntervalSlots, RoutedRow, router, source_columns

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


def kafka_batch(batch: list[Message], with_key: bool) -> pa.RecordBatch:
    columns = {
        "value": pa.array([m.value for m in batch], pa.binary()),
        "topic": pa.array([TOPIC] * len(batch), pa.string()),
        "partition": pa.array([n % 3 for n in range(len(batch))], pa.int32()),
        "offset": pa.array(range(len(batch)), pa.int64()),
        "kafka_ts": pa.array([m.kafka_ts for m in batch], pa.int64()),
    }
    if with_key:
        columns["key"] = pa.array([m.key for m in batch], pa.binary())
    return pa.RecordBatch.from_pydict(columns)


@FUZZ
@given(st.lists(st.lists(messages(), max_size=12), min_size=1, max_size=3))
def test_every_message_yields_one_row_that_is_a_record_a_deletion_or_a_rejection(
    batches: list[list[Message]],
) -> None:
    layout = IntervalLayout.initial(8)
    slots = IntervalSlots(2)
    for spec in SPECS:
        with_key = "key" in source_columns(spec)
        takes_tombstones = spec.options.tombstones == "deliver"
        arrow = [kafka_batch(batch, with_key) for batch in batches]
        routed = list(router(spec, layout, slots)(iter(arrow)))
        assert [b.num_rows for b in routed] == [len(batch) for batch in batches]
        rows = [RoutedRow(**row) for b in routed for row in b.to_pylist()]
        sent = [m for batch in batches for m in batch]
        for message, row in zip(sent, rows, strict=True):
            assert row.slot == slots.slot(row.interval)
            if row.error is not None:
                assert row.error.split(":", 1)[0] in ERROR_NAMES, row.error
                assert row.interval == rejected_interval(spec, layout)
                assert row.raw == message.value
                if message.value is None:
                    assert row.error.startswith("TombstoneError: ")
                assert message.encodes is None or spec.key_extractor(TOPIC) is by_value
            elif row.record_value is None:  # a deletion of the message's key
                assert takes_tombstones
                assert message.value is None
                assert message.key is not None
                assert row.key == message.key.decode("utf-8")
                assert row.interval == layout.interval_of(row.key)
                assert row.record_ts == message.kafka_ts
                assert row.partition is not None
                assert row.offset is not None
                assert row.record_id == deletion_record_id(TOPIC, row.partition, row.offset)
            else:
                assert message.value is not None
                record = decode_record(message.value)
                assert message.encodes in (None, record)  # a valid envelope is what it encodes
                assert (row.record_key, row.record_value) == (record.key, record.value)
                assert (row.record_ts, row.record_id) == (record.timestamp, record.record_id)
                assert row.key == spec.key_extractor(TOPIC)(record)
                assert row.interval == layout.interval_of(row.key)
            if message.encodes is not None and spec.key_extractor(TOPIC) is not by_value:
                assert row.error is None

        # The interval task reads each row back as exactly one input of its kind.
        inputs = executor._inputs(spec, rows)
        assert len(inputs) == len(rows)
        for row, item in zip(rows, inputs, strict=True):
            origin = (item.origin.stream, item.origin.partition, item.origin.offset)
            assert origin == (TOPIC, row.partition, row.offset)
            if row.error is not None:
                assert isinstance(item, Rejected)
                assert type(item.error).__qualname__ == row.error.split(":", 1)[0]
                assert item.raw == (row.raw or b"")
                if row.raw is None:
                    assert isinstance(item.error, TombstoneError)
                    assert f"TombstoneError: {item.error}" == row.error
            else:
                assert isinstance(item, Delivery)
                kind = Deletion if row.record_value is None else Record
                assert isinstance(item.record, kind)
                assert (item.key, item.record.record_id) == (row.key, row.record_id)
