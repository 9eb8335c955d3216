"""The console: a live status on a terminal, plain occasional lines anywhere else."""

from __future__ import annotations

import io
import threading

import pytest

from millstream.engine.computation import Computation
from millstream.engine.records import MAX_EVENT_TIME
from millstream.engine.topology import Topology
from millstream.spark.console import Console, format_watermark
from millstream.spark.metrics import BatchMetrics

pytestmark = pytest.mark.unit

HOUR = 3_600_000_000
MARCH = 1_425_168_000_000_000  # 2015-03-01 00:00 UTC


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def batch(computation: str, inputs: int, watermark: int, **more: object) -> BatchMetrics:
    return BatchMetrics(
        computation=computation,
        batch_id=0,
        inputs=inputs,
        seconds=1.0,
        input_watermark=watermark,
        **more,  # type: ignore[arg-type]
    )


def zeitgeist(name: str) -> Topology:
    """Two stages, named as the Zeitgeist job names them: after their topology."""
    topology = Topology(name, streams=[f"{name}.searches"])
    topology.add_computation(
        f"{name}_window_counter",
        Computation(),
        inputs=[f"{name}.searches"],
        outputs=[f"{name}.counts"],
    )
    topology.add_computation(f"{name}_model", Computation(), inputs=[f"{name}.counts"])
    return topology


def test_without_a_terminal_it_prints_plain_lines_and_no_escape_code() -> None:
    out = io.StringIO()  # not a terminal, as in CI or a pipe
    clock = Clock()
    emitted = [0]
    console = Console(out, interval=3600, clock=clock)
    assert not console.live
    console.track_topology(zeitgeist("zeitgeist_r"))
    with console:
        console.track_injection("injected", lambda: emitted[0], total=4_000, unit="searches")
        emitted[0] = 1_000
        clock.now += 1
        console.on_batch(batch("zeitgeist_r_window_counter", 1_000, MARCH + HOUR))
        console.print("  anomaly: AAPL spike")
        print("  anomaly: GOOG dip", file=console.out)
        clock.now += 1
        console.on_batch(
            batch("zeitgeist_r_window_counter", 3_000, MARCH + 2 * HOUR, failed_attempts=("x",))
        )
    lines = out.getvalue().splitlines()
    assert lines == [
        "  anomaly: AAPL spike",
        "  anomaly: GOOG dip",
        # The last status, as the console stops.
        "[0:02] injected 1,000 of 4,000 searches (25%); window_counter: input watermark "
        "2015-03-01 02:00:00 UTC, 2,000 records/s, 2 batches (1 retried); "
        "model: input watermark none yet, 0 records/s, 0 batches",
    ]
    assert "\x1b" not in out.getvalue()


def test_plain_lines_come_every_interval_while_something_changes() -> None:
    out = io.StringIO()
    console = Console(out, interval=0.05)
    printed = threading.Event()
    seen: list[str] = []

    def sink(line: str) -> None:
        seen.append(line)
        printed.set()

    console.print = sink  # type: ignore[method-assign,assignment]
    with console:
        console.on_batch(batch("counter", 10, MARCH))
        assert printed.wait(5)
        printed.clear()
        assert not printed.wait(0.3)  # nothing changed: no line
        console.on_batch(batch("counter", 10, MARCH + HOUR))
        assert printed.wait(5)
    assert "counter: input watermark 2015-03-01 00:00:00 UTC" in seen[0]
    assert all(line.startswith("[0:0") for line in seen)


def test_records_per_second_are_over_the_last_window() -> None:
    clock = Clock()
    console = Console(io.StringIO(), window=10.0, clock=clock)
    # The first batch counts from its start (it took 1 s).
    console.on_batch(batch("c", 100, MARCH))
    assert "100 records/s" in console.status_line()
    for _ in range(30):
        clock.now += 1
        console.on_batch(batch("c", 50, MARCH))
    assert "50 records/s" in console.status_line()
    clock.now += 19  # no batch for longer than the window: the last one's rate, falling
    assert ", 2 records/s" in console.status_line()  # 50 records in the last 20 s


def test_watermarks_read_as_times() -> None:
    assert format_watermark(MARCH + HOUR + 1) == "2015-03-01 01:00:00 UTC"
    assert format_watermark(MAX_EVENT_TIME) == "end of input"
    assert format_watermark(0) == "none yet"
    assert format_watermark(None) == "none yet"


def test_an_injection_of_unknown_size_shows_its_count() -> None:
    console = Console(io.StringIO())
    console.track_injection("read", lambda: 12_345)
    assert console.status_line() == "read 12,345"


def test_the_live_status_shows_injections_computations_and_the_log_file(
    tmp_path: object,
) -> None:
    out = io.StringIO()
    console = Console(out, live=True, log_file=None)
    with console:
        console.track_injection("injected", lambda: 500, total=1_000, unit="searches")
        console.on_batch(batch("window_counter", 500, MARCH))
        console.print("  anomaly: AAPL spike")
    shown = out.getvalue()
    for part in ("injected", "500 of 1,000 searches", "window_counter", "input watermark"):
        assert part in shown
    assert "2015-03-01 00:00:00 UTC" in shown
    assert "anomaly: AAPL spike" in shown


def test_a_topology_orders_and_names_the_computations_it_shows() -> None:
    console = Console(io.StringIO())
    console.on_batch(batch("zeitgeist_r_model", 5, MARCH))  # before the topology is known
    console.track_topology(zeitgeist("zeitgeist_r"))
    console.track_topology(zeitgeist("zeitgeist_r"))  # again: nothing changes
    console.on_batch(batch("elsewhere", 1, MARCH))
    line = console.status_line()
    assert [part.split(":")[0] for part in line.split("; ")] == [
        "window_counter",
        "model",
        "elsewhere",
    ]
    assert "model: input watermark 2015-03-01 00:00:00 UTC, 5 records/s, 1 batch" in line
