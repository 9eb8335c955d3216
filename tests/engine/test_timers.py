import pytest

from millstream.engine.records import timer_identity
from millstream.engine.timers import TimeDomain, Timer, due_bound, due_timers, firing_order

pytestmark = pytest.mark.unit

EVENT, WALL = TimeDomain.EVENT_TIME, TimeDomain.WALL_TIME


@pytest.mark.parametrize(
    ("timestamp", "watermark", "due"), [(9, 10, True), (10, 10, False), (11, 10, False)]
)
def test_event_timers_are_due_strictly_below_the_watermark(
    timestamp: int, watermark: int, due: bool
) -> None:
    assert Timer("k", "t", timestamp, EVENT).is_due(watermark, now=0) is due


@pytest.mark.parametrize(
    ("timestamp", "now", "due"), [(9, 10, True), (10, 10, True), (11, 10, False)]
)
def test_wall_timers_are_due_once_the_clock_reaches_them(
    timestamp: int, now: int, due: bool
) -> None:
    assert Timer("k", "t", timestamp, WALL).is_due(input_low_watermark=0, now=now) is due


@pytest.mark.parametrize("domain", [EVENT, WALL])
def test_the_due_bound_is_the_first_timestamp_that_does_not_fire(domain: TimeDomain) -> None:
    # Stores read the due timers as the index range up to it (excluded).
    bound = due_bound(domain, input_low_watermark=10, now=20)
    assert bound == (10 if domain is EVENT else 21)
    assert Timer("k", "t", bound - 1, domain).is_due(10, now=20)
    assert not Timer("k", "t", bound, domain).is_due(10, now=20)


def test_due_timers_fire_in_timestamp_then_domain_then_tag_order() -> None:
    timers = [
        Timer("k", "late", 30),
        Timer("k", "b", 10),
        Timer("k", "wall", 10, WALL),
        Timer("k", "a", 10),
        Timer("k", "future", 99),
        Timer("k", "wall-future", 99, WALL),
    ]
    due = due_timers(timers, input_low_watermark=50, now=20)
    assert [t.tag for t in due] == ["a", "b", "wall", "late"]
    assert due == sorted(due, key=firing_order)


def test_identity_is_the_record_id_rule_and_depends_on_the_setting() -> None:
    first = Timer("k", "t", 5, set_by=b"x" * 16)
    again = Timer("k", "t", 5, set_by=b"y" * 16)
    assert first.identity == timer_identity("k", "t", 5, b"x" * 16)
    assert first.identity != again.identity
    assert len(first.identity) == 16


@pytest.mark.parametrize(
    "kwargs",
    [{"tag": 1}, {"timestamp": 1.0}, {"timestamp": True}, {"domain": "event_time"}],
)
def test_timer_fields_are_validated(kwargs: dict[str, object]) -> None:
    fields: dict[str, object] = {"key": "k", "tag": "t", "timestamp": 1, "domain": EVENT}
    fields.update(kwargs)
    with pytest.raises(TypeError):
        Timer(**fields)  # type: ignore[arg-type]
