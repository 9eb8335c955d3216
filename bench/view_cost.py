"""The live view's cost in pairs of blocks on one running topology: view off, view on.

``bench/throughput.py``'s ``millstream-watched`` row compares whole runs, each with a topology,
topics and keyspace of its own, against ``millstream-strong`` runs; on a shared machine whose
speed moves by 10 to 20 % from run to run, sixteen runs of each resolve a cost of about 5 %,
not the 2 % issue 26 allows. Here one ``millstream-strong`` topology runs throughout (its
``--records`` backlog drained first, to warm it), and the view is started and stopped around
it: ``--pairs`` pairs of blocks, in each pair one block without the view and one with it
served as ``millstream run --ui-port`` serves it (a child process of the driver's) and three
pages open on it (``bench/view_pages.py``; ``--panels``: each with the key intervals open and
one tailing the output, as ``millstream-viewed``). The pairs alternate which block comes
first (off-on, on-off, ...), so a drift in the machine's speed falls on both alike.

``--warmup`` blocks without the view run first, uncounted, in either design (the first
latency phases after the backlog run slower). A block waits ``--settle`` seconds (once the
pages are open, in a block with the view: its start-up is not what a running view costs),
then runs the latency phases (``--rates``, ``--latency-seconds`` each: paced input, injection to a
``read_committed`` reader, as in ``throughput.py``) and a burst of ``--burst`` records
injected at full speed, whose records/s (first injected to last output) is the block's
throughput. The costs are printed as in ``throughput.py``: ratios of the blocks with the
view to those without, each with a 90 % interval from resampling the pairs.

    .venv/bin/python bench/view_cost.py --pairs 12

``--slice SECONDS`` measures in slices instead, finer than blocks: the view and its pages are
started once and then paused (SIGSTOP: no reading, serving or asking, and nothing closed) and
resumed (SIGCONT) every ``SECONDS`` within one long paced phase per rate, ``--pairs`` pairs of
slices in the same alternating order; a record counts for the slice it was injected in, but
not in a slice's first or last ``--guard`` seconds (records then meet batches of both). Then
``--pairs`` pairs of bursts, the view paused for one burst of a pair and running for the
other. A view resumed reads the services at once, as it does every 2 s when running: each
slice with the view has at least the work of one running all along, never less. Drift of the
machine's speed over minutes falls on both sides within seconds.

    .venv/bin/python bench/view_cost.py --slice 10 --pairs 20

Needs the local stack (``millstream up``).
"""

from __future__ import annotations

import argparse
import bisect
import json
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `bench.*` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import inject_events, percentile, process_cpu
from bench.throughput import (
    VIEW_PAGES,
    BacklogRun,
    Bench,
    MillstreamHandle,
    RunResult,
    Viewers,
    backlog_key,
    backlog_run,
    latency_phases,
    no_value,
    output_size,
    run_all,
    start_millstream,
    view_cost,
)
from millstream.engine.config import load_config
from millstream.engine.records import decode_record

__all__ = ["Block", "block_order", "main", "slice_latencies"]


@dataclass
class Block:
    """One block's figures: with the view or without, its latencies and burst throughput."""

    viewed: bool
    result: RunResult
    note: str = ""


def block_order(pairs: int) -> list[bool]:
    """Whether each block runs with the view: pairs alternate which goes first (off-on,
    on-off, ...), so that neither always follows the other."""
    order: list[bool] = []
    for pair in range(pairs):
        order.extend((False, True) if pair % 2 == 0 else (True, False))
    return order


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--records", type=int, default=20_000, help="backlog drained first")
    parser.add_argument("--keys", type=int, default=10_000, help="distinct keys")
    parser.add_argument("--pairs", type=int, default=12, help="pairs of blocks (off, on)")
    parser.add_argument("--rates", default="200,2000", help="events/s of the latency phases")
    parser.add_argument("--latency-seconds", type=float, default=10.0, help="length of each")
    parser.add_argument("--burst", type=int, default=50_000, help="records of a block's burst")
    parser.add_argument("--settle", type=float, default=2.0, help="seconds before measuring")
    parser.add_argument(
        "--warmup", type=int, default=1, help="uncounted blocks without the view, first"
    )
    parser.add_argument(
        "--panels", action="store_true", help="pages with key intervals open and a live tail"
    )
    parser.add_argument(
        "--slice", type=float, help="seconds per slice: pause and resume one view (else blocks)"
    )
    parser.add_argument(
        "--guard", type=float, default=1.5, help="seconds not counted at each end of a slice"
    )
    parser.add_argument("--json", type=Path, help="write the figures to this JSON file")
    args = parser.parse_args(argv)
    if args.slice is not None and not args.slice > 2 * args.guard >= 0:
        parser.error("--slice must be longer than twice the --guard, which must be >= 0")
    args.rates = [float(r) for r in args.rates.split(",") if r.strip()]
    if args.pairs < 2 or args.records < 1 or args.keys < 1 or args.burst < 0 or args.warmup < 0:
        parser.error(
            "--pairs must be at least 2; --records, --keys positive, --burst, --warmup >= 0"
        )
    if not args.rates and not args.burst:
        parser.error("nothing to measure: give --rates or a --burst")
    # What throughput.py's helpers read of its arguments.
    args.profile, args.profile_idle = None, False
    return args


def measure_block(
    bench: Bench, run: BacklogRun, viewed: bool, first: int, panels: bool
) -> tuple[Block, int]:
    """One block from record number ``first``; the block and the next block's ``first``."""
    args = bench.args
    handle = run.handle
    assert isinstance(handle, MillstreamHandle)
    key_of = backlog_key(args.keys)
    result = RunResult("view on" if viewed else "view off")
    if viewed:
        run.viewers = Viewers(run, handle.computation, panels=panels)
    try:
        time.sleep(args.settle)
        result.latency = latency_phases(
            bench, run.config, run.topics, run.watcher, handle, first=first, key_of=key_of
        )
        first += sum(max(1, int(rate * args.latency_seconds)) for rate in args.rates)
        if args.burst:
            result.records_per_s, _ = burst(bench, run, first, key_of)
            first += args.burst
    finally:
        note = ""
        if run.viewers is not None:
            viewers, run.viewers = run.viewers, None
            note = viewers.stop()
    return Block(viewed, result, note), first


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    began = time.monotonic()
    bench = Bench(
        load_config(), args, Path(tempfile.mkdtemp(prefix="millstream-view-cost-")), output_size()
    )
    blocks: list[Block] = []
    try:
        key_of = backlog_key(args.keys)
        with backlog_run(bench, args.records, key_of) as run:
            run.handle = start_millstream(bench, run.topics, run.config)
            records_per_s, _, _ = run.drain(args.records)
            print(f"warm-up backlog of {args.records:,}: {records_per_s:,.0f} records/s")
            first = args.records
            order = block_order(args.pairs)
            for number in range(args.warmup):
                # The first latency phases after the backlog ran slower: not a pair's.
                block, first = measure_block(bench, run, False, first, args.panels)
                print(f"warm-up block {number + 1}/{args.warmup}: not counted", flush=True)
            if args.slice is not None:
                blocks = measure_slices(bench, run, order, first, args.panels)
                order = []  # measured
            for number, viewed in enumerate(order, 1):
                block, first = measure_block(bench, run, viewed, first, args.panels)
                blocks.append(block)
                shown = {
                    f"p50@{rate:g}": percentile(samples, 50)
                    for rate, samples in block.result.latency.items()
                    if samples
                }
                print(
                    f"block {number}/{len(order)} ({block.result.system}): "
                    + (f"{block.result.records_per_s:,.0f} records/s; " if args.burst else "")
                    + ", ".join(f"{k} {v:.0f} ms" for k, v in shown.items())
                    + (f"; {block.note}" if block.note else ""),
                    flush=True,
                )
    finally:
        run_all([bench.close, lambda: shutil.rmtree(bench.root, ignore_errors=True)])
    # Each pair's blocks side by side, as throughput.py pairs its runs.
    off = [b.result for b in blocks if not b.viewed]
    on = [b.result for b in blocks if b.viewed]
    pages = f"{VIEW_PAGES} pages open" + (", panels and a tail" if args.panels else "")
    design = "blocks" if args.slice is None else f"{args.slice:g} s slices and bursts"
    rows = view_cost(
        args, f"{design} with the view ({pages}) / without, in pairs", off, on, system="view-cost"
    )
    print(f"\n(whole run: {time.monotonic() - began:.0f} s)")
    if args.json is not None:
        raw = [
            {"viewed": b.viewed, "records_per_s": b.result.records_per_s,
             "latency": {f"{rate:g}": samples for rate, samples in b.result.latency.items()}}
            for b in blocks
        ]  # fmt: skip
        args.json.write_text(json.dumps({"cost": rows, "blocks": raw}) + "\n")
        print(f"wrote {args.json}")
    return 0 if len(blocks) == 2 * args.pairs else 1


def burst(
    bench: Bench, run: BacklogRun, first: int, key_of: Callable[[int], str]
) -> tuple[float, float]:
    """``--burst`` records from number ``first`` injected at full speed: their records/s,
    first injected to last output, and those seconds."""
    count = bench.args.burst
    handle = run.handle
    assert handle is not None
    before = run.watcher.count()
    started = time.time()
    inject_events(
        run.config, run.topics.source, count, None, keyspace=run.keyspace,
        first=first, key_of=key_of, value_of=no_value,
    )  # fmt: skip
    seconds = run.watcher.wait(before + count, max(300.0, count / 50), handle.check) - started
    return count / seconds, seconds


def measure_slices(
    bench: Bench, run: BacklogRun, order: list[bool], first: int, panels: bool
) -> list[Block]:
    """One view started and paused or resumed per ``order``: a paced phase per rate cut into
    slices, then a burst per entry; the pairs' blocks, each a slice of every rate and a burst."""
    args = bench.args
    handle = run.handle
    assert isinstance(handle, MillstreamHandle)
    key_of = backlog_key(args.keys)
    viewers = run.viewers = Viewers(run, handle.computation, panels=panels)
    results = [RunResult("view on" if viewed else "view off") for viewed in order]
    running = 0.0  # seconds the view ran (not paused) after its settling
    try:
        time.sleep(args.settle)
        cpu_before = process_cpu(viewers.view.pid)
        for rate in args.rates:
            latencies, first, ran = sliced_phase(bench, run, viewers, rate, order, first, key_of)
            running += ran
            for result, samples in zip(results, latencies, strict=True):
                result.latency[rate] = samples
            counted = [len(samples) for samples in latencies]
            print(
                f"{rate:g} events/s in {len(order)} slices of {args.slice:g} s: "
                f"{min(counted)} to {max(counted)} records counted a slice",
                flush=True,
            )
        for number, (result, viewed) in enumerate(zip(results, order, strict=True), 1):
            if not args.burst:
                break
            (viewers.resume if viewed else viewers.pause)()
            time.sleep(args.settle)
            result.records_per_s, seconds = burst(bench, run, first, key_of)
            if viewed:
                running += seconds + args.settle
            first += args.burst
            print(
                f"burst {number}/{len(order)} ({result.system}): "
                f"{result.records_per_s:,.0f} records/s",
                flush=True,
            )
        cpu_after = process_cpu(viewers.view.pid)
    finally:
        run.viewers = None
        note = viewers.stop()
    print(note)
    if cpu_before is not None and cpu_after is not None and running:
        print(
            f"the view's process: {cpu_after - cpu_before:.1f} s of CPU over {running:.0f} s "
            f"running ({100 * (cpu_after - cpu_before) / running:.1f} % of one core)"
        )
    return [Block(viewed, result) for result, viewed in zip(results, order, strict=True)]


def sliced_phase(
    bench: Bench,
    run: BacklogRun,
    viewers: Viewers,
    rate: float,
    order: list[bool],
    first: int,
    key_of: Callable[[int], str],
) -> tuple[list[list[float]], int, float]:
    """Paced input at ``rate`` through ``len(order)`` slices of ``--slice`` seconds, the view
    running or paused in each as ``order`` says: the latencies (ms) counted in each slice,
    the next record's number, and the seconds the view ran."""
    args = bench.args
    handle = run.handle
    assert handle is not None
    lead = 2.0  # seconds of input before the first slice: the injector's start is not one
    count = int(rate * (lead + args.slice * len(order) + args.guard))
    before = run.watcher.count()
    failures: list[BaseException] = []

    def inject() -> None:
        try:
            inject_events(
                run.config, run.topics.source, count, rate, keyspace=run.keyspace,
                first=first, key_of=key_of, value_of=no_value,
            )  # fmt: skip
        except BaseException as exc:  # raised again on the measuring thread
            failures.append(exc)

    (viewers.resume if order[0] else viewers.pause)()
    injector = threading.Thread(target=inject, name=f"inject-{rate:g}", daemon=True)
    injector.start()
    time.sleep(lead)
    began = time.monotonic()
    boundaries: list[int] = []  # µs, wall clock: when each slice began, then when the last ended
    for number, viewed in enumerate(order):
        (viewers.resume if viewed else viewers.pause)()
        boundaries.append(time.time_ns() // 1_000)
        time.sleep(max(0.0, began + (number + 1) * args.slice - time.monotonic()))
    boundaries.append(time.time_ns() // 1_000)
    viewers.resume()
    injector.join()
    if failures:
        raise failures[0]
    run.watcher.wait(before + count, max(120.0, count / 20), handle.check)
    time.sleep(0.3)
    samples = []
    for message in run.watcher.messages[before:]:
        injected = decode_record(message.value).timestamp  # µs: the injection time
        samples.append((injected, message.seen - injected / 1_000))
    latencies = slice_latencies(samples, boundaries, int(args.guard * 1_000_000))
    return latencies, first + count, args.slice * sum(order)


def slice_latencies(
    samples: Sequence[tuple[int, float]], boundaries: Sequence[int], guard: int
) -> list[list[float]]:
    """``samples`` of (injection time, latency) sorted into the slices between consecutive
    ``boundaries`` (all µs) by injection time, leaving out those within ``guard`` µs of
    either end of their slice."""
    slices: list[list[float]] = [[] for _ in boundaries[1:]]
    for injected, latency in samples:
        at = bisect.bisect_right(boundaries, injected) - 1
        if 0 <= at < len(slices) and (
            boundaries[at] + guard <= injected <= boundaries[at + 1] - guard
        ):
            slices[at].append(latency)
    return slices


if __name__ == "__main__":
    sys.exit(main())
