"""The live view's snapshots from observations, without services: the graph's edges, lag and
backlog, rates, health, what holds a watermark, and the timeline."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from millstream.engine.records import MAX_EVENT_TIME
from millstream.engine.watermarks import ExpectedSet, WatermarkMessage, WatermarkReport
from millstream.ui.snapshot import Observation, Tracker

pytestmark = pytest.mark.unit

S = 1_000_000
NOW = 1_700_000_000 * S
COUNT = "computation/t/count"
SUM = "computation/t/sum"


def injector(watermark: int, process: str = "0") -> WatermarkReport:
    return WatermarkReport(f"injector/feed/{process}", ("in",), watermark, 1)


def computation(
    source: str,
    outputs: tuple[str, ...],
    watermark: int,
    consumed: Mapping[str, Mapping[int, int]],
    held_by: str = "input",
) -> WatermarkReport:
    return WatermarkReport(
        source, outputs, watermark, 1, held_by=held_by, consumed=consumed, input_watermark=watermark
    )


def observe(
    now: int, *reports: WatermarkMessage, ends: Mapping[str, Mapping[int, int]]
) -> Observation:
    return Observation(
        now,
        {r.source if isinstance(r, WatermarkReport) else r.key: r for r in reports},
        ends,
    )


def pipeline(now: int, consumed: int, watermark: int) -> Observation:
    """feed -> in -> count -> mid -> sum -> out."""
    return observe(
        now,
        injector(watermark),
        computation(COUNT, ("mid",), watermark, {"in": {0: consumed, 1: 4}}),
        computation(SUM, ("out",), watermark, {"mid": {0: 2}}),
        ends={"in": {0: 10, 1: 4}, "mid": {0: 2}, "out": {0: 1}},
    )


def test_the_graph_follows_the_streams_from_the_injector_to_the_last_computation() -> None:
    snapshot = Tracker().update(pipeline(NOW, 5, NOW - 60 * S))
    edges = {(e["from"], e["to"]) for e in snapshot["edges"]}
    assert edges == {
        ("injector/feed", "stream/in"),
        ("stream/in", COUNT),
        (COUNT, "stream/mid"),
        ("stream/mid", SUM),
        (SUM, "stream/out"),
    }
    nodes = {n["id"]: n for n in snapshot["nodes"]}
    assert nodes[COUNT]["lag_s"] == 60.0
    assert nodes[COUNT]["backlog"] == 5  # 10 - 5 on partition 0, nothing on 1
    assert nodes[COUNT]["behind"] == {"stream": "in", "partition": 0, "records": 5}
    assert nodes[SUM]["behind"] is None
    assert nodes[SUM]["backlog"] == 0
    stream = next(s for s in snapshot["streams"] if s["name"] == "in")
    assert stream["writers"] == ["injector/feed"]
    assert stream["consumers"] == [
        {
            "computation": COUNT,
            "lag": 5,
            "partitions": {"0": 5, "1": 0},
            "lag_s": 60.0,
            "trend": [60.0],
        }
    ]
    assert snapshot["headline"]["kafka_lag"] == 5
    # Freshness is the output's: sum writes the stream nothing reads.
    assert snapshot["headline"]["freshness_s"] == 60.0


def test_rates_come_from_two_observations() -> None:
    tracker = Tracker()
    first = tracker.update(pipeline(NOW, 5, NOW - 60 * S))
    assert next(n for n in first["nodes"] if n["id"] == COUNT)["in_rate"] is None
    second = pipeline(NOW + 2 * S, 8, NOW - 59 * S)
    second = Observation(second.now, second.messages, {**second.ends, "in": {0: 16, 1: 4}})
    snapshot = tracker.update(second)
    assert next(n for n in snapshot["nodes"] if n["id"] == COUNT)["in_rate"] == 1.5
    assert next(s for s in snapshot["streams"] if s["name"] == "in")["rate"] == 3.0
    assert snapshot["headline"]["input_rate"] == 3.0
    assert snapshot["headline"]["processed_rate"] == 1.5
    # Out: what its output stream grew by (mid stayed at 2).
    assert next(n for n in snapshot["nodes"] if n["id"] == COUNT)["out_rate"] == 0.0


def test_a_rate_that_moves_once_a_batch_shows_between_batches() -> None:
    tracker = Tracker(rate_window=10 * S)
    rates = []
    for second in range(21):
        consumed = 5 + 100 * (second // 5)  # a batch of 100 records every 5 s
        snapshot = tracker.update(pipeline(NOW + second * S, consumed, NOW))
        rates.append(next(n for n in snapshot["nodes"] if n["id"] == COUNT)["in_rate"])
    assert rates[0] is None
    assert all(rate > 0 for rate in rates[5:])
    assert rates[20] == pytest.approx(20.0)  # 200 records in the last 10 s


def test_a_watermark_that_does_not_move_while_input_waits_is_stalled_and_its_holder_named() -> None:
    tracker = Tracker(stall_after=30 * S)
    tracker.update(pipeline(NOW, 5, NOW - 60 * S))
    snapshot = tracker.update(pipeline(NOW + 31 * S, 5, NOW - 60 * S))
    nodes = {n["id"]: n for n in snapshot["nodes"]}
    assert nodes[COUNT]["health"] == "stalled"
    assert nodes[SUM]["health"] == "ok"  # nothing waits for it
    assert snapshot["headline"]["stalled"] == 1
    assert snapshot["held"][COUNT] == [COUNT, "stream/in", "injector/feed"]
    assert snapshot["held"][SUM] == [SUM, "stream/mid", COUNT, "stream/in", "injector/feed"]
    assert [e["kind"] for e in snapshot["events"] if e.get("source") == COUNT] == ["stalled"]
    # It moves again: ok, and the timeline says so.
    moved = tracker.update(pipeline(NOW + 32 * S, 6, NOW - 50 * S))
    assert {n["id"]: n for n in moved["nodes"]}[COUNT]["health"] == "ok"
    assert [e["kind"] for e in moved["events"] if e.get("source") == COUNT] == ["stalled", "ok"]


def test_records_arriving_after_a_quiet_spell_are_no_stall() -> None:
    tracker = Tracker(stall_after=30 * S)
    tracker.update(pipeline(NOW, 10, NOW - 60 * S))  # all consumed: nothing waits
    quiet = tracker.update(pipeline(NOW + 60 * S, 10, NOW - 60 * S))
    assert {n["id"]: n for n in quiet["nodes"]}[COUNT]["health"] == "ok"
    # Records arrive; the watermark has stood still for a minute, the input waited 1 s.
    arrived = tracker.update(pipeline(NOW + 61 * S, 5, NOW - 60 * S))
    assert {n["id"]: n for n in arrived["nodes"]}[COUNT]["health"] == "ok"
    waited = tracker.update(pipeline(NOW + 91 * S, 5, NOW - 60 * S))
    assert {n["id"]: n for n in waited["nodes"]}[COUNT]["health"] == "stalled"


def test_a_silent_injector_process_holds_the_path_and_is_named() -> None:
    expected = ExpectedSet("feed", ("in",), ("0", "1"))
    snapshot = Tracker().update(
        observe(
            NOW,
            expected,
            injector(NOW - 5 * S, "0"),
            computation(COUNT, ("mid",), NOW - 900 * S, {"in": {0: 3}}),
            ends={"in": {0: 3}, "mid": {0: 0}},
        )
    )
    nodes = {n["id"]: n for n in snapshot["nodes"]}
    feed = nodes["injector/feed"]
    assert feed["state"] == "no report yet"
    assert feed["health"] == "waiting"
    assert feed["held_by"] == "process 1: no report yet"
    assert [p["process"] for p in feed["processes"]] == ["0", "1"]
    assert snapshot["held"][COUNT] == [COUNT, "stream/in", "injector/feed"]


def test_a_computation_held_by_its_own_interval_ends_the_path_there() -> None:
    snapshot = Tracker().update(
        observe(
            NOW,
            injector(NOW),
            computation(COUNT, ("mid",), NOW - 10 * S, {"in": {0: 3}}, held_by="interval 2"),
            ends={"in": {0: 3}, "mid": {0: 0}},
        )
    )
    assert snapshot["held"][COUNT] == [COUNT]
    assert {n["id"]: n for n in snapshot["nodes"]}[COUNT]["held_by"] == "interval 2"


def test_each_interval_has_its_own_watermark_lag_and_owner() -> None:
    held = WatermarkReport(
        COUNT,
        ("mid",),
        NOW - 10 * S,
        1,
        held_by="interval 2",
        input_watermark=NOW - 3 * S,
        behind=((2, NOW - 10 * S), (5, NOW - 4 * S)),
        workers={"h:1": (2, 5), "h:2": (0,)},
    )
    snapshot = Tracker().update(observe(NOW, injector(NOW), held, ends={"in": {}, "mid": {}}))
    node = {n["id"]: n for n in snapshot["nodes"]}[COUNT]
    assert node["intervals_behind"] == [[2, 10.0], [5, 4.0]]
    assert (node["lag_s"], node["input_lag_s"]) == (10.0, 3.0)  # every other interval's
    assert node["owners"] == {"2": "h:1", "5": "h:1", "0": "h:2"}


def test_complete_sources_are_complete_and_hold_nothing() -> None:
    snapshot = Tracker().update(
        observe(
            NOW,
            injector(MAX_EVENT_TIME),
            computation(COUNT, ("mid",), MAX_EVENT_TIME, {"in": {0: 3}}),
            ends={"in": {0: 3}, "mid": {0: 0}},
        )
    )
    nodes = {n["id"]: n for n in snapshot["nodes"]}
    assert nodes[COUNT]["health"] == "complete"
    assert nodes["injector/feed"]["health"] == "complete"
    assert snapshot["held"] == {}
    assert snapshot["headline"]["freshness_s"] is None


def test_dead_letter_streams_are_marked_and_counted_per_minute() -> None:
    tracker = Tracker()
    ends = {"in": {0: 3}, "count.dead-letters": {0: 1}}
    report = computation(COUNT, ("count.dead-letters",), NOW, {"in": {0: 3}})
    tracker.update(observe(NOW, injector(NOW), report, ends=ends))
    snapshot = tracker.update(
        observe(NOW + 10 * S, injector(NOW), report, ends={**ends, "count.dead-letters": {0: 3}})
    )
    dead = next(s for s in snapshot["streams"] if s["name"] == "count.dead-letters")
    assert dead["dead_letters"] is True
    assert snapshot["headline"]["dead_letters_per_min"] == 12.0


def test_memory_stays_bounded_however_long_it_runs() -> None:
    tracker = Tracker(trend=5, events=3)
    for i in range(50):
        # Kafka answers every other time: each change is an event.
        observation = pipeline(NOW + i * S, 5 + i, NOW - 60 * S + i * S)
        error = "Kafka did not answer" if i % 2 else None
        snapshot = tracker.update(
            Observation(observation.now, observation.messages, observation.ends, error)
        )
    assert len(snapshot["events"]) == 3
    assert all(len(n.get("lag_trend", [])) <= 5 for n in snapshot["nodes"])


def test_a_source_gone_from_the_topic_is_a_retired_event() -> None:
    tracker = Tracker()
    tracker.update(pipeline(NOW, 5, NOW))
    snapshot = tracker.update(observe(NOW + S, injector(NOW), ends={"in": {0: 10}}))
    retired = [e for e in snapshot["events"] if e["kind"] == "retired"]
    assert sorted(e["source"] for e in retired) == [COUNT, SUM]


def test_a_topology_pattern_narrows_the_view_to_its_part_of_the_graph() -> None:
    other = WatermarkReport("injector/other/0", ("elsewhere",), NOW, 1)
    old = computation("computation/old/count", ("old_out",), NOW, {"elsewhere": {0: 1}})
    observation = pipeline(NOW, 5, NOW)
    observation = Observation(
        NOW,
        {**observation.messages, other.source: other, old.source: old},
        {**observation.ends, "elsewhere": {0: 1}, "unrelated": {0: 9}},
    )
    everything = Tracker().update(observation)
    assert "computation/old/count" in {n["id"] for n in everything["nodes"]}
    assert "unrelated" in {s["name"] for s in everything["streams"]}
    narrowed = Tracker(topologies=["t*"]).update(observation)
    assert {n["id"] for n in narrowed["nodes"]} == {
        "injector/feed",
        COUNT,
        SUM,
        "stream/in",
        "stream/mid",
        "stream/out",
    }
    assert {s["name"] for s in narrowed["streams"]} == {"in", "mid", "out"}


def counted(stats: dict[str, int], driver: str, watermark: int = NOW) -> WatermarkReport:
    return WatermarkReport(
        COUNT,
        ("mid",),
        watermark,
        1,
        consumed={"in": {0: 1}},
        stats=stats,
        driver=driver,
        held_by="input",
    )


def test_a_computations_counters_give_rates_cache_hits_and_timeline_entries() -> None:
    tracker = Tracker(rate_window=10 * S)
    ends = {"in": {0: 1}, "mid": {0: 0}}
    base = {"processed": 100, "committed_keys": 40, "intervals": 4, "cache_hits": 3}
    first = tracker.update(observe(NOW, counted(base, "d1"), ends=ends))
    node = next(n for n in first["nodes"] if n["id"] == COUNT)
    assert node["stats"] == base
    assert node["cache_hit_rate"] == 0.75
    assert node["rates"] == {"processed": None, "committed_keys": None}
    grown = {**base, "processed": 150, "committed_keys": 60, "fenced_producers": 1, "isolated": 2}
    second = tracker.update(observe(NOW + 5 * S, counted(grown, "d1"), ends=ends))
    node = next(n for n in second["nodes"] if n["id"] == COUNT)
    assert node["rates"] == {"processed": 10.0, "committed_keys": 4.0}
    assert second["headline"]["committed_keys_per_second"] == 4.0
    assert second["headline"]["late_per_min"] is None  # the driver counted no late record
    told = [(e["kind"], e["text"]) for e in second["events"] if e.get("source") == COUNT]
    assert told == [
        ("fenced", "1 Kafka producer fenced: a zombie's transactions were refused"),
        ("exception", "2 poison pills isolated: code failed on them alone (dead-lettered)"),
    ]
    # A new driver: its counters start again, and the timeline says it restarted (no more).
    third = tracker.update(observe(NOW + 6 * S, counted({"processed": 5}, "d2"), ends=ends))
    told = [(e["kind"], e["text"]) for e in third["events"] if e.get("source") == COUNT]
    assert told[2:] == [("restart", "driver restarted")]


def test_system_latency_is_how_long_the_oldest_unread_record_has_waited() -> None:
    tracker = Tracker()
    first = tracker.update(pipeline(NOW, 10, NOW))  # all of in read: nothing waits
    assert first["headline"]["system_latency_s"] is None
    # Three records arrive at +5 s; at +12 s they are still unread.
    arrived = pipeline(NOW + 5 * S, 10, NOW)
    arrived = Observation(arrived.now, arrived.messages, {**arrived.ends, "in": {0: 13, 1: 4}})
    tracker.update(arrived)
    waited = tracker.update(Observation(NOW + 12 * S, arrived.messages, arrived.ends))
    node = next(n for n in waited["nodes"] if n["id"] == COUNT)
    assert node["waiting_s"] == 7.0
    assert node["waiting_at_least"] is False
    assert waited["headline"]["system_latency_s"] == 7.0
    # Records there before the view's first reading have waited at least since then.
    late_view = Tracker().update(pipeline(NOW, 5, NOW))
    node = next(n for n in late_view["nodes"] if n["id"] == COUNT)
    assert (node["waiting_s"], node["waiting_at_least"]) == (0.0, True)
