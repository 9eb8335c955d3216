import pytest
from hypothesis import given
from hypothesis import strategies as st

from millstream.engine.codecs import AvroCodec, BytesCodec, IntCodec, JsonCodec
from millstream.engine.errors import UnknownSchemaError
from millstream.engine.records import SchemaRegistry

pytestmark = pytest.mark.unit

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner),
    max_leaves=10,
)


@given(st.binary())
def test_bytes_round_trip(value: bytes) -> None:
    assert BytesCodec().decode(BytesCodec().encode(value)) == value


@given(st.integers(-(2**63), 2**63 - 1))
def test_int_round_trip(value: int) -> None:
    encoded = IntCodec().encode(value)
    assert len(encoded) == 8
    assert IntCodec().decode(encoded) == value


@given(json_values)
def test_json_round_trip(value: object) -> None:
    assert JsonCodec().decode(JsonCodec().encode(value)) == value


def test_json_bytes_are_stable_across_key_order() -> None:
    assert (
        JsonCodec().encode({"b": 1, "a": 2})
        == JsonCodec().encode({"a": 2, "b": 1})
        == (b'{"a":2,"b":1}')
    )


COUNTS_V1 = {"type": "record", "name": "app.Counts", "fields": [{"name": "n", "type": "long"}]}
COUNTS_V2 = {
    "type": "record",
    "name": "app.Counts",
    "fields": [{"name": "n", "type": "long"}, {"name": "sum", "type": "long", "default": 0}],
}


def test_avro_state_evolves_with_registered_older_versions() -> None:
    registry = SchemaRegistry()
    old = AvroCodec[dict[str, int]](COUNTS_V1, registry).encode({"n": 3})
    new = AvroCodec[dict[str, int]](COUNTS_V2, registry)
    assert new.decode(old) == {"n": 3, "sum": 0}
    assert new.decode(new.encode({"n": 1, "sum": 2})) == {"n": 1, "sum": 2}


def test_avro_state_from_an_unregistered_version_is_refused() -> None:
    old = AvroCodec[dict[str, int]](COUNTS_V1, SchemaRegistry()).encode({"n": 3})
    with pytest.raises(UnknownSchemaError):
        AvroCodec[dict[str, int]](COUNTS_V2, SchemaRegistry()).decode(old)
