"""Percentile watermarks on skewed input: how much sooner windows close, and how many
records come late for it (paper 7.2).

    python bench/percentile_watermarks.py [--seconds 600] [--processes 20] [--lag 120]
                                          [--straggler-share 0.5] [--json F]

No services: it runs the engine's protocol through the testing harness
(:class:`~millstream.engine.testing.TopologyHarness`, memory store), so the figures are the
watermark logic's own, the same on any machine. Workload: ``--processes`` injector processes
each write 20 records per second of event time over 100 keys; one more, the straggler, writes
``--straggler-share`` % of all records with event times ``--lag`` seconds behind the others,
and reports its watermark that far behind too. Each process reports after every second, with
the records it wrote as its weight. One computation counts records per key in 10-second
event-time windows on event-time timers, routing late records to a late stream (and still
counting them, so every record is counted once its window fires again).

Per watermark choice (exact, then each ``--percentiles``), the same input:

* **window lag**: when a window first fires, how far the leading processes' event time is
  past the window's end (mean and p95, seconds of event time): what a consumer waits for a
  result (a window a late record fires again is counted in ``windows``, not here);
* **late**: the share of the records that arrived behind the watermark they ran under.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from pathlib import Path
from typing import Any

from millstream.engine.codecs import JsonCodec
from millstream.engine.computation import Computation
from millstream.engine.context import Context
from millstream.engine.records import Record
from millstream.engine.testing import END_OF_TIME, TopologyHarness, Watermark, record
from millstream.engine.timers import Timer
from millstream.engine.topology import ComputationOptions, Topology

_SECOND = 1_000_000
_WINDOW = 10 * _SECOND
_COUNTS: JsonCodec = JsonCodec()


class WindowCount(Computation):
    """Records per key and 10-second window, each window emitted when its end passes (a late
    record's window again, with its late count)."""

    def process_record(self, ctx: Context, record: Record) -> None:
        end = record.timestamp // _WINDOW * _WINDOW + _WINDOW - 1
        counts = ctx.state(_COUNTS)
        open_windows: dict[str, int] = counts.get({})
        open_windows[str(end)] = open_windows.get(str(end), 0) + 1
        counts.set(open_windows)
        ctx.set_timer(f"w{end}", end)

    def process_timer(self, ctx: Context, timer: Timer) -> None:
        counts = ctx.state(_COUNTS)
        open_windows: dict[str, int] = counts.get({})
        count = open_windows.pop(str(timer.timestamp), 0)
        ctx.produce("counts", str(count).encode(), timer.timestamp)
        if open_windows:
            counts.set(open_windows)
        else:
            ctx.clear_state()


def run(args: argparse.Namespace, percentile: float | None) -> dict[str, Any]:
    rng = random.Random(args.seed)
    topology = Topology("skew", streams=["events"])
    topology.add_computation(
        "count",
        WindowCount(),
        inputs=["events"],
        outputs=["counts"],
        options=ComputationOptions(
            key_intervals=4, watermark_percentile=percentile, late_stream="late"
        ),
    )
    harness = TopologyHarness(topology, max_rounds=1_000_000)
    start = 1_700_000_000 * _SECOND
    # The straggler first: a process that reports after the watermark moved cannot hold it.
    written = dict.fromkeys(["straggler"] + [str(p) for p in range(args.processes)], 0)
    per_second = 20 * args.processes
    straggler_rate = per_second * args.straggler_share / (100.0 - args.straggler_share)
    owed = 0.0
    lags: list[float] = []
    seen: set[tuple[str, int]] = set()
    fired = 0
    total = 0
    for name in written:  # every process reports before it writes (an expected set's rule)
        behind = args.lag * _SECOND if name == "straggler" else 0
        harness.step(Watermark(start - behind, process=name, records=0))
    for second in range(args.seconds):
        now = start + second * _SECOND
        for process in range(args.processes):
            for _ in range(20):
                at = now + rng.randrange(_SECOND)
                harness.step(("events", record(f"k{rng.randrange(100)}", b"", at)))
                written[str(process)] += 1
        owed += straggler_rate
        while owed >= 1.0:
            owed -= 1.0
            at = now - args.lag * _SECOND + rng.randrange(_SECOND)
            harness.step(("events", record(f"k{rng.randrange(100)}", b"", at)))
            written["straggler"] += 1
        for name, count in written.items():
            behind = args.lag * _SECOND if name == "straggler" else 0
            harness.step(Watermark(now + _SECOND - behind, process=name, records=count))
        outputs = harness.result("count").records("counts")
        for output in outputs[fired:]:
            window = (output.key, output.timestamp)
            if window not in seen:  # a late record's window fires again: not a result's lag
                seen.add(window)
                lags.append((now + _SECOND - 1 - output.timestamp) / _SECOND)
        fired = len(outputs)
    total = sum(written.values())
    for name, count in written.items():
        harness.step(Watermark(END_OF_TIME, process=name, records=count))
    result = harness.result("count")
    late = len(result.records("late"))
    ordered = sorted(lags)
    return {
        "watermark": "exact" if percentile is None else f"p{percentile:g}",
        "records": total,
        "straggler_records": written["straggler"],
        "windows": len(result.records("counts")),
        "lag_mean_s": statistics.fmean(ordered) if ordered else None,
        "lag_p95_s": ordered[int(len(ordered) * 0.95)] if ordered else None,
        "late": late,
        "late_share": late / total,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=600)
    parser.add_argument("--processes", type=int, default=20)
    parser.add_argument("--lag", type=int, default=120, help="the straggler's lag, seconds")
    parser.add_argument("--straggler-share", type=float, default=0.5, help="% of the records")
    parser.add_argument("--percentiles", default="99,99.9")
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    choices: list[float | None] = [None, *(float(p) for p in args.percentiles.split(","))]
    rows = [run(args, choice) for choice in choices]
    exact = rows[0]
    print(
        f"{args.processes} processes + 1 straggler ({args.straggler_share:g} % of the records, "
        f"{args.lag} s behind), {exact['records']:,} records over {args.seconds} s of event "
        f"time, 10 s windows"
    )
    print(
        f"{'watermark':>10} {'windows':>8} {'lag mean s':>11} {'lag p95 s':>10} {'late':>7} "
        f"{'late %':>7} {'lag vs exact':>13}"
    )
    for row in rows:
        ratio = (
            f"{row['lag_mean_s'] / exact['lag_mean_s']:.2f}x"
            if row["lag_mean_s"] and exact["lag_mean_s"]
            else "-"
        )
        print(
            f"{row['watermark']:>10} {row['windows']:>8,} {row['lag_mean_s'] or 0:>11.1f} "
            f"{row['lag_p95_s'] or 0:>10.1f} {row['late']:>7,} {row['late_share'] * 100:>6.2f}% "
            f"{ratio:>13}"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
