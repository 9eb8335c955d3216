"""The watermark authority: one read of the topic for every computation, and the indexed
interval map that keeps a report's cost at O(log n) however many intervals there are."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from millstream.engine.authority import WatermarkAuthority
from millstream.engine.watermarks import (
    ExpectedSet,
    IntervalMap,
    IntervalProgress,
    WatermarkMessage,
    WatermarkReport,
    computation_watermark,
    injector_source,
)

pytestmark = pytest.mark.unit

_Message = tuple[str, WatermarkMessage | None]

times = st.one_of(st.none(), st.integers(0, 50))
progresses = st.builds(
    IntervalProgress,
    oldest_work=times,
    next_event_timer=times,
    next_wall_timer=times,
    pending=st.integers(0, 2),
)


@settings(max_examples=200, deadline=None)
@given(
    intervals=st.integers(1, 6),
    reports=st.lists(
        st.tuples(st.integers(0, 5), progresses, st.integers(0, 20)), min_size=1, max_size=30
    ),
    watermark=st.integers(0, 60),
    now=st.integers(0, 60),
    percentile=st.sampled_from([50.0, 90.0, 99.0, 100.0]),
)
def test_the_interval_map_answers_as_the_plain_definitions_do(
    intervals: int,
    reports: list[tuple[int, IntervalProgress, int]],
    watermark: int,
    now: int,
    percentile: float,
) -> None:
    indexed = IntervalMap(intervals)
    plain: dict[int, IntervalProgress] = {}
    records: dict[int, int] = {}
    for interval, progress, load in reports:
        interval %= intervals
        indexed.record(interval, progress, records=load)
        plain[interval] = progress
        records[interval] = load

        assert len(indexed) == len(plain)
        assert indexed.complete is (len(plain) == intervals)
        works = [(p.oldest_work, i) for i, p in plain.items() if p.oldest_work is not None]
        assert indexed.oldest_work() == (min(works) if works else None)
        held = computation_watermark(watermark, plain)
        oldest = indexed.oldest_work()
        assert held[0] == min(watermark, oldest[0] if oldest else watermark)
        events = [p.next_event_timer for p in plain.values() if p.next_event_timer is not None]
        assert indexed.next_event_timer() == (min(events) if events else None)
        walls = [p.next_wall_timer for p in plain.values() if p.next_wall_timer is not None]
        assert indexed.next_wall_timer() == (min(walls) if walls else None)
        assert indexed.due(watermark, now) == [
            i for i in range(intervals) if i not in plain or plain[i].needs_run(watermark, now)
        ]
        # The percentile: set aside the oldest work while it carries at most the allowance.
        total = sum(records[i] + 1 for i in plain)
        allowance = total * (100.0 - percentile) / 100.0
        expected, skipped = None, 0.0
        for work, interval_ in sorted(works):
            skipped += records[interval_] + 1
            if skipped > allowance:
                expected = work
                break
        assert indexed.percentile_work(percentile) == expected


def test_a_percentile_sets_aside_a_straggler_that_carries_little_of_the_load() -> None:
    intervals = IntervalMap(100)
    for interval in range(99):
        intervals.record(interval, IntervalProgress(oldest_work=1_000 + interval), records=100)
    intervals.record(99, IntervalProgress(oldest_work=5), records=10)  # the straggler
    assert intervals.oldest_work() == (5, 99)
    assert intervals.percentile_work(100.0) == 5  # the exact watermark's answer
    assert intervals.percentile_work(99.0) == 1_000
    assert intervals.percentile_work(99.999) == 5
    hottest = intervals.hottest(2)
    assert [h.records for h in hottest] == [100, 100]
    assert all(h.oldest_work is not None and h.oldest_work >= 1_000 for h in hottest)


class Topic:
    """The watermark topic as a reader of it sees it: each read returns what came since."""

    def __init__(self) -> None:
        self.messages: list[_Message] = []
        self.read_to = 0
        self.reads = 0
        self.fail_next = False
        self.reconnects = 0

    def read(self, timeout: float = 30.0) -> list[_Message]:
        self.reads += 1
        if self.fail_next:
            self.fail_next = False
            raise TimeoutError("could not read the watermark topic up to its end within 30 s")
        new, self.read_to = self.messages[self.read_to :], len(self.messages)
        return new

    def reconnect(self) -> None:
        self.reconnects += 1


def _report(source: str, watermark: int, sequence: int = 1) -> _Message:
    return source, WatermarkReport(source, ("clicks",), watermark, sequence)


def test_every_subscriber_gets_every_message_once_from_one_reader() -> None:
    topic = Topic()
    authority = WatermarkAuthority(topic)
    count, sessions = authority.subscribe("count"), authority.subscribe("sessions")
    first, second = _report(injector_source("clicks"), 10), _report(injector_source("b"), 20)
    topic.messages += [first, second]
    assert count.read() == [first, second]
    assert topic.reads == 1
    third = _report(injector_source("clicks"), 30, 2)
    topic.messages.append(third)
    # sessions gets what count's read brought in, then the rest: in topic order, once.
    assert sessions.read() == [first, second, third]
    assert count.read() == [third]
    assert count.read() == sessions.read() == []
    assert authority.messages == 3


def test_a_later_subscriber_starts_from_the_compacted_topic() -> None:
    topic = Topic()
    authority = WatermarkAuthority(topic)
    early = authority.subscribe("early")
    clicks = injector_source("clicks")
    expected = ExpectedSet("clicks", ("clicks",), ("0",))
    topic.messages += [_report(clicks, 10), (expected.key, expected), _report(clicks, 20, 2)]
    topic.messages.append((injector_source("gone"), None))
    early.read()
    late = authority.subscribe("late")
    assert late.read() == [
        (expected.key, expected),
        _report(clicks, 20, 2),
        (injector_source("gone"), None),
    ]


def test_a_failed_read_loses_nothing_and_a_reconnect_reaches_the_reader() -> None:
    topic = Topic()
    authority = WatermarkAuthority(topic)
    count = authority.subscribe("count")
    message = _report(injector_source("clicks"), 10)
    topic.messages.append(message)
    topic.fail_next = True
    with pytest.raises(TimeoutError):
        count.read()
    authority.reconnect()
    assert topic.reconnects == 1
    assert count.read() == [message]


def test_a_subscriber_that_does_not_read_has_its_inbox_compacted() -> None:
    topic = Topic()
    authority = WatermarkAuthority(topic, inbox_limit=5)
    busy, idle = authority.subscribe("busy"), authority.subscribe("idle")
    clicks = injector_source("clicks")
    for sequence in range(1, 21):
        topic.messages.append(_report(clicks, sequence * 10, sequence))
        busy.read()
    kept = idle.read()
    # At most the limit, in topic order, ending with the latest: what a reader of the
    # compacted topic could have been given.
    assert len(kept) <= 5
    assert kept[-1] == _report(clicks, 200, 20)
    assert [m.sequence for _, m in kept] == sorted(m.sequence for _, m in kept)  # type: ignore[union-attr]
    idle.close()
    with pytest.raises(KeyError, match="has not subscribed"):
        idle.read()


def test_the_authority_is_a_report_reader_for_the_bookkeeping() -> None:
    from millstream.engine.watermarks import ComputationWatermarks

    topic = Topic()
    authority = WatermarkAuthority(topic)
    clicks = injector_source("clicks")
    bookkeeping: Any = ComputationWatermarks(
        "computation/t/count",
        inputs={"clicks": "clicks"},
        outputs=["counts"],
        expected={"clicks": [clicks]},
        key_intervals=2,
    )
    topic.messages.append(_report(clicks, 100))
    bookkeeping.read(authority.subscribe("computation/t/count"))
    assert bookkeeping.advance({}) == (0, 100)
