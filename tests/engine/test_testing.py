"""The testing helpers, used the way a user would."""

from __future__ import annotations

import pytest

from millstream.engine.codecs import IntCodec
from millstream.engine.computation import Computation
from millstream.engine.context import Context
from millstream.engine.errors import TopologyError
from millstream.engine.productions import Production
from millstream.engine.records import Deletion, Record
from millstream.engine.stores.memory.store import InjectedCrash
from millstream.engine.testing import (
    END_OF_TIME,
    AdvanceClock,
    SendOutcome,
    TestingSink,
    Watermark,
    record,
    run_computation,
    run_topology,
    tombstone,
)
from millstream.engine.timers import TimeDomain, Timer
from millstream.engine.topology import ComputationOptions, Topology

pytestmark = pytest.mark.unit

COUNT = IntCodec()
WINDOW = 100


class WindowCounter(Computation):
    """Counts records per key and window of 100 µs; emits each count when the window closes."""

    def process_record(self, ctx: Context, record: Record) -> None:
        end = record.timestamp // WINDOW * WINDOW + WINDOW - 1
        count = ctx.state(COUNT)
        count.set(count.get(0) + 1)
        ctx.set_timer("window", end)

    def process_timer(self, ctx: Context, timer: Timer) -> None:
        ctx.produce("counts", COUNT.encode(ctx.state(COUNT).get(0)), timer.timestamp)
        ctx.clear_state()


def test_a_computation_is_tested_in_a_few_lines() -> None:
    run = run_computation(
        WindowCounter(),
        [record("cat", b"", 10), record("cat", b"", 20), record("dog", b"", 50), Watermark(100)],
        outputs=["counts"],
    )
    assert sorted((r.key, COUNT.decode(r.value)) for r in run.records("counts")) == [
        ("cat", 2),
        ("dog", 1),
    ]
    assert run.state == {}
    assert [t.tag for t in run.fired_timers] == ["window", "window"]
    assert run.pending_timers == []
    assert run.dead_letters == []


def test_nothing_fires_before_the_watermark_passes() -> None:
    run = run_computation(
        WindowCounter(), [record("cat", b"", 10), Watermark(99)], outputs=["counts"]
    )
    assert run.records("counts") == []
    assert run.state == {"cat": COUNT.encode(1)}
    assert [t.timestamp for t in run.pending_timers] == [99]


class Alarm(Computation):
    def process_record(self, ctx: Context, record: Record) -> None:
        ctx.set_timer("alarm", ctx.clock.now() + 1_000, TimeDomain.WALL_TIME)

    def process_timer(self, ctx: Context, timer: Timer) -> None:
        ctx.produce("alarms", b"ring", 0)


def test_wall_time_moves_by_hand() -> None:
    early = run_computation(Alarm(), [record("k", b"", 0), AdvanceClock(999)], outputs=["alarms"])
    assert early.values("alarms") == []
    late = run_computation(Alarm(), [record("k", b"", 0), AdvanceClock(1_000)], outputs=["alarms"])
    assert late.values("alarms") == [b"ring"]


class Fragile(Computation):
    def process_record(self, ctx: Context, record: Record) -> None:
        if record.value == b"bad":
            raise ValueError("cannot handle bad")
        ctx.produce("output", record.value, record.timestamp)


def test_dead_letters_are_reported() -> None:
    bad = record("k", b"bad", 5)
    run = run_computation(Fragile(), [record("k", b"ok", 1), bad])
    assert run.values("output") == [b"ok"]
    (dead,) = run.dead_letters
    assert (dead.error_type, dead.error_message, dead.origin.record_id) == (
        "ValueError",
        "cannot handle bad",
        bad.record_id,
    )


def test_records_of_the_helper_get_unique_ids() -> None:
    assert record("k", b"", 1).record_id != record("k", b"", 1).record_id
    assert record("k", b"", 1, record_id=bytes(16)).record_id == bytes(16)


class Splitter(Computation):
    """Re-keys each record by its value."""

    def process_record(self, ctx: Context, record: Record) -> None:
        ctx.produce("words", b"1", record.timestamp, key=record.value.decode())


def test_a_topology_runs_end_to_end_and_watermarks_flow_downstream() -> None:
    topology = Topology("words", streams=["lines"])
    topology.add_computation("split", Splitter(), inputs=["lines"], outputs=["words"])
    topology.add_computation("count", WindowCounter(), inputs=["words"], outputs=["counts"])
    runs = run_topology(
        topology,
        [
            ("lines", record("l1", b"cat", 10)),
            ("lines", record("l2", b"cat", 20)),
            ("lines", record("l3", b"dog", 150)),
            Watermark(100),
        ],
    )
    assert [(r.key, COUNT.decode(r.value)) for r in runs["count"].records("counts")] == [("cat", 2)]
    assert [t.key for t in runs["count"].pending_timers] == ["dog"]
    assert len(runs["split"].records("words")) == 3


class HoldsBack(Computation):
    """Forwards each record under the key ``all`` only when its event timer fires."""

    def process_record(self, ctx: Context, record: Record) -> None:
        ctx.set_timer("forward", record.timestamp)

    def process_timer(self, ctx: Context, timer: Timer) -> None:
        ctx.produce("held", b"", timer.timestamp, key="all")


def test_a_consumer_waits_for_its_producers_pending_work() -> None:
    topology = Topology(streams=["in"])
    # "count" runs first in every round, so only its watermark can hold its window open.
    topology.add_computation("count", WindowCounter(), inputs=["held"], outputs=["counts"])
    topology.add_computation("hold", HoldsBack(), inputs=["in"], outputs=["held"])
    runs = run_topology(
        topology,
        [
            ("in", record("a", b"", 10)),
            Watermark(20),
            ("in", record("b", b"", 50)),
            Watermark(END_OF_TIME),
        ],
    )
    # The window [0, 100) of "count" closes only after "hold" forwarded the record at 50.
    assert [COUNT.decode(r.value) for r in runs["count"].records("counts")] == [2]


def test_a_failing_key_extractor_dead_letters_the_record() -> None:
    def first_byte(record: Record) -> str:
        return chr(record.value[0])

    topology = Topology(streams=["in"])
    topology.add_computation("c", Fragile(), inputs={"in": first_byte}, outputs=["output"])
    runs = run_topology(topology, [("in", record("k", b"", 1)), ("in", record("k", b"a", 2))])
    assert runs["c"].values("output") == [b"a"]
    assert [d.error_type for d in runs["c"].dead_letters] == ["IndexError"]


def test_records_go_to_injected_streams_only() -> None:
    topology = Topology(streams=["in"])
    topology.add_computation("c", Fragile(), inputs=["in"], outputs=["output"])
    with pytest.raises(TopologyError, match="not an injected stream"):
        run_topology(topology, [("output", record("k", b"", 1))])


def test_an_invalid_topology_is_refused() -> None:
    topology = Topology()
    topology.add_computation("c", Fragile(), inputs=["nowhere"])
    with pytest.raises(TopologyError):
        run_topology(topology, [])


def production(n: int) -> Production:
    return Production("s", Record("k", b"", 1, n.to_bytes(16, "big")))


def test_testing_sink_outcomes_and_crashes() -> None:
    outcomes = iter([SendOutcome.ACKNOWLEDGED, SendOutcome.UNACKNOWLEDGED, SendOutcome.LOST])
    sink = TestingSink(lambda _: next(outcomes))
    acked = sink.send([production(1), production(2), production(3)], timeout=1.0)
    assert acked == {production(1).record_id}
    assert sink.sent == [production(1), production(2)]

    sink = TestingSink()
    sink.crash_next_send(after=1)
    with pytest.raises(InjectedCrash):
        sink.send([production(1), production(2)], timeout=1.0)
    assert sink.sent == [production(1)]
    sink.send([production(1), production(2)], timeout=1.0)
    assert sink.delivered() == [production(1), production(2)]
    assert len(sink.sent) == 3


class Echo(Computation):
    """Passes each record on, so a test sees which records user code got."""

    def process_record(self, ctx: Context, record: Record) -> None:
        ctx.produce("output", record.value, record.timestamp)


@pytest.mark.parametrize("process_late", [True, False])
def test_late_records_go_to_the_late_stream_and_to_user_code_if_asked(process_late: bool) -> None:
    from millstream.engine.topology import ComputationOptions

    behind = record("a", b"late", 120)
    run = run_computation(
        Echo(),
        [record("a", b"on-time", 150), Watermark(200), behind],
        options=ComputationOptions(late_stream="late", process_late=process_late),
    )
    assert run.records("late") == [behind]  # as it came, record ID included
    expected = [b"on-time", b"late"] if process_late else [b"on-time"]
    assert run.values("output") == expected


@pytest.mark.parametrize(("percentile", "fired_at_200"), [(None, False), (99.0, True)])
def test_a_percentile_watermark_does_not_wait_for_a_straggling_process(
    percentile: float | None, fired_at_200: bool
) -> None:
    from millstream.engine.testing import TopologyHarness
    from millstream.engine.topology import ComputationOptions

    topology = Topology("skew", streams=["input"])
    options = ComputationOptions(watermark_percentile=percentile, late_stream="late")
    topology.add_computation(
        "count", WindowCounter(), inputs=["input"], outputs=["counts"], options=options
    )
    harness = TopologyHarness(topology)
    harness.step(record("cat", b"", 10))
    harness.step(Watermark(5, process="slow", records=20))  # 0.2 % of the records
    harness.step(Watermark(200, process="0", records=10_000))
    fired = bool(harness.result("count").records("counts"))
    assert fired is fired_at_200
    # The straggler's record: late under the percentile, on time under the exact watermark.
    harness.step(("input", record("dog", b"", 50)))
    harness.step(Watermark(END_OF_TIME, process="slow", records=21))
    harness.step(Watermark(END_OF_TIME, process="0", records=10_000))
    run = harness.result("count")
    assert [r.key for r in run.records("late")] == (["dog"] if fired_at_200 else [])
    assert sorted(r.key for r in run.records("counts")) == ["cat", "dog"]


class Tally(Computation):
    """Counts a key's records in state; a record with value ``clear`` clears it."""

    def process_record(self, ctx: Context, record: Record) -> None:
        if record.value == b"clear":
            ctx.clear_state()
            return
        count = ctx.state(COUNT)
        count.set(count.get(0) + 1)


def test_state_expires_once_the_watermark_passes_its_last_update_plus_the_ttl() -> None:
    from millstream.engine.testing import Step, TopologyHarness
    from millstream.engine.timers import STATE_TTL_TAG
    from millstream.engine.topology import ComputationOptions

    topology = Topology("ttl", streams=["input"])
    options = ComputationOptions(state_ttl=100)
    topology.add_computation("tally", Tally(), inputs=["input"], outputs=[], options=options)
    harness = TopologyHarness(topology)
    steps: list[Step] = [
        record("a", b"", 10),
        record("b", b"", 20),
        record("c", b"", 30),
        Watermark(50),
        record("a", b"", 60),  # a's expiry moves to 160
        record("b", b"", 5),  # late: b's expiry stays at 120
        record("c", b"clear", 55),  # cleared: its expiry goes with it
    ]
    for item in steps:
        harness.step(item)
    harness.run_until_idle()
    run = harness.result("tally")
    assert {k: COUNT.decode(v) for k, v in run.state.items()} == {"a": 2, "b": 2}
    assert sorted((t.key, t.timestamp) for t in run.pending_timers) == [("a", 160), ("b", 120)]
    assert {t.tag for t in run.pending_timers} == {STATE_TTL_TAG}

    harness.step(Watermark(121))
    run = harness.result("tally")
    assert set(run.state) == {"a"}  # b expired: its state and its timer are gone
    assert [t.key for t in run.pending_timers] == ["a"]
    assert run.fired_timers == []  # user code saw no timer
    harness.step(Watermark(161))
    run = harness.result("tally")
    assert (run.state, run.pending_timers) == ({}, [])


def test_the_engines_timer_tags_are_reserved() -> None:
    class Meddles(Computation):
        def process_record(self, ctx: Context, record: Record) -> None:
            ctx.set_timer("millstream.state-ttl", record.timestamp)

    run = run_computation(Meddles(), [record("a", b"", 1)])
    (letter,) = run.dead_letters
    assert "are the engine's" in letter.error_message


def test_intervals_split_and_merge_in_the_harness_and_every_window_is_counted_once() -> None:
    from millstream.engine.rebalance import RebalancePolicy
    from millstream.engine.testing import TopologyHarness
    from millstream.engine.topology import ComputationOptions

    topology = Topology("skew", streams=["input"])
    policy = RebalancePolicy(split_records=8, merge_records=2, max_intervals=8)
    options = ComputationOptions(key_intervals=2, rebalance=policy)
    topology.add_computation(
        "count", WindowCounter(), inputs=["input"], outputs=["counts"], options=options
    )
    harness = TopologyHarness(topology)
    keys = [f"k{n}" for n in range(12)]
    expected: dict[tuple[str, int], int] = {}
    changes = set()
    for step in range(20):
        for n in range(30):
            key = keys[n % 3] if n % 4 else keys[n % 12]  # three hot keys
            timestamp = step * WINDOW + n
            harness.step(("input", record(key, b"", timestamp)))
            end = timestamp // WINDOW * WINDOW + WINDOW - 1
            expected[(key, end)] = expected.get((key, end), 0) + 1
        harness.step(Watermark((step + 1) * WINDOW))
        changes.add(harness.layouts["count"].ids)
    harness.step(Watermark(END_OF_TIME))
    run = harness.result("count")
    assert len(changes) > 2  # the layout changed more than once: splits, then merges
    counted = {(r.key, r.timestamp): COUNT.decode(r.value) for r in run.records("counts")}
    assert counted == expected
    assert len(run.records("counts")) == len(expected)  # each window fired once
    assert run.state == {}
    assert run.pending_timers == []


class Profiles(Computation):
    """Keeps each user's latest profile; a deletion (GDPR erasure, say) forgets it."""

    def process_record(self, ctx: Context, record: Record) -> None:
        ctx.set_state(record.value)

    def process_deletion(self, ctx: Context, deletion: Deletion) -> None:
        ctx.clear_state()
        ctx.produce("erasures", deletion.key.encode(), deletion.timestamp)


def test_a_tombstone_is_a_dead_letter_and_the_stream_goes_on() -> None:
    run = run_computation(
        WindowCounter(),
        [record("cat", b"", 10), tombstone("cat", 15), record("cat", b"", 20), Watermark(100)],
        outputs=["counts"],
    )
    assert [COUNT.decode(v) for v in run.values("counts")] == [2]
    (letter,) = run.dead_letters
    assert letter.error_type == "TombstoneError"
    assert (letter.origin.stream, letter.origin.partition, letter.origin.offset) == ("input", 0, 1)
    assert letter.raw == b""


def test_a_computation_taking_tombstones_forgets_a_key_in_order_with_its_records() -> None:
    run = run_computation(
        Profiles(),
        [
            record("ann", b"v1", 10),
            record("bob", b"v1", 11),
            tombstone("ann", 12),
            record("bob", b"v2", 13),
            tombstone(None, 14),
            tombstone(b"\xff", 15),
            tombstone("eve", 16),  # nothing to forget: the hook runs all the same
        ],
        outputs=["erasures"],
        options=ComputationOptions(tombstones="deliver"),
    )
    assert run.state == {"bob": b"v2"}
    assert run.values("erasures") == [b"ann", b"eve"]
    assert sorted((d.origin.offset, d.error_type) for d in run.dead_letters) == [
        (4, "TombstoneError"),
        (5, "TombstoneError"),
    ]
