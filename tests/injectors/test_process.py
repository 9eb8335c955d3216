"""The injector process over in-memory endpoints: IDs, checkpoints, fencing, watermarks."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from millstream.engine import pause_points
from millstream.engine.errors import (
    InjectorError,
    InjectorFencedError,
    InjectorRetiredError,
)
from millstream.engine.records import MAX_EVENT_TIME, MAX_RECORD_BYTES, injector_record_id
from millstream.engine.watermarks import (
    ExpectedSet,
    InputWatermark,
    WatermarkReport,
    computation_source,
    injector_source,
)
from millstream.injectors import (
    InjectorOptions,
    Poll,
    Position,
    RejectedInput,
    Source,
    SourceRecord,
    retire_process,
)
from millstream.injectors.process import DEFAULT_CHECKPOINT_INTERVAL
from millstream.injectors.testing import InjectorHarness, injector_harness

pytestmark = pytest.mark.unit

SECOND = 1_000_000


class Numbers(Source):
    """Emits ``per_poll`` numbers per poll from where it stands; ``stop_at`` ends the input."""

    streams = ("numbers",)

    def __init__(self, per_poll: int = 3, stop_at: int | None = None) -> None:
        self.per_poll = per_poll
        self.stop_at = stop_at
        self.next = -1
        self.opened_at: Position | None = None
        self.closed = False

    def open(self, position: Position | None) -> None:
        self.opened_at = position
        self.next = int(position["next"]) if position else 0

    def poll(self, timeout: float) -> Poll:
        end = self.next + self.per_poll
        if self.stop_at is not None:
            end = min(end, self.stop_at)
        records = [
            SourceRecord("numbers", f"k{n % 2}", str(n).encode(), n * SECOND, "numbers", n)
            for n in range(self.next, end)
        ]
        self.next = end
        return Poll(
            records=records,
            position={"next": end},
            watermark=end * SECOND,
            exhausted=self.stop_at is not None and end >= self.stop_at,
        )

    def close(self) -> None:
        self.closed = True


class Scripted(Source):
    """Returns the polls it was given, then empty ones."""

    streams = ("numbers",)

    def __init__(self, polls: Sequence[Poll]) -> None:
        self.polls = list(polls)

    def open(self, position: Position | None) -> None:
        pass

    def poll(self, timeout: float) -> Poll:
        return self.polls.pop(0) if self.polls else Poll()


def values(records: Sequence[object]) -> list[int]:
    return [int(r.value) for r in records]  # type: ignore[attr-defined]


def test_records_get_ids_from_their_source_position_and_a_report_follows() -> None:
    harness = injector_harness("nums", Numbers())
    harness.process.start()
    harness.process.step()

    records = harness.records("numbers")
    assert values(records) == [0, 1, 2]
    assert [r.record_id for r in records] == [
        injector_record_id("nums", "numbers", n) for n in range(3)
    ]
    report = harness.reports()[-1]
    assert report.source == injector_source("nums")
    assert report.streams == ("numbers", "nums.dead-letters")
    assert report.watermark == 3 * SECOND
    # The report covers the records sent before it.
    assert report.offsets == {"numbers": {0: 3}, "nums.dead-letters": {0: 0}}
    assert harness.expected_set() == ExpectedSet("nums", report.streams, ("0",))


def test_a_restart_resumes_from_the_checkpoint_and_repeats_are_the_same_ids() -> None:
    harness = injector_harness("nums", Numbers())
    harness.process.start()
    harness.process.step()
    harness.process.step()

    # Crash between sending and checkpointing: the records went out, the position did not.
    source = Numbers()
    harness.restart(source)
    assert source.opened_at == {"next": 6}
    harness.process.step()
    assert values(harness.records("numbers")) == list(range(9))

    crashing = Numbers()
    process = harness.new_process(crashing)
    process.start()
    original_save = process.checkpoints.save

    def crash(_checkpoint: object) -> None:
        raise RuntimeError("killed before the checkpoint")

    process.checkpoints.save = crash  # type: ignore[method-assign,assignment]
    with pytest.raises(RuntimeError):
        process.step()
    process.checkpoints.save = original_save  # type: ignore[method-assign]
    again = Numbers()
    harness.restart(again)
    assert again.opened_at == {"next": 9}
    harness.process.step()
    # Records 9..11 were sent twice with the same IDs: consumers see each once.
    sent_ids = [p.record_id for p in harness.sink.sent if p.stream == "numbers"]
    assert len(sent_ids) == 15
    assert values(harness.records("numbers")) == list(range(12))


def test_a_zombie_copy_cannot_checkpoint_and_stops() -> None:
    harness = injector_harness("nums", Numbers())
    harness.process.start()
    harness.process.step()
    zombie = harness.process

    successor = harness.restart(Numbers())
    successor.step()
    with pytest.raises(InjectorFencedError, match="zombie"):
        zombie.step()
    # The successor's checkpoint stands.
    third = Numbers()
    harness.restart(third)
    assert third.opened_at == {"next": 6}


def test_reports_of_a_restarted_process_supersede_its_predecessors() -> None:
    harness = injector_harness("nums", Numbers())
    harness.process.start()
    harness.process.step()
    before = harness.reports()[-1].sequence
    harness.restart(Numbers())
    assert all(r.sequence > before for r in harness.reports()[-1:])
    assert harness.reports()[-1].watermark == 3 * SECOND  # restored from the checkpoint


INTERVAL = InjectorOptions(checkpoint_interval=DEFAULT_CHECKPOINT_INTERVAL)


def checkpointed(harness: InjectorHarness) -> Position | None:
    """Where a process of the harness's injector would resume."""
    source = Numbers()
    harness.new_process(source).start()
    return source.opened_at


def test_a_trickling_source_sends_at_each_poll_and_checkpoints_once_an_interval() -> None:
    harness = injector_harness("nums", Numbers(per_poll=1), INTERVAL)
    process = harness.process
    process.start()
    for _ in range(5):
        process.step()
    # Every poll's record left at once; only the first poll's was checkpointed and reported.
    assert values(harness.records("numbers")) == [0, 1, 2, 3, 4]
    assert process.stats.checkpoints == 1
    assert process.watermark == 1 * SECOND
    assert harness.reports()[-1].watermark == 1 * SECOND

    harness.clock.advance(DEFAULT_CHECKPOINT_INTERVAL)
    process.step()
    assert process.stats.checkpoints == 2
    report = harness.reports()[-1]
    assert report.watermark == process.watermark == 6 * SECOND
    assert report.offsets["numbers"] == {0: 6}  # it speaks for every record sent before it


def test_a_crash_between_checkpoints_resends_with_the_same_ids_and_never_reports_less() -> None:
    harness = injector_harness("nums", Numbers(per_poll=1), INTERVAL)
    harness.process.start()
    for _ in range(4):
        harness.process.step()
    last_reported = harness.reports()[-1].watermark

    # A crash: records 1..3 were sent, the checkpoint still says 1.
    source = Numbers(per_poll=1)
    harness.restart(source)
    assert source.opened_at == {"next": 1}
    assert harness.reports()[-1].watermark >= last_reported
    for _ in range(3):
        harness.process.step()
    sent = [p.record_id for p in harness.sink.sent if p.stream == "numbers"]
    assert len(sent) == 7  # 1, 2 and 3 twice, with the same IDs
    assert values(harness.records("numbers")) == [0, 1, 2, 3]


def test_a_poll_waits_no_longer_than_the_next_checkpoint() -> None:
    timeouts: list[float] = []

    class Recorded(Numbers):
        def poll(self, timeout: float) -> Poll:
            timeouts.append(timeout)
            return super().poll(timeout) if len(timeouts) < 3 else Poll()

    options = InjectorOptions(checkpoint_interval=DEFAULT_CHECKPOINT_INTERVAL, poll_timeout=2.0)
    harness = injector_harness("nums", Recorded(per_poll=1), options)
    harness.process.start()
    harness.process.step()  # checkpointed at once: the first progress
    harness.process.step()  # progress, its checkpoint due in 0.1 s
    harness.clock.advance(DEFAULT_CHECKPOINT_INTERVAL // 4)
    harness.process.step()  # nothing read, so the checkpoint is 0.075 s away
    assert timeouts == [2.0, 2.0, pytest.approx(0.075)]
    assert harness.process.stats.checkpoints == 1
    harness.clock.advance(DEFAULT_CHECKPOINT_INTERVAL)
    harness.process.step()  # an empty poll still checkpoints what was sent before it
    assert harness.process.stats.checkpoints == 2
    assert checkpointed(harness) == {"next": 2}


def test_an_exhausted_source_and_a_stopped_run_leave_nothing_to_resend() -> None:
    harness = injector_harness("nums", Numbers(per_poll=1, stop_at=3), INTERVAL)
    process = harness.process
    process.start()
    for _ in range(3):
        process.step()
    assert process.exhausted
    assert checkpointed(harness) == {"next": 3}
    assert harness.reports()[-1].watermark == MAX_EVENT_TIME

    class StopsItself(Numbers):
        def poll(self, timeout: float) -> Poll:
            if self.next >= 5:
                stopping.stop()
            return super().poll(timeout)

    other = injector_harness("more", StopsItself(per_poll=1), INTERVAL)
    stopping = other.process
    stats = stopping.run()
    assert stats.polls == 6
    assert checkpointed(other) == {"next": 6}  # the last poll's record too
    assert other.reports()[-1].watermark == 6 * SECOND


def test_checkpoint_interval_must_not_be_negative() -> None:
    with pytest.raises(InjectorError, match="checkpoint_interval"):
        InjectorOptions(checkpoint_interval=-1)


def test_an_idle_source_heartbeats_its_watermark() -> None:
    harness = injector_harness("nums", Scripted([]), InjectorOptions(heartbeat=SECOND))
    harness.process.start()
    count = len(harness.reports())
    harness.process.step()
    assert len(harness.reports()) == count  # not due yet
    harness.clock.advance(SECOND)
    harness.process.step()
    assert len(harness.reports()) == count + 1
    assert harness.reports()[-1].held_by == "heartbeat"
    assert harness.process.stats.heartbeats == 1


def test_an_armed_pause_point_parks_the_injector_with_its_records_read_and_not_sent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Where the proving ground freezes Kafka or Cassandra under an injector (its outage faults).
    monkeypatch.setattr(pause_points, "_DIRECTORY", str(tmp_path))
    (tmp_path / "arm.injector.send.nums").touch()
    harness = injector_harness("nums", Numbers())
    harness.process.start()
    stepping = threading.Thread(target=harness.process.step)
    stepping.start()
    try:
        parked = tmp_path / "at.injector.send.nums"
        for _ in range(500):
            if parked.exists():
                break
            stepping.join(0.01)
        assert parked.exists(), "the injector did not park"
        assert harness.process.source.next == 3  # type: ignore[attr-defined]
        assert harness.records("numbers") == []
    finally:
        (tmp_path / "release.injector.send.nums").touch()
        stepping.join(10)
    assert not stepping.is_alive()
    assert values(harness.records("numbers")) == [0, 1, 2]
    assert not (tmp_path / "arm.injector.send.nums").exists()  # claimed: parks once


def test_bad_input_becomes_dead_letters_with_its_origin_and_the_injector_goes_on() -> None:
    rejected = RejectedInput("file-1", 40, b"garbage", "ValueError", "no timestamp")
    polls = [
        Poll(
            records=[
                SourceRecord("numbers", "a", b"1", 5 * SECOND, "file-1", 0),
                SourceRecord("numbers", "a", b"2", 10**25, "file-1", 10),  # ns, not µs
                SourceRecord("numbers", "a", b"x" * MAX_RECORD_BYTES, SECOND, "file-1", 20),
                SourceRecord("numbers", "a", b"3", 6 * SECOND, "file-1", 30),
            ],
            rejected=[rejected],
            position={"at": 50},
            watermark=6 * SECOND,
        )
    ]
    harness = injector_harness("nums", Scripted(polls))
    harness.process.start()
    harness.process.step()

    assert values(harness.records("numbers")) == [1, 3]
    letters = harness.dead_letters()
    assert [(d.origin.stream, d.origin.offset, d.error_type) for d in letters] == [
        ("file-1", 10, "AbsurdTimestampError"),
        ("file-1", 20, "OversizedRecordError"),
        ("file-1", 40, "ValueError"),
    ]
    assert letters[2].raw == b"garbage"
    assert letters[0].origin.record_id == injector_record_id("nums", "file-1", 10)
    assert harness.process.stats.dead_letters == 3
    assert harness.process.stats.emitted == 2


def test_max_future_rejects_records_from_the_far_future() -> None:
    polls = [Poll(records=[SourceRecord("numbers", "a", b"1", 10**15, "f", 0)])]
    harness = injector_harness("nums", Scripted(polls), InjectorOptions(max_future=SECOND))
    harness.process.start()
    harness.process.step()
    assert harness.records("numbers") == []
    assert "max_future" in harness.dead_letters()[0].error_message


def test_a_record_for_an_undeclared_stream_is_a_programming_error() -> None:
    polls = [Poll(records=[SourceRecord("other", "a", b"1", SECOND, "f", 0)])]
    harness = injector_harness("nums", Scripted(polls))
    harness.process.start()
    with pytest.raises(InjectorError, match="does not declare"):
        harness.process.step()


def test_an_exhausted_source_reports_the_end_of_time_and_run_returns() -> None:
    source = Numbers(per_poll=4, stop_at=10)
    harness = injector_harness("nums", source)
    stats = harness.process.run(until_exhausted=True)
    assert stats.emitted == 10
    assert harness.reports()[-1].watermark == MAX_EVENT_TIME
    assert source.closed


def test_unacknowledged_records_are_resent_until_kafka_takes_them() -> None:
    from millstream.engine.testing import SendOutcome

    outcomes = iter([SendOutcome.LOST, SendOutcome.ACKNOWLEDGED, SendOutcome.ACKNOWLEDGED])
    harness = injector_harness("nums", Numbers(per_poll=2))
    harness.sink.outcome = lambda _p: next(outcomes, SendOutcome.ACKNOWLEDGED)
    harness.process.start()
    harness.process.step()
    # The lost one went out again after the first: the order across keys may change.
    assert sorted(values(harness.records("numbers"))) == [0, 1]
    assert len(harness.sink.sent) == 2


def test_kafka_that_never_acknowledges_is_waited_out_then_stops_the_process_clearly() -> None:
    from millstream.engine.errors import ServiceOutageError

    options = InjectorOptions(send_timeout=1.0, outage_timeout=30.0)
    harness = injector_harness("nums", Numbers(), options)
    sends: list[int] = []

    def tick(productions: object, timeout: float) -> frozenset[bytes]:
        sends.append(harness.clock.now())
        harness.clock.advance(SECOND)
        return frozenset()

    harness.sink.send = tick  # type: ignore[method-assign]
    waited: list[float] = []

    def wait(seconds: float) -> None:
        waited.append(seconds)
        harness.clock.advance(int(seconds * SECOND))

    process = harness.new_process(Numbers(), options, wait=wait)
    process.start()
    with pytest.raises(
        ServiceOutageError, match=r"Kafka unreachable for 3[0-9] s.*did not acknowledge"
    ):
        process.step()
    # It kept sending, backing off up to 5 s between tries, for the whole outage timeout.
    assert len(sends) >= 6
    assert max(waited) == 5.0
    assert waited[:3] == [0.5, 1.0, 2.0]


def test_kafka_back_within_the_outage_timeout_loses_nothing() -> None:
    from millstream.engine.testing import SendOutcome

    harness = injector_harness("nums", Numbers(per_poll=3))
    down = iter([SendOutcome.LOST] * 9)
    harness.sink.outcome = lambda _p: next(down, SendOutcome.ACKNOWLEDGED)
    process = harness.new_process(Numbers(per_poll=3), wait=lambda _s: None)
    process.start()
    process.step()
    assert sorted(values(harness.records("numbers"))) == [0, 1, 2]


def test_expected_processes_hold_the_stream_until_each_reported() -> None:
    options = InjectorOptions(process="0", expected=("0", "1"))
    harness = injector_harness("nums", Numbers(), options)
    harness.process.start()
    harness.process.step()
    consumer = InputWatermark({"numbers": "numbers"})

    def watermark() -> int:
        for _key, message in harness.channel.messages:
            if isinstance(message, ExpectedSet):
                consumer.declare(message)
            elif isinstance(message, WatermarkReport):
                consumer.offer(message)
        return consumer.advance({"numbers": {0: 10**9}})

    assert watermark() == 0  # process 1 has not reported
    second = harness.new_process(Numbers(), InjectorOptions(process="1", expected=("0", "1")))
    second.start()
    second.step()
    assert watermark() == 3 * SECOND

    retired = retire_process(harness.channel, "nums", "1")
    assert retired.processes == ("0",)
    assert retired.retired == ("1",)
    harness.clock.advance(DEFAULT_CHECKPOINT_INTERVAL)  # process 0's next checkpoint is due
    harness.process.step()
    assert watermark() == 6 * SECOND
    with pytest.raises(InjectorRetiredError):
        harness.new_process(Numbers(), InjectorOptions(process="1")).start()


def test_the_skew_limit_waits_for_the_slowest_downstream_computation() -> None:
    downstream = computation_source("topo", "count")
    options = InjectorOptions(skew_limit=2 * SECOND, downstream=(downstream,), poll_timeout=0)
    harness = injector_harness("nums", Numbers(), options)
    waits = []

    def catch_up(_seconds: float) -> None:
        waits.append(1)
        harness.channel.publish(WatermarkReport(downstream, ("counts",), 2 * SECOND, 2))

    harness.process = harness.new_process(Numbers(), options, wait=catch_up)
    harness.process.start()
    harness.process.step()  # nothing from downstream yet: no limit
    assert harness.process.watermark == 3 * SECOND
    harness.channel.publish(WatermarkReport(downstream, ("counts",), 0, 1))
    harness.process.step()
    assert waits
    assert harness.process.stats.skew_waits == 1
    assert values(harness.records("numbers")) == list(range(6))
