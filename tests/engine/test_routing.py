"""Routing a stream's record to the consumer's key and interval, as runtime and harness do."""

from __future__ import annotations

import pytest

from millstream.engine.computation import Computation
from millstream.engine.context import Context
from millstream.engine.deadletters import Origin
from millstream.engine.errors import MalformedRecordError, TombstoneError
from millstream.engine.keys import key_interval
from millstream.engine.protocol import Delivery, Rejected
from millstream.engine.records import (
    Deletion,
    Record,
    deletion_record_id,
    encode_record,
    injector_record_id,
)
from millstream.engine.routing import (
    decode_delivery,
    decode_tombstone,
    deliver,
    deliver_tombstone,
    key_of,
    split_by_interval,
)
from millstream.engine.topology import ComputationOptions, ComputationSpec, Tombstones, Topology

pytestmark = pytest.mark.unit


class Nothing(Computation):
    def process_record(self, ctx: Context, record: Record) -> None:
        pass


def consumer(extractor: object) -> Topology:
    topology = Topology("routing", streams=["in"])
    topology.add_computation(
        "c",
        Nothing(),
        inputs={"in": extractor},
        options=ComputationOptions(key_intervals=4),
    )
    return topology


RECORD = Record("user-7", b"v", 1_000, b"\x01" * 16)


def test_the_extractor_keys_and_the_key_picks_the_interval() -> None:
    spec = consumer(lambda r: r.value.decode()).computations["c"]
    item = deliver(spec, "in", RECORD, Origin(stream="in"))
    assert isinstance(item, Delivery)
    assert item.key == "v"
    split = split_by_interval(spec, [item])
    assert list(split) == [key_interval("v", 4)]


def test_a_non_str_key_or_a_raising_extractor_is_rejected_with_the_record() -> None:
    spec = consumer(lambda r: 7).computations["c"]
    with pytest.raises(TypeError, match="returned int, not str"):
        key_of(spec, "in", RECORD)
    item = deliver(spec, "in", RECORD, Origin(stream="in"))
    assert isinstance(item, Rejected)
    assert item.raw == encode_record(RECORD)
    assert isinstance(item.error, TypeError)
    assert list(split_by_interval(spec, [item])) == [key_interval("", 4)]


def test_decode_delivery_says_why_a_message_cannot_be_delivered() -> None:
    spec = consumer(None).computations["c"]
    record, key, error = decode_delivery(spec, "in", encode_record(RECORD))
    assert (record, key, error) == (RECORD, "user-7", None)
    record, key, error = decode_delivery(spec, "in", b"not avro")
    assert record is None
    assert key is None
    assert error is not None


class Deleting(Nothing):
    def process_deletion(self, ctx: Context, deletion: Deletion) -> None:
        ctx.clear_state()


def takes_tombstones(tombstones: Tombstones) -> ComputationSpec:
    topology = Topology("routing", streams=["in"])
    return topology.add_computation(
        "c",
        Deleting(),
        inputs=["in"],
        options=ComputationOptions(key_intervals=4, tombstones=tombstones),
    )


def test_a_tombstone_is_no_record_and_says_how_to_take_it_as_a_deletion() -> None:
    spec = takes_tombstones("dead-letter")
    record, key, error = decode_delivery(spec, "in", None)
    assert (record, key) == (None, None)
    assert isinstance(error, TombstoneError)
    assert "tombstones='deliver'" in str(error)
    assert "process_deletion" in str(error)
    deletion, error = decode_tombstone(spec, "in", b"k", 0, 7, 5)
    assert deletion is None
    assert isinstance(error, TombstoneError)

    # An empty value is a message, not a tombstone: a malformed one.
    _, _, error = decode_delivery(spec, "in", b"")
    assert isinstance(error, MalformedRecordError)


def test_a_consumer_taking_tombstones_gets_a_deletion_of_the_kafka_key() -> None:
    spec = takes_tombstones("deliver")
    deletion, error = decode_tombstone(spec, "in", "clé".encode(), 3, 7, 5)
    assert error is None
    assert deletion == Deletion("clé", 5, "in", deletion_record_id("in", 3, 7))
    item = deliver_tombstone(spec, "in", b"k", 5, Origin(stream="in", partition=3, offset=8))
    assert isinstance(item, Delivery)
    assert item.key == "k"
    assert split_by_interval(spec, [item]) == {key_interval("k", 4): [item]}


@pytest.mark.parametrize(("key", "says"), [(None, "has no key"), (b"\xff\xfe", "not UTF-8")])
def test_a_tombstone_without_a_usable_key_is_rejected(key: bytes | None, says: str) -> None:
    spec = takes_tombstones("deliver")
    origin = Origin(stream="in", partition=3, offset=8)
    item = deliver_tombstone(spec, "in", key, 5, origin)
    assert isinstance(item, Rejected)
    assert (item.origin, item.raw, item.timestamp) == (origin, b"", 5)
    assert isinstance(item.error, TombstoneError)
    assert says in str(item.error)
    assert list(split_by_interval(spec, [item])) == [key_interval("", 4)]


def test_a_deletion_id_is_its_position_and_no_other_rules_id() -> None:
    assert deletion_record_id("in", 0, 1) == deletion_record_id("in", 0, 1)
    assert deletion_record_id("in", 0, 1) != deletion_record_id("in", 0, 2)
    assert deletion_record_id("in", 0, 1) != deletion_record_id("in", 1, 1)
    assert deletion_record_id("in", 0, 1) != injector_record_id("in", 0, 1)
