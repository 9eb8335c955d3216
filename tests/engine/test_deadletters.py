import pytest

from millstream.engine.deadletters import (
    MAX_ERROR_MESSAGE_CHARS,
    MAX_RAW_BYTES,
    DeadLetter,
    Origin,
    decode_dead_letter,
    default_dead_letter_stream,
    encode_dead_letter,
    stream_origin,
)
from millstream.engine.records import (
    check_record_size,
    dead_letter_record_id,
    decode_record,
    encode_record,
    injector_record_id,
)

pytestmark = pytest.mark.unit

RID = bytes(range(16))


def test_round_trip_through_the_shipped_schema() -> None:
    dead = DeadLetter(
        computation="c",
        origin=Origin(
            stream="s",
            partition=1,
            offset=2,
            record_id=RID,
            key="k",
            timer_tag="t",
            timer_timestamp=3,
        ),
        error_type="ValueError",
        error_message="bad",
        raw=b"raw",
        raw_size=3,
    )
    assert decode_dead_letter(encode_dead_letter(dead)) == dead
    assert decode_dead_letter(encode_dead_letter(DeadLetter("c", Origin(), "E", ""))) == DeadLetter(
        "c", Origin(), "E", ""
    )


def test_from_error_cuts_message_and_raw_bytes_to_fit_a_stream() -> None:
    raw = b"x" * (MAX_RAW_BYTES + 10)
    dead = DeadLetter.from_error("c", Origin(record_id=RID), RuntimeError("m" * 10_000), raw)
    assert dead.error_type == "RuntimeError"
    assert len(dead.error_message) == MAX_ERROR_MESSAGE_CHARS
    assert (len(dead.raw), dead.raw_size) == (MAX_RAW_BYTES, len(raw))
    check_record_size(encode_record(dead.to_record(RID, 5)))


def test_envelope_carries_key_time_and_a_deterministic_id() -> None:
    dead = DeadLetter("c", Origin(key="k", record_id=RID), "E", "m")
    record = decode_record(encode_record(dead.to_record(RID, 7)))
    assert (record.key, record.timestamp) == ("k", 7)
    assert record.record_id == dead_letter_record_id("c", RID)
    assert decode_dead_letter(record.value) == dead


def test_cause_is_the_record_id_else_the_stream_position() -> None:
    assert Origin(record_id=RID).cause_id() == RID
    assert Origin(stream="s", partition=1, offset=2).cause_id() == injector_record_id("s", 1, 2)
    with pytest.raises(ValueError, match="needs stream, partition and offset"):
        Origin(stream="s").cause_id()


def test_default_stream_name() -> None:
    assert default_dead_letter_stream("counter") == "counter.dead-letters"


def test_a_stream_origin_is_the_origin_of_its_position() -> None:
    made = stream_origin("in", 3, 17)
    assert made == Origin(stream="in", partition=3, offset=17)
    assert hash(made) == hash(Origin(stream="in", partition=3, offset=17))
    assert made.record_id is None
    assert made.key is None
    assert made.timer_tag is None
    assert made.timer_timestamp is None
    assert made.cause_id() == injector_record_id("in", 3, 17)
