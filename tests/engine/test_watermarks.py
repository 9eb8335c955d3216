"""Low watermarks: reports, the input watermark of a consumer, and a driver's bookkeeping.

The central rule (paper 7.2, DESIGN "Low watermarks"): a report is applied only once the
consumer has read its input up to the report's offsets, so it never overtakes the records it
speaks for; and watermarks never move backwards.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from millstream.engine.computation import Computation
from millstream.engine.context import Context
from millstream.engine.errors import MillstreamError, WatermarkReportError
from millstream.engine.records import MAX_EVENT_TIME, MIN_EVENT_TIME, Record
from millstream.engine.topology import ComputationOptions, Topology
from millstream.engine.watermarks import (
    BEHIND,
    REPORT_VERSION,
    ComputationWatermarks,
    ExpectedSet,
    Hold,
    InputWatermark,
    IntervalProgress,
    Offsets,
    WatermarkMessage,
    WatermarkReport,
    computation_source,
    computation_watermark,
    decode_watermark_message,
    injector_group,
    injector_source,
    offsets_reached,
    watermark_overview,
)

pytestmark = pytest.mark.unit

CLICKS = injector_source("clicks")
CLICKS_1 = injector_source("clicks", "1")
VIEWS = injector_source("views")
UPSTREAM = computation_source("topo", "sessionize")
ME = computation_source("topo", "count")


def report(
    source: str = CLICKS,
    watermark: int = 100,
    sequence: int = 1,
    streams: tuple[str, ...] = ("clicks",),
    offsets: Offsets | None = None,
    **extra: Any,
) -> WatermarkReport:
    return WatermarkReport(source, streams, watermark, sequence, offsets or {}, **extra)


def document(**changes: Any) -> bytes:
    """A valid encoded report with top-level fields replaced (``None``: removed)."""
    doc = json.loads(report(offsets={"clicks": {0: 3}}).encode())
    for name, value in changes.items():
        if value is None:
            doc.pop(name)
        else:
            doc[name] = value
    return json.dumps(doc).encode()


# -- reports ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "original",
    [
        report(),
        WatermarkReport(
            UPSTREAM,
            ("sessions", "sessions.dead-letters"),
            MAX_EVENT_TIME,
            2**40,
            {"clicks": {0: 7, 3: 12}, "views": {1: 0}},
            input_watermark=1_234,
            held_by="interval 3",
            behind=((3, 900), (5, 1_100)),
            consumed={"pages": {0: 4, 1: 2}},
            stats={"processed": 9, "fenced_producers": 1},
            driver="d-1",
            workers={"h:12": (0, 3), "h:13": (1,)},
        ),
        report(watermark=MIN_EVENT_TIME, sequence=0, streams=()),
    ],
    ids=["minimal", "full", "empty"],
)
def test_a_report_survives_encoding(original: WatermarkReport) -> None:
    assert WatermarkReport.decode(original.encode()) == original


def test_the_encoding_is_versioned_json_readable_by_any_kafka_tool() -> None:
    encoded = report(offsets={"clicks": {1: 5, 0: 9}}, input_watermark=4).encode()
    assert json.loads(encoded) == {
        "version": REPORT_VERSION,
        "source": CLICKS,
        "streams": ["clicks"],
        "watermark": 100,
        "sequence": 1,
        "offsets": {"clicks": {"0": 9, "1": 5}},
        "held_by": "",
        "input_watermark": 4,
    }
    assert "input_watermark" not in json.loads(report().encode())


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (b"{not json", "JSONDecodeError"),
        (b"\xff\xfe", "not a watermark report"),
        (b"[1, 2]", "not a watermark report"),
        (b"null", "not a watermark report"),
        (document(version=REPORT_VERSION + 1), f"version {REPORT_VERSION + 1} is not"),
        (document(version=None), "version None is not"),
        (document(source=None), "KeyError: 'source'"),
        (document(source=""), "needs a source name"),
        (document(streams=None), "KeyError: 'streams'"),
        (document(streams="clicks"), "expected a list of stream names, got 'clicks'"),
        (document(streams=["clicks", 7]), "expected a list of stream names"),
        (document(watermark=None), "KeyError: 'watermark'"),
        (document(watermark="100"), "expected an integer, got '100'"),
        (document(watermark=True), "expected an integer, got True"),
        (document(watermark=1.5), "expected an integer"),
        (document(watermark=-1), "watermark -1 of 'injector/clicks/0' is outside"),
        (document(watermark=MAX_EVENT_TIME + 1), "is outside"),
        (document(sequence=None), "KeyError: 'sequence'"),
        (document(offsets=[1, 2]), "not a watermark report"),
        (document(offsets={"clicks": {"zero": 3}}), "not a watermark report"),
        (document(offsets={"clicks": {"0": "3"}}), "expected an integer"),
        (document(input_watermark="x"), "expected an integer"),
    ],
)
def test_a_malformed_report_is_refused_saying_why(value: bytes, says: str) -> None:
    with pytest.raises(WatermarkReportError, match=says) as raised:
        WatermarkReport.decode(value)
    assert isinstance(raised.value, MillstreamError)


def test_optional_fields_may_be_missing() -> None:
    decoded = WatermarkReport.decode(document(offsets=None, held_by=None))
    assert (decoded.offsets, decoded.held_by, decoded.input_watermark) == ({}, "", None)


@pytest.mark.parametrize("watermark", [MIN_EVENT_TIME - 1, MAX_EVENT_TIME + 1])
def test_a_report_outside_event_time_cannot_be_made(watermark: int) -> None:
    with pytest.raises(WatermarkReportError, match="outside"):
        report(watermark=watermark)


def test_a_report_needs_a_source() -> None:
    with pytest.raises(WatermarkReportError, match="source"):
        report(source="")


def test_source_names_say_what_reports() -> None:
    assert computation_source("topo", "count") == "computation/topo/count"
    assert injector_source("clicks") == "injector/clicks/0"
    assert injector_source("clicks", "7") == "injector/clicks/7"


# -- offsets ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("consumed", "required", "reached"),
    [
        ({"t": {0: 5}}, {"t": {0: 5}}, True),
        ({"t": {0: 6}}, {"t": {0: 5}}, True),
        ({"t": {0: 4}}, {"t": {0: 5}}, False),
        ({"t": {0: 5, 1: 1}}, {"t": {0: 5, 1: 2}}, False),
        ({"t": {0: 5}}, {"t": {0: 5, 1: 1}}, False),  # an unread partition is at 0
        ({"t": {0: 5}}, {"t": {0: 5, 1: 0}}, True),
        ({}, {"t": {0: 1}}, False),
        ({}, {}, True),
        ({"t": {0: 5}}, {"t": {0: 5}, "elsewhere": {0: 99}}, True),  # not an input topic
    ],
)
def test_offsets_are_reached_partition_by_partition_on_the_given_topics(
    consumed: Offsets, required: Offsets, reached: bool
) -> None:
    assert offsets_reached(consumed, required, ["t"]) is reached


# -- the input watermark ------------------------------------------------------------------


def test_a_report_is_applied_only_once_the_input_reached_its_offsets() -> None:
    watermark = InputWatermark({"clicks": "clicks"})
    watermark.offer(report(watermark=100, offsets={"clicks": {0: 10, 1: 5}}))

    assert watermark.advance({"clicks": {0: 9, 1: 5}}) == MIN_EVENT_TIME
    assert watermark.advance({"clicks": {0: 10, 1: 4}}) == MIN_EVENT_TIME
    assert watermark.advance({"clicks": {0: 10, 1: 5}}) == 100
    assert watermark.current == 100


def test_offsets_are_those_of_the_streams_topics() -> None:
    watermark = InputWatermark({"clicks": "clicks-v2"})
    watermark.offer(report(offsets={"clicks-v2": {0: 3}}))
    assert watermark.advance({"clicks": {0: 3}, "clicks-v2": {0: 2}}) == MIN_EVENT_TIME
    assert watermark.advance({"clicks-v2": {0: 3}}) == 100


def test_offsets_of_topics_the_consumer_does_not_read_are_ignored() -> None:
    watermark = InputWatermark({"clicks": "clicks"})
    watermark.offer(
        report(streams=("clicks", "views"), offsets={"clicks": {0: 1}, "views": {0: 1_000}})
    )
    assert watermark.advance({"clicks": {0: 1}}) == 100


def test_the_latest_reached_report_of_a_source_is_applied() -> None:
    watermark = InputWatermark({"clicks": "clicks"})
    watermark.offer(report(watermark=100, sequence=1, offsets={"clicks": {0: 5}}))
    watermark.offer(report(watermark=200, sequence=2, offsets={"clicks": {0: 10}}))
    watermark.offer(report(watermark=300, sequence=3, offsets={"clicks": {0: 15}}))

    assert watermark.advance({"clicks": {0: 12}}) == 200
    assert watermark.advance({"clicks": {0: 14}}) == 200
    assert watermark.advance({"clicks": {0: 15}}) == 300


def test_the_input_watermark_is_the_minimum_over_a_streams_sources() -> None:
    watermark = InputWatermark({"clicks": "clicks"})
    watermark.offer(report(CLICKS, 100))
    watermark.offer(report(CLICKS_1, 50))
    assert watermark.advance({}) == 50
    assert watermark.explain() == [Hold("clicks", 50, CLICKS_1, "reported")]

    watermark.offer(report(CLICKS_1, 200, sequence=2))
    assert watermark.advance({}) == 100


def test_the_input_watermark_is_the_minimum_over_the_input_streams() -> None:
    watermark = InputWatermark({"clicks": "clicks", "views": "views"})
    watermark.offer(report(CLICKS, 100))
    watermark.offer(report(VIEWS, 70, streams=("views",), held_by="interval 2"))
    assert watermark.advance({}) == 70
    assert watermark.explain() == [
        Hold("views", 70, VIEWS, "interval 2"),
        Hold("clicks", 100, CLICKS, "reported"),
    ]


def test_a_stream_no_source_reports_holds_the_input() -> None:
    watermark = InputWatermark({"clicks": "clicks", "views": "views"})
    watermark.offer(report(CLICKS, 100))
    assert watermark.advance({}) == MIN_EVENT_TIME
    (hold, _) = watermark.explain()
    assert hold == Hold("views", MIN_EVENT_TIME, None, "no source reports this stream")
    assert str(hold) == f"views: {MIN_EVENT_TIME} held by - (no source reports this stream)"


def test_an_expected_source_that_never_reported_holds_the_stream_and_is_named() -> None:
    watermark = InputWatermark({"clicks": "clicks"}, expected={"clicks": [UPSTREAM]})
    watermark.offer(report(CLICKS, 100))
    assert watermark.advance({}) == MIN_EVENT_TIME
    assert watermark.explain() == [Hold("clicks", MIN_EVENT_TIME, UPSTREAM, "no report yet")]

    watermark.offer(report(UPSTREAM, 80, offsets={"clicks": {0: 4}}))
    assert watermark.advance({"clicks": {0: 3}}) == MIN_EVENT_TIME
    (hold,) = watermark.explain()
    assert (hold.source, hold.reason) == (UPSTREAM, "report not yet reached by the input")
    assert UPSTREAM in str(hold)

    assert watermark.advance({"clicks": {0: 4}}) == 80


def test_a_retired_source_holds_nothing_unless_it_is_expected() -> None:
    watermark = InputWatermark({"clicks": "clicks"}, expected={"clicks": [UPSTREAM]})
    watermark.offer(report(CLICKS, 300))
    watermark.offer(report(CLICKS_1, 100))
    watermark.offer(report(UPSTREAM, 200))
    assert watermark.advance({}) == 100

    watermark.forget(CLICKS_1)
    assert watermark.advance({}) == 200
    watermark.forget(UPSTREAM)
    assert watermark.explain() == [Hold("clicks", MIN_EVENT_TIME, UPSTREAM, "no report yet")]
    assert watermark.advance({}) == 200  # never backwards
    watermark.forget("never/heard/of")


def test_a_computation_ignores_its_own_reports_on_its_input() -> None:
    loop = InputWatermark({"clicks": "clicks"}, expected={"clicks": [ME, CLICKS]}, own=ME)
    assert not loop.offer(report(ME, 5))
    loop.offer(report(CLICKS, 100))
    assert loop.advance({}) == 100
    assert [hold.source for hold in loop.explain()] == [CLICKS]


def test_a_report_on_other_streams_is_not_taken() -> None:
    watermark = InputWatermark({"clicks": "clicks"})
    assert not watermark.offer(report(VIEWS, 5, streams=("views",)))
    assert watermark.offer(report(CLICKS, 100))
    assert watermark.advance({}) == 100


def test_an_older_report_of_a_source_is_ignored() -> None:
    watermark = InputWatermark({"clicks": "clicks"})
    watermark.offer(report(watermark=100, sequence=5))
    watermark.offer(report(CLICKS_1, 1_000))
    assert watermark.advance({}) == 100

    # Still pending, but older than what the source said since: never applied.
    watermark.offer(report(watermark=200, sequence=6, offsets={"clicks": {0: 9}}))
    assert watermark.offer(report(watermark=300, sequence=4))
    assert watermark.ignored == 1
    assert watermark.advance({}) == 100
    assert watermark.advance({"clicks": {0: 9}}) == 200


def test_a_lower_later_report_does_not_move_a_source_back() -> None:
    watermark = InputWatermark({"clicks": "clicks", "views": "views"})
    watermark.offer(report(VIEWS, 10, streams=("views",)))
    watermark.offer(report(CLICKS, 100, sequence=1))
    assert watermark.advance({}) == 10

    watermark.offer(report(CLICKS, 50, sequence=2))
    assert watermark.advance({}) == 10
    watermark.offer(report(VIEWS, 300, sequence=2, streams=("views",)))
    # CLICKS still counts as 100, not 50.
    assert watermark.advance({}) == 100
    assert watermark.explain()[0] == Hold("clicks", 100, CLICKS, "reported")


def test_a_pending_report_does_not_speak_for_a_stream_it_adds() -> None:
    watermark = InputWatermark({"clicks": "clicks", "views": "views"})
    watermark.offer(report(CLICKS, 100, sequence=1))
    assert watermark.advance({}) == MIN_EVENT_TIME
    watermark.offer(
        report(CLICKS, 200, sequence=2, streams=("clicks", "views"), offsets={"views": {0: 5}})
    )
    # The source's views records before offset 5 are not read yet: views stays unreported.
    assert watermark.advance({"views": {0: 4}}) == MIN_EVENT_TIME
    assert watermark.explain()[0] == Hold(
        "views", MIN_EVENT_TIME, None, "no source reports this stream"
    )
    assert watermark.advance({"views": {0: 5}}) == 200


def test_a_source_promises_for_a_new_stream_only_what_its_report_says() -> None:
    watermark = InputWatermark({"clicks": "clicks", "views": "views"})
    watermark.offer(report(CLICKS, 100, sequence=1))
    watermark.advance({})
    watermark.offer(report(CLICKS, 50, sequence=2, streams=("clicks", "views")))
    assert watermark.advance({}) == 50
    assert watermark.explain() == [
        Hold("views", 50, CLICKS, "reported"),
        Hold("clicks", 100, CLICKS, "reported"),
    ]


def test_a_stream_a_source_no_longer_reports_is_no_longer_held_by_it() -> None:
    watermark = InputWatermark({"clicks": "clicks", "views": "views"})
    watermark.offer(report(CLICKS, 100, sequence=1, streams=("clicks", "views")))
    watermark.offer(report(VIEWS, 150, streams=("views",)))
    assert watermark.advance({}) == 100
    watermark.offer(report(CLICKS, 200, sequence=2, streams=("clicks",)))
    assert watermark.advance({}) == 150
    assert [hold.source for hold in watermark.explain()] == [VIEWS, CLICKS]


def test_an_expected_source_holds_each_stream_it_has_not_reported() -> None:
    watermark = InputWatermark(
        {"clicks": "clicks", "views": "views"},
        expected={"clicks": [UPSTREAM], "views": [UPSTREAM]},
    )
    watermark.offer(report(UPSTREAM, 100, streams=("clicks",)))
    watermark.offer(report(VIEWS, 150, streams=("views",)))
    assert watermark.advance({}) == MIN_EVENT_TIME
    assert watermark.explain()[0] == Hold("views", MIN_EVENT_TIME, UPSTREAM, "no report yet")


def test_the_input_watermark_never_moves_back_and_starts_at_its_floor() -> None:
    watermark = InputWatermark({"clicks": "clicks"}, floor=500)
    assert watermark.current == 500
    watermark.offer(report(CLICKS, 100))
    assert watermark.advance({}) == 500
    watermark.raise_floor(600)
    watermark.raise_floor(100)
    assert watermark.current == 600
    watermark.offer(report(CLICKS, 700, sequence=2))
    assert watermark.advance({}) == 700


# -- key intervals and a computation's own watermark --------------------------------------


@pytest.mark.parametrize(
    ("progress", "watermark", "now", "needs_run"),
    [
        (IntervalProgress(), MAX_EVENT_TIME, 10**18, False),
        (IntervalProgress(oldest_work=5), MAX_EVENT_TIME, 10**18, False),
        (IntervalProgress(next_event_timer=50), 50, 0, False),  # due when t < watermark
        (IntervalProgress(next_event_timer=50), 51, 0, True),
        (IntervalProgress(next_wall_timer=1_000), 0, 999, False),
        (IntervalProgress(next_wall_timer=1_000), 0, 1_000, True),  # due when t <= now
        (IntervalProgress(pending=1), MIN_EVENT_TIME, 0, True),  # a resend
    ],
)
def test_an_interval_needs_a_run_for_due_timers_and_resends(
    progress: IntervalProgress, watermark: int, now: int, needs_run: bool
) -> None:
    assert progress.needs_run(watermark, now) is needs_run


def test_a_computations_watermark_is_held_by_its_oldest_work() -> None:
    assert computation_watermark(100, {}) == (100, "input")
    intervals = {
        0: IntervalProgress(),
        1: IntervalProgress(oldest_work=70),
        2: IntervalProgress(oldest_work=40, next_event_timer=40),
        3: IntervalProgress(oldest_work=40),
        4: IntervalProgress(oldest_work=150),
    }
    assert computation_watermark(100, intervals) == (40, "interval 2")
    assert computation_watermark(30, intervals) == (30, "input")
    assert computation_watermark(40, intervals) == (40, "input")


@dataclass
class FakeReader:
    """What a ``KafkaWatermarkTopic`` would return, one list per ``read()``."""

    batches: list[list[tuple[str, WatermarkMessage | None]]] = field(default_factory=list)

    def read(self, timeout: float = 30.0) -> list[tuple[str, WatermarkMessage | None]]:
        return self.batches.pop(0) if self.batches else []


def driver(key_intervals: int = 3) -> ComputationWatermarks:
    return ComputationWatermarks(
        ME,
        inputs={"clicks": "clicks"},
        outputs=["counts"],
        expected={"clicks": [CLICKS]},
        key_intervals=key_intervals,
    )


def idle(bookkeeping: ComputationWatermarks, **progress: IntervalProgress) -> None:
    for interval in range(bookkeeping.key_intervals):
        bookkeeping.record(interval, progress.get(f"i{interval}", IntervalProgress()))


def test_a_report_says_how_far_the_inputs_were_read_and_goes_out_when_that_moved() -> None:
    bookkeeping = driver()
    bookkeeping.read(FakeReader([[(CLICKS, report(CLICKS, 100))]]))
    # Only the input topics count: a wake-up topic read in the same batch is not a stream.
    bookkeeping.advance({"clicks": {0: 5, 1: 2}, "millstream.watermarks.wake.clicks": {0: 9}})
    idle(bookkeeping)
    first = bookkeeping.report(1, {"counts": {0: 1}})
    assert first is not None
    assert first.consumed == {"clicks": {0: 5, 1: 2}}
    assert json.loads(first.encode())["consumed"] == {"clicks": {"0": 5, "1": 2}}
    # The watermark stays; the input was read further: a report says so (the view's lag).
    bookkeeping.advance({"clicks": {0: 7}})
    idle(bookkeeping)
    second = bookkeeping.report(2, {"counts": {0: 1}})
    assert second is not None
    assert second.watermark == first.watermark
    assert second.consumed == {"clicks": {0: 7, 1: 2}}
    idle(bookkeeping)
    assert bookkeeping.report(3, {"counts": {0: 1}}) is None
    # New counters of the driver (for the live view) are news too, and go in as they are.
    counted = bookkeeping.report(4, {"counts": {0: 1}}, stats={"processed": 3}, driver="d")
    assert counted is not None
    assert (counted.stats, counted.driver) == ({"processed": 3}, "d")
    assert json.loads(counted.encode())["stats"] == {"processed": 3}
    assert bookkeeping.report(5, {"counts": {0: 1}}, stats={"processed": 3}, driver="d") is None
    # Who ran each interval last, grouped by worker; a new owner is news.
    for interval, worker in ((0, "h:1"), (2, "h:1"), (1, "h:2")):
        bookkeeping.record(interval, IntervalProgress(), worker=worker)
    owned = bookkeeping.report(6, {"counts": {0: 1}}, stats={"processed": 3}, driver="d")
    assert owned is not None
    assert owned.workers == {"h:1": (0, 2), "h:2": (1,)}
    assert json.loads(owned.encode())["workers"] == {"h:1": [0, 2], "h:2": [1]}


def test_the_first_report_waits_until_every_interval_ran() -> None:
    bookkeeping = driver()
    bookkeeping.read(FakeReader([[(CLICKS, report(CLICKS, 100))]]))
    assert bookkeeping.advance({}) == (MIN_EVENT_TIME, 100)

    bookkeeping.record(0, IntervalProgress())
    bookkeeping.record(2, IntervalProgress())
    assert bookkeeping.report(1, {"counts": {0: 1}}) is None
    bookkeeping.record(1, IntervalProgress(oldest_work=60))
    assert bookkeeping.report(2, {"counts": {0: 2}}) == WatermarkReport(
        ME,
        ("counts",),
        60,
        2,
        {"counts": {0: 2}},
        input_watermark=100,
        held_by="interval 1",
        behind=((1, 60),),
    )
    assert (bookkeeping.watermark, bookkeeping.held_by) == (60, "interval 1")


def test_a_report_names_the_intervals_behind_the_input_with_their_own_watermarks() -> None:
    bookkeeping = driver(key_intervals=4)
    bookkeeping.read(FakeReader([[(CLICKS, report(CLICKS, 100))]]))
    bookkeeping.advance({})
    idle(
        bookkeeping,
        i0=IntervalProgress(oldest_work=90),
        i1=IntervalProgress(oldest_work=150),  # ahead of the input: at the input's watermark
        i3=IntervalProgress(oldest_work=20),
    )
    first = bookkeeping.report(1, {})
    assert first is not None
    assert first.behind == ((3, 20), (0, 90))
    assert json.loads(first.encode())["behind"] == [[3, 20], [0, 90]]
    # Interval 3 caught up: the report says so although the watermark (held by 0) moved too.
    idle(bookkeeping, i0=IntervalProgress(oldest_work=90))
    second = bookkeeping.report(2, {})
    assert second is not None
    assert (second.watermark, second.behind) == (90, ((0, 90),))


def test_a_report_names_the_lowest_intervals_behind_up_to_a_bound() -> None:
    bookkeeping = driver(key_intervals=BEHIND + 4)
    bookkeeping.read(FakeReader([[(CLICKS, report(CLICKS, 1_000))]]))
    bookkeeping.advance({})
    idle(bookkeeping, **{f"i{i}": IntervalProgress(oldest_work=500 - i) for i in range(BEHIND + 4)})
    first = bookkeeping.report(1, {})
    assert first is not None
    assert first.behind == tuple((i, 500 - i) for i in range(BEHIND + 3, 3, -1))


def test_a_report_is_made_only_when_something_changed() -> None:
    bookkeeping = driver(key_intervals=1)
    bookkeeping.read(FakeReader([[(CLICKS, report(CLICKS, 100))]]))
    bookkeeping.advance({})
    idle(bookkeeping, i0=IntervalProgress(oldest_work=60))
    assert bookkeeping.report(1, {}) is not None
    assert bookkeeping.report(2, {}) is None

    # The input moved but the interval still holds the output: the input watermark is news.
    bookkeeping.read(FakeReader([[(CLICKS, report(CLICKS, 200, sequence=2))]]))
    bookkeeping.advance({})
    moved = bookkeeping.report(3, {})
    assert moved is not None
    assert (moved.watermark, moved.input_watermark) == (60, 200)

    idle(bookkeeping)
    done = bookkeeping.report(4, {})
    assert done is not None
    assert (done.watermark, done.held_by, done.sequence) == (200, "input", 4)
    assert bookkeeping.report(5, {}) is None


def test_a_late_production_does_not_move_the_reported_watermark_back() -> None:
    bookkeeping = driver(key_intervals=1)
    bookkeeping.read(FakeReader([[(CLICKS, report(CLICKS, 100))]]))
    bookkeeping.advance({})
    idle(bookkeeping)
    assert bookkeeping.watermark == MIN_EVENT_TIME
    assert bookkeeping.report(1, {}) is not None
    idle(bookkeeping, i0=IntervalProgress(oldest_work=20, pending=1))
    assert bookkeeping.report(2, {}) is None
    assert bookkeeping.watermark == 100


def test_its_own_last_report_restores_a_restarted_computation() -> None:
    before = report(ME, 400, sequence=9, streams=("counts",), input_watermark=500)
    bookkeeping = driver(key_intervals=2)
    bookkeeping.read(FakeReader([[(ME, before), (CLICKS, report(CLICKS, 100))]]))
    assert bookkeeping.advance({}) == (500, 500)
    assert bookkeeping.watermark == 400

    idle(bookkeeping, i1=IntervalProgress(oldest_work=100))
    restored = bookkeeping.report(10, {})
    assert restored is not None
    assert (restored.watermark, restored.input_watermark) == (400, 500)


def test_a_tombstone_forgets_a_source() -> None:
    bookkeeping = ComputationWatermarks(
        ME, inputs={"clicks": "clicks"}, outputs=["counts"], expected={}, key_intervals=1
    )
    reader = FakeReader(
        [
            [(CLICKS, report(CLICKS, 300)), (CLICKS_1, report(CLICKS_1, 100))],
            [(CLICKS_1, None)],
        ]
    )
    bookkeeping.read(reader)
    assert bookkeeping.advance({}) == (MIN_EVENT_TIME, 100)
    bookkeeping.read(reader)
    assert bookkeeping.advance({}) == (100, 300)


def test_reports_wait_for_the_offsets_the_batch_consumes() -> None:
    bookkeeping = driver(key_intervals=1)
    bookkeeping.read(FakeReader([[(CLICKS, report(CLICKS, 100, offsets={"clicks": {0: 8}}))]]))
    assert bookkeeping.advance({"clicks": {0: 5}}) == (MIN_EVENT_TIME, MIN_EVENT_TIME)
    assert bookkeeping.advance({"clicks": {0: 8}}) == (MIN_EVENT_TIME, 100)


def test_intervals_run_without_input_when_unknown_or_with_due_work() -> None:
    bookkeeping = driver(key_intervals=4)
    assert bookkeeping.intervals_to_run(MIN_EVENT_TIME, 0) == [0, 1, 2, 3]
    bookkeeping.record(3, IntervalProgress())
    assert bookkeeping.intervals_to_run(MIN_EVENT_TIME, 0) == [0, 1, 2]

    bookkeeping.record(0, IntervalProgress(oldest_work=50, next_event_timer=50))
    bookkeeping.record(1, IntervalProgress(next_wall_timer=1_000))
    bookkeeping.record(2, IntervalProgress(oldest_work=5, pending=2))
    assert bookkeeping.intervals_to_run(50, 999) == [2]
    assert bookkeeping.intervals_to_run(51, 999) == [0, 2]
    assert bookkeeping.intervals_to_run(51, 1_000) == [0, 1, 2]


# -- properties ---------------------------------------------------------------------------

SOURCES = ("a", "b", "own")
STREAMS = ("s1", "s2")  # read by the consumer
ALL_STREAMS = (*STREAMS, "s3")  # s3 is not


@st.composite
def offsets_strategy(draw: st.DrawFn) -> dict[str, dict[int, int]]:
    return {
        topic: draw(st.dictionaries(st.integers(0, 1), st.integers(0, 3), max_size=2))
        for topic in draw(st.lists(st.sampled_from(ALL_STREAMS), unique=True, max_size=3))
    }


consumed_strategy = st.fixed_dictionaries(
    {
        topic: st.fixed_dictionaries({0: st.integers(0, 3), 1: st.integers(0, 3)})
        for topic in STREAMS
    }
)
reports_strategy = st.builds(
    WatermarkReport,
    source=st.sampled_from(SOURCES),
    streams=st.lists(st.sampled_from(ALL_STREAMS), min_size=1, unique=True).map(tuple),
    watermark=st.integers(0, 30),
    sequence=st.integers(0, 3),
    offsets=offsets_strategy(),
)
steps_strategy = st.lists(
    st.one_of(
        st.tuples(st.just("offer"), reports_strategy),
        st.tuples(st.just("advance"), offsets_strategy() | consumed_strategy),
    ),
    max_size=20,
)


@settings(max_examples=100, deadline=None)
@given(steps=steps_strategy, floor=st.integers(0, 10))
def test_the_input_watermark_is_monotone_and_bounded_by_applicable_reports(
    steps: list[tuple[str, Any]], floor: int
) -> None:
    """Whatever the order of reports and consumption, the input watermark never decreases
    and never exceeds the minimum over input streams of the highest report on it that is
    applicable: from another source, not older than that source's latest, and reached by
    what was consumed after it was offered."""
    watermark = InputWatermark({s: s for s in STREAMS}, own="own", floor=floor)
    latest_sequence: dict[str, int] = {}
    waiting: list[WatermarkReport] = []
    applicable: list[WatermarkReport] = []
    previous = watermark.current
    for kind, value in steps:
        if kind == "offer":
            watermark.offer(value)
            relevant = value.source != "own" and set(value.streams) & set(STREAMS)
            if relevant and value.sequence >= latest_sequence.get(value.source, -1):
                latest_sequence[value.source] = value.sequence
                waiting.append(value)
            continue
        current = watermark.advance(value)
        applicable += [r for r in waiting if offsets_reached(value, r.offsets, STREAMS)]
        bound = min(
            max(
                (r.watermark for r in applicable if stream in r.streams),
                default=MIN_EVENT_TIME,
            )
            for stream in STREAMS
        )
        assert previous <= current <= max(floor, bound)
        assert current == watermark.current
        previous = current


@st.composite
def orderly_history(draw: st.DrawFn) -> list[tuple[str, Any]]:
    """Sources that behave: sequences, offsets and watermarks only grow; consumption too.
    Each report names some of its source's streams (a source may start or stop writing one)."""
    streams_of = {"a": ("s1",), "b": ("s1", "s2"), "c": ("s2", "s3")}
    position = {source: {"s1": 0, "s2": 0, "s3": 0} for source in streams_of}
    level = dict.fromkeys(streams_of, 0)
    written = {"s1": 0, "s2": 0, "s3": 0}
    consumed = {"s1": 0, "s2": 0}
    steps: list[tuple[str, Any]] = []
    for sequence in range(draw(st.integers(0, 25))):
        if draw(st.booleans()):
            source = draw(st.sampled_from(sorted(streams_of)))
            streams = tuple(sorted(draw(st.sets(st.sampled_from(streams_of[source]), min_size=1))))
            for stream in streams:
                written[stream] += draw(st.integers(0, 3))
                position[source][stream] = written[stream]
            level[source] += draw(st.integers(0, 20))
            offsets = {s: {0: position[source][s]} for s in streams}
            steps.append(("offer", report(source, level[source], sequence, streams, offsets)))
        else:
            for stream in consumed:
                consumed[stream] = draw(st.integers(consumed[stream], written[stream]))
            steps.append(("advance", {s: {0: o} for s, o in consumed.items()}))
    return steps


@settings(max_examples=100, deadline=None)
@given(steps=orderly_history())
def test_with_orderly_sources_the_input_watermark_is_the_min_of_what_was_reached(
    steps: list[tuple[str, Any]],
) -> None:
    """A model: per source its latest reached report on the inputs, for the streams it
    names; per stream the lowest source, with the expected source ``a`` holding ``s1`` until
    reached; over streams the lowest; and never below what it was."""
    watermark = InputWatermark({"s1": "s1", "s2": "s2"}, expected={"s1": ["a"]})
    offered: list[WatermarkReport] = []
    reached: dict[str, WatermarkReport] = {}
    expected = MIN_EVENT_TIME
    for kind, value in steps:
        if kind == "offer":
            if watermark.offer(value):
                offered.append(value)
            continue
        for candidate in offered:
            if offsets_reached(value, candidate.offsets, STREAMS):
                reached[candidate.source] = candidate
        per_stream: Mapping[str, list[int]] = {
            stream: [r.watermark for r in reached.values() if stream in r.streams]
            + ([MIN_EVENT_TIME] if stream == "s1" and "a" not in reached else [])
            for stream in STREAMS
        }
        lowest = min(min(values, default=MIN_EVENT_TIME) for values in per_stream.values())
        # A source that joins behind the others does not move the input back.
        expected = max(expected, lowest)
        assert watermark.advance(value) == expected


def test_a_computations_bookkeeping_expects_its_producers_and_reports_its_outputs() -> None:
    class Nothing(Computation):
        def process_record(self, ctx: Context, record: Record) -> None:
            pass

    topology = Topology("t", streams=["clicks"])
    topology.add_computation("a", Nothing(), inputs=["clicks"], outputs=["sessions"])
    topology.add_computation(
        "b",
        Nothing(),
        inputs=["clicks", "sessions"],
        outputs=["totals"],
        options=ComputationOptions(key_intervals=3),
    )
    state = ComputationWatermarks.of(topology, topology.computations["b"], lambda s: f"k.{s}")
    assert state.source == computation_source("t", "b")
    assert state.outputs == ("totals", topology.computations["b"].dead_letter_stream)
    assert state.key_intervals == 3
    assert state.input.streams == {"clicks": "k.clicks", "sessions": "k.sessions"}
    assert state.input.expected == {
        "clicks": frozenset(),
        "sessions": frozenset({computation_source("t", "a")}),
    }


# -- expected sets of injector processes (paper 5.2) ----------------------------------------

CLICKS_SET = ExpectedSet("clicks", ("clicks",), ("0", "1"))


def test_an_expected_set_round_trips_and_is_told_from_a_report() -> None:
    assert decode_watermark_message(CLICKS_SET.encode()) == CLICKS_SET
    assert decode_watermark_message(report().encode()) == report()
    assert CLICKS_SET.key == injector_group("clicks") == "injector/clicks"
    assert CLICKS_SET.sources == {CLICKS, CLICKS_1}
    with pytest.raises(WatermarkReportError, match="unknown watermark message kind"):
        decode_watermark_message(b'{"kind": "gossip"}')
    with pytest.raises(WatermarkReportError, match="not an expected set"):
        decode_watermark_message(b'{"kind": "expected", "version": 1, "injector": "x"}')
    with pytest.raises(WatermarkReportError, match="not a watermark message"):
        decode_watermark_message(b"\xff")


@pytest.mark.parametrize(
    ("injector", "processes", "retired", "message"),
    [
        ("", ("0",), (), "non-empty"),
        ("a/b", ("0",), (), "contain no '/'"),
        ("clicks", (), (), "names no process"),
        ("clicks", ("0/1",), (), "contain no '/'"),
        ("clicks", ("0",), ("0",), "both expected and retired"),
    ],
)
def test_a_malformed_expected_set_is_refused(
    injector: str, processes: tuple[str, ...], retired: tuple[str, ...], message: str
) -> None:
    with pytest.raises(WatermarkReportError, match=message):
        ExpectedSet(injector, ("clicks",), processes, retired)


def test_an_expected_process_that_never_reported_holds_the_stream() -> None:
    watermark = InputWatermark({"clicks": "clicks"})
    watermark.declare(CLICKS_SET)
    watermark.offer(report(CLICKS, 300))
    assert watermark.advance({}) == MIN_EVENT_TIME
    assert watermark.explain() == [Hold("clicks", MIN_EVENT_TIME, CLICKS_1, "no report yet")]

    watermark.offer(report(CLICKS_1, 200))
    assert watermark.advance({}) == 200
    # Silent from now on: process 1 holds the stream at its last report.
    watermark.offer(report(CLICKS, 900, sequence=2))
    assert watermark.advance({}) == 200


def test_a_retired_process_holds_nothing_and_is_ignored_for_good() -> None:
    watermark = InputWatermark({"clicks": "clicks"})
    watermark.declare(CLICKS_SET)
    watermark.offer(report(CLICKS, 300))
    watermark.offer(report(CLICKS_1, 200))
    assert watermark.advance({}) == 200

    watermark.declare(CLICKS_SET.retire("1"))
    assert watermark.advance({}) == 300
    # A zombie of the retired process reporting again changes nothing.
    watermark.offer(report(CLICKS_1, 250, sequence=7))
    assert watermark.advance({}) == 300
    assert watermark.ignored == 1
    with pytest.raises(WatermarkReportError, match="not expected"):
        CLICKS_SET.retire("7")


def test_the_driver_reads_expected_sets_and_their_tombstones() -> None:
    bookkeeping = ComputationWatermarks(
        ME, inputs={"clicks": "clicks"}, outputs=["counts"], expected={}, key_intervals=1
    )
    reader = FakeReader(
        [
            [(CLICKS_SET.key, CLICKS_SET), (CLICKS, report(CLICKS, 300))],
            [(CLICKS_SET.key, None)],
        ]
    )
    bookkeeping.read(reader)
    assert bookkeeping.advance({}) == (MIN_EVENT_TIME, MIN_EVENT_TIME)
    bookkeeping.read(reader)
    assert bookkeeping.advance({}) == (MIN_EVENT_TIME, 300)


def test_the_overview_lists_latest_reports_and_silent_expected_processes() -> None:
    upstream = report(UPSTREAM, 500, streams=("sessions",), held_by="interval 2")
    messages: list[tuple[str, WatermarkMessage | None]] = [
        (CLICKS_SET.key, ExpectedSet("clicks", ("clicks",), ("0", "1", "2"))),
        (CLICKS, report(CLICKS, 100)),
        (CLICKS, report(CLICKS, 300, sequence=2)),
        (CLICKS, report(CLICKS, 200, sequence=1)),  # older, read later: ignored
        (UPSTREAM, upstream),
        (VIEWS, report(VIEWS, 50, streams=("views",))),
        (VIEWS, None),  # retired
        (CLICKS_SET.key, ExpectedSet("clicks", ("clicks",), ("0", "1"), ("2",))),
    ]
    rows = watermark_overview(messages, now=1_000)
    assert [(r.source, r.state, r.watermark, r.lag, r.held_by) for r in rows] == [
        (CLICKS_1, "no report yet", None, None, "expected, never reported: holds"),
        (CLICKS, "reporting", 300, 700, "reported"),
        (UPSTREAM, "reporting", 500, 500, "interval 2"),
    ]


def test_the_overview_shows_an_ended_input_as_complete_without_lag() -> None:
    ended = report(UPSTREAM, MAX_EVENT_TIME, streams=("sessions",), held_by="input")
    (row,) = watermark_overview([(UPSTREAM, ended)], now=1_800_000_000_000_000)
    assert (row.state, row.watermark, row.lag) == ("complete", MAX_EVENT_TIME, None)


def test_the_overview_shows_a_source_at_the_beginning_of_time_as_no_report_yet() -> None:
    # An injector's first report, and a computation's whose input has reported nothing yet.
    first = report(CLICKS, MIN_EVENT_TIME)
    waiting = report(UPSTREAM, MIN_EVENT_TIME, streams=("sessions",), held_by="input")
    rows = watermark_overview([(CLICKS, first), (UPSTREAM, waiting)], now=1_800_000_000_000_000)
    assert [(r.source, r.state, r.watermark, r.lag, r.held_by) for r in rows] == [
        (UPSTREAM, "no report yet", None, None, "input"),
        (CLICKS, "no report yet", None, None, "reported"),
    ]


def test_a_watermark_ahead_of_the_wall_clock_has_no_lag() -> None:
    (row,) = watermark_overview([(CLICKS, report(CLICKS, 2_000))], now=1_000)
    assert (row.state, row.watermark, row.lag) == ("reporting", 2_000, 0)


# -- percentile watermarks (paper 7.2) ----------------------------------------------------


def _percentile_input(**extra: Any) -> InputWatermark:
    return InputWatermark({"clicks": "clicks"}, percentiles=(99.0,), **extra)


def test_a_percentile_sets_aside_a_straggler_that_writes_few_of_the_records() -> None:
    straggler = injector_source("clicks", "late")
    watermarks = _percentile_input()
    watermarks.offer(report(CLICKS, 500, records=1_000))
    watermarks.offer(report(CLICKS_1, 600, records=1_000))
    watermarks.offer(report(straggler, 10, records=5))
    assert watermarks.advance({}) == 10  # the exact watermark waits for the straggler
    assert watermarks.percentile(99.0) == 500
    # Once the straggler writes more than 1 % of the records, it holds the percentile too.
    watermarks.offer(report(straggler, 20, sequence=2, records=100))
    watermarks.advance({})
    assert watermarks.percentile(99.0) == 500  # never back
    watermarks.offer(report(CLICKS, 700, sequence=2, records=1_000))
    watermarks.advance({})
    assert watermarks.percentile(99.0) == 500  # held at the most it said: the straggler weighs in
    watermarks.offer(report(straggler, 650, sequence=3, records=100))
    watermarks.advance({})
    assert (watermarks.current, watermarks.percentile(99.0)) == (600, 600)


def test_an_expected_source_that_never_reported_holds_the_percentile_too() -> None:
    watermarks = _percentile_input(expected={"clicks": [UPSTREAM]})
    watermarks.offer(report(CLICKS, 500, records=1_000_000))
    watermarks.advance({})
    assert watermarks.percentile(99.0) == MIN_EVENT_TIME
    # A producing computation's own percentile watermark counts for it.
    watermarks.offer(report(UPSTREAM, 100, percentiles={99.0: 450}, records=1_000_000))
    watermarks.advance({})
    assert (watermarks.current, watermarks.percentile(99.0)) == (100, 450)


def test_a_percentile_report_waits_for_its_offsets_like_the_exact_one() -> None:
    watermarks = _percentile_input()
    watermarks.offer(report(CLICKS, 500, offsets={"clicks": {0: 10}}, percentiles={99.0: 900}))
    watermarks.advance({"clicks": {0: 9}})
    assert watermarks.percentile(99.0) == MIN_EVENT_TIME
    watermarks.advance({"clicks": {0: 10}})
    assert (watermarks.current, watermarks.percentile(99.0)) == (500, 900)


def test_a_report_carries_its_percentiles_records_and_timer_watermark() -> None:
    full = report(UPSTREAM, 100, percentiles={99.0: 450, 99.9: 300}, records=7, timer_watermark=420)
    assert WatermarkReport.decode(full.encode()) == full
    assert b"percentiles" not in report().encode()  # nothing said when nothing is asked
    with pytest.raises(WatermarkReportError, match="percentile"):
        report(percentiles={100.0: 5})
    bad = json.loads(full.encode())
    bad["percentiles"] = {"0": 5}
    with pytest.raises(WatermarkReportError, match="not a watermark report"):
        WatermarkReport.decode(json.dumps(bad).encode())


class Windows(Computation):
    def process_record(self, ctx: Context, record: Record) -> None:
        ctx.set_timer("end", record.timestamp)


def _percentile_topology() -> Topology:
    topology = Topology("topo", streams=["clicks"])
    topology.add_computation(
        "sessionize",
        Windows(),
        inputs=["clicks"],
        outputs=["sessions"],
        options=ComputationOptions(key_intervals=2),
    )
    topology.add_computation(
        "count",
        Windows(),
        inputs=["sessions"],
        outputs=["counts"],
        options=ComputationOptions(key_intervals=2, watermark_percentile=99.0),
    )
    return topology


def test_a_computation_that_opts_in_runs_under_its_percentile_and_reports_both() -> None:
    topology = _percentile_topology()
    upstream = ComputationWatermarks.of(topology, topology.computations["sessionize"])
    downstream = ComputationWatermarks.of(topology, topology.computations["count"])
    # The producer reports the percentile its consumer chose; the consumer none (no consumer).
    assert (upstream.percentiles, upstream.timer_percentile) == ((99.0,), None)
    assert (downstream.percentiles, downstream.timer_percentile) == ((), 99.0)

    upstream.read(FakeReader([[(CLICKS, report(CLICKS, 1_000, records=100))]]))
    assert upstream.advance({}) == (MIN_EVENT_TIME, 1_000)
    # Interval 0 is a straggler with little load; interval 1 carries the records.
    upstream.record(0, IntervalProgress(oldest_work=50), records=0)
    upstream.record(1, IntervalProgress(oldest_work=900), records=500)
    said = upstream.report(1, {"sessions": {0: 3}})
    assert said is not None
    assert (said.watermark, said.percentiles, said.records) == (50, {99.0: 900}, 500)

    downstream.read(FakeReader([[(UPSTREAM, said)]]))
    assert downstream.advance({"sessions": {0: 3}}) == (MIN_EVENT_TIME, 900)
    assert downstream.input.current == 50  # the exact one, still kept
    downstream.record(0, IntervalProgress())
    downstream.record(1, IntervalProgress())
    own = downstream.report(4, {})
    assert own is not None
    assert (own.input_watermark, own.timer_watermark) == (50, 900)

    # A restart never runs the timers under less than it said.
    restarted = ComputationWatermarks.of(topology, topology.computations["count"])
    restarted.read(FakeReader([[(ME, own)]]))
    assert restarted.timer_watermark == 900
