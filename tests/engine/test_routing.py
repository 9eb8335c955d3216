"""Routing a stream's record to the consumer's key and interval, as runtime and harness do."""

from __future__ import annotations

import pytest

from millstream.engine.computation import Computation
from millstream.engine.context import Context
from millstream.engine.deadletters import Origin
from millstream.engine.keys import key_interval
from millstream.engine.protocol import Delivery, Rejected
from millstream.engine.records import Record, encode_record
from millstream.engine.routing import decode_delivery, deliver, key_of, split_by_interval
from millstream.engine.topology import ComputationOptions, Topology

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
