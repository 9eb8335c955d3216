"""Key intervals by load: a skewed keyed count before and after millstream balances it.

**Workload.** Records over ``--keys`` (2,000) keys drawn from a Zipf distribution (exponent
``--zipf``, 1.1) whose head is *one hot key range*: the most popular ranks go to the keys that
hash into interval 0 of ``--intervals`` (8) starting intervals, so about four fifths of the
records land in that one interval (printed). Each is a millstream record as in
``bench/throughput.py`` (same injector, same ``Count`` computation: one output per input, with
the key's new count), on a fresh 2-partition topic; the same sequence of keys every run.
Every system spends ``--work-us`` (5,000) µs of CPU on each record besides, as a costly
computation (a model) would: that is the load a hot range concentrates on one core. The less
work per record, the less balancing gains on 2 cores, where Cassandra, Kafka and Spark's JVM
take the rest of the CPU (measured: 1.34x at 5 ms, 1.09x at 2 ms, 1.06x at 0.5 ms); with
``--work-us 0`` (a bare count) a batch costs its round trips, not its records, and splitting
only adds intervals, each with its LWTs per batch: balancing lost there (0.71x).

| row | what |
|---|---|
| ``spark-floor`` | Spark Kafka → ``foreachBatch`` → Kafka, no state (at-least-once) |
| ``spark-tws`` | ``transformWithStateInPandas``, RocksDB state, Kafka sink (at-least-once) |
| ``quix`` | Quix Streams 3, exactly-once, RocksDB |
| ``millstream-static`` | exactly-once, strong productions, ``--intervals`` fixed intervals |
| ``millstream-balanced`` | the same, ``ComputationOptions.rebalance`` on (below) |

With ``rebalance`` an interval whose task spent more than a quarter of a batch's CPU on it
splits (``split_cpu_seconds``), cold neighbours merge, and intervals are spread over the
tasks by load.

Peers drain one backlog of ``--records``; their records/s is measured as in
``bench/throughput.py`` (from the first batch that read input to the last output in the
output topic). Each millstream row drains **two** backlogs of ``--records`` in one run, its
micro-batches capped at ``--batch`` records (``maxOffsetsPerTrigger``, so that there are batches
between which to rebalance; the peers take a backlog in one batch): *phase 1* is the fresh
layout (the balanced row splits as it goes), *phase 2* the layout phase 1 left (settled:
balanced). Phase 2's records/s runs from the start of its injection to its last output.
Then **latency**: paced input at ``--rate`` records/s (default: 80 % of the static row's
phase-2 throughput, so the static layout runs near its limit) for ``--latency-seconds``;
latency = output append time - event time (injection time), p50 and p95. The *check* column
says whether each key's counts 1..n came exactly once (the peers' too); the notes give the
layout each millstream row ended with and the Python workers' CPU (how evenly the two cores
worked).

Run with Kafka and Cassandra up (``millstream up``) and the bench extras installed::

    .venv/bin/python -m pip install -e '.[test,bench]'
    .venv/bin/python bench/rebalance.py [--records 4000] [--batch 500] [--work-us 5000]
        [--only ...] [--json out.json]

About 3½ minutes on 2 cores (plus a minute the first time for Quix's virtualenv).
"""

from __future__ import annotations

import argparse
import bisect
import hashlib
import json
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `bench.*` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import cpu_note, inject_events, percentile, python_worker_cpu
from bench.throughput import (
    BY_NAME,
    PARTITIONS,
    TRIGGER_SECONDS,
    Bench,
    Count,
    MillstreamHandle,
    backlog_run,
    check_outputs,
    failure,
    latency_phases,
    no_value,
    output_size,
    peer_python,
    run_all,
    start_floor,
    start_peer,
    start_tws,
)
from millstream.engine.config import load_config
from millstream.engine.layout import IntervalLayout
from millstream.engine.rebalance import RebalancePolicy
from millstream.engine.topology import ComputationOptions, Topology
from millstream.spark.runner import ProcessingTime, run_topology

PEERS = ("spark-floor", "spark-tws", "quix")
MILLSTREAM = ("millstream-static", "millstream-balanced")
NAMES = (*PEERS, *MILLSTREAM)


class SkewedKeys:
    """``key_of(n)`` for the injector: a Zipf draw whose popular ranks are the keys of one
    hash range (interval 0 of ``intervals``), deterministic in ``n``."""

    def __init__(self, keys: int, exponent: float, intervals: int) -> None:
        layout = IntervalLayout.initial(intervals)
        names = [f"k{n}" for n in range(keys)]
        hot = [k for k in names if layout.interval_of(k) == 0]
        ranked = hot + [k for k in names if layout.interval_of(k) != 0]
        weights = [1.0 / (rank + 1) ** exponent for rank in range(keys)]
        total = sum(weights)
        self.names = ranked
        self.cumulative: list[float] = []
        running = 0.0
        for weight in weights:
            running += weight / total
            self.cumulative.append(running)
        self.hot_keys = len(hot)
        self.hot_share = self.cumulative[len(hot) - 1] if hot else 0.0

    def __call__(self, n: int) -> str:
        digest = hashlib.blake2b(n.to_bytes(8, "little"), digest_size=8).digest()
        u = int.from_bytes(digest, "little") / 2**64
        return self.names[min(bisect.bisect_left(self.cumulative, u), len(self.names) - 1)]


@dataclass
class Result:
    system: str
    phases: list[float] = field(default_factory=list)  # records/s per backlog
    latency_ms: list[float] = field(default_factory=list)
    rate: float | None = None
    check: str = ""
    error: str | None = None
    notes: list[str] = field(default_factory=list)


def options(balanced: bool, args: argparse.Namespace) -> ComputationOptions:
    if not balanced:
        return ComputationOptions(key_intervals=args.intervals)
    # Split an interval that took more than a quarter of a batch's CPU (so the two cores'
    # tasks can share the hot range), or, without costly records, an eighth of its records;
    # merge what carries less than a sixty-fourth. Every interval costs its LWTs per batch,
    # so splitting further than the cores can use only adds them.
    batch_cpu = args.work_us * args.batch / 1e6
    return ComputationOptions(
        key_intervals=args.intervals,
        rebalance=RebalancePolicy(
            split_records=args.batch if batch_cpu else max(1, args.batch // 8),
            merge_records=args.batch // 64,
            max_intervals=64,
            split_cpu_seconds=batch_cpu / 4 if batch_cpu else None,
        ),
    )


def measure_millstream(bench: Bench, name: str, keys: SkewedKeys, rate: float | None) -> Result:
    """Two backlogs through one run of the topology, then the latency phase."""
    args = bench.args
    result = Result(name)
    try:
        with backlog_run(bench, args.records, keys) as run:
            bench.spark()
            suffix = run.topics.suffix
            computation = f"count_{suffix}"
            topology = Topology(f"tp_{suffix}", streams=[run.topics.source])
            topology.add_computation(
                computation,
                Count(run.topics.sink, args.work_us),
                inputs=[run.topics.source],
                outputs=[run.topics.sink],
                options=options(name == "millstream-balanced", args),
            )
            cpu_before = python_worker_cpu()
            started = time.time()
            settings = replace(
                run.config.run,
                keyspace=run.keyspace,
                checkpoint_root=bench.root / f"millstream-{suffix}",
                partitions=PARTITIONS,
                max_offsets_per_trigger=args.batch,
            )
            running = run_topology(
                topology,
                run.config,
                settings,
                trigger=ProcessingTime(TRIGGER_SECONDS),
                spark=bench.spark(),
            )
            run.handle = handle = MillstreamHandle(running, computation, run.topics.source)
            result.phases.append(run.drain(args.records)[0])
            after_first = running.layout(computation)
            second = time.time()
            inject_events(
                run.config, run.topics.source, args.records, None, keyspace=run.keyspace,
                first=args.records, key_of=keys, value_of=no_value,
            )  # fmt: skip
            done = run.watcher.wait(2 * args.records, max(300.0, args.records / 20), handle.check)
            result.phases.append(args.records / (done - second))
            result.notes.append(cpu_note(cpu_before, python_worker_cpu(), done - started))
            result.notes.append(
                f"{len(running.batches(computation))} batches; intervals: {args.intervals} at "
                f"the start, {len(after_first.ids)} after backlog 1, "
                f"{len(running.layout(computation).ids)} after backlog 2"
            )
            time.sleep(0.5)  # let stragglers (duplicates) show before checking
            result.check = check_outputs(
                BY_NAME["millstream-strong"], run.watcher.messages, 2 * args.records, keys
            )
            # Without --rate: 80 % of the row's own backlog-2 throughput (the static row's is
            # then used for the balanced row too, which runs after it).
            rate = rate or round(0.8 * result.phases[1])
            samples = latency_phases(
                bench, run.config, run.topics, run.watcher, handle,
                rates=[rate], first=2 * args.records, key_of=keys,
            )  # fmt: skip
            result.rate, result.latency_ms = rate, samples[rate]
    except Exception as exc:
        result.error = failure(name, exc)
    return result


def measure_peer(bench: Bench, name: str, keys: SkewedKeys) -> Result:
    """One backlog, as ``bench/throughput.py`` measures the peers."""
    args = bench.args
    result = Result(name)
    try:
        with backlog_run(bench, args.records, keys) as run:
            python = peer_python(bench, name)
            if name.startswith("spark"):
                bench.spark()
            cpu_before = python_worker_cpu()
            started = time.time()
            if name == "spark-floor":
                run.handle = start_floor(bench, run.topics)
            elif name == "spark-tws":
                run.handle = start_tws(bench, run.topics, args.work_us)
            else:
                run.handle = start_peer(bench, run.topics, "quix", python, args.work_us)
            records_per_s, _, done = run.drain(args.records)
            result.phases.append(records_per_s)
            if name.startswith("spark"):
                result.notes.append(cpu_note(cpu_before, python_worker_cpu(), done - started))
            time.sleep(0.5)
            result.check = check_outputs(BY_NAME[name], run.watcher.messages, args.records, keys)
    except Exception as exc:
        result.error = failure(name, exc)
    return result


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--records", type=int, default=4_000, help="records per backlog")
    parser.add_argument("--keys", type=int, default=2_000, help="distinct keys")
    parser.add_argument("--zipf", type=float, default=1.1, help="Zipf exponent of the keys")
    parser.add_argument("--intervals", type=int, default=8, help="starting key intervals")
    parser.add_argument("--batch", type=int, default=500, help="records per micro-batch")
    parser.add_argument(
        "--work-us", type=float, default=5_000, help="CPU µs of work per record (0: a bare count)"
    )
    parser.add_argument("--rate", type=float, help="records/s of the latency phase")
    parser.add_argument("--latency-seconds", type=float, default=10.0)
    parser.add_argument("--only", default="", help=f"comma-separated subset of {NAMES}")
    parser.add_argument("--json", type=Path, help="write the figures to this JSON file")
    parser.add_argument("--quix-python", help="Python of a virtualenv with quixstreams 3")
    args = parser.parse_args(argv)
    args.only = [n.strip() for n in args.only.split(",") if n.strip()] or list(NAMES)
    unknown = sorted(set(args.only) - set(NAMES))
    if unknown:
        parser.error(f"unknown --only names {unknown}; choose from {NAMES}")
    if min(args.records, args.keys, args.intervals, args.batch) < 1 or args.zipf <= 0:
        parser.error("--records, --keys, --intervals, --batch and --zipf must be positive")
    if args.work_us < 0:
        parser.error("--work-us must not be negative")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    began = time.monotonic()
    keys = SkewedKeys(args.keys, args.zipf, args.intervals)
    print(
        f"{args.keys:,} keys, Zipf {args.zipf}: the {keys.hot_keys} keys of interval 0 of "
        f"{args.intervals} carry {keys.hot_share:.0%} of the records",
        flush=True,
    )
    bench = Bench(
        load_config(), args, Path(tempfile.mkdtemp(prefix="millstream-rebalance-")), output_size()
    )
    results: dict[str, Result] = {}
    try:
        rate = args.rate
        for name in [n for n in NAMES if n in args.only]:
            print(name, flush=True)
            if name in MILLSTREAM:
                result = measure_millstream(bench, name, keys, rate)
                rate = rate or result.rate  # the static row's sets the balanced row's
            else:
                result = measure_peer(bench, name, keys)
            results[name] = result
            print(
                f"  records/s: {', '.join(f'{p:,.0f}' for p in result.phases) or '-'}; "
                f"check: {result.error or result.check}"
                + "".join(f"; {note}" for note in result.notes),
                flush=True,
            )
    finally:
        run_all([bench.close, lambda: shutil.rmtree(bench.root, ignore_errors=True)])
    rows = report(args, results)
    print(f"\n(whole run: {time.monotonic() - began:.0f} s)")
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 1 if any(r.error or r.check != "ok" for r in results.values()) else 0


def report(args: argparse.Namespace, results: dict[str, Result]) -> list[dict[str, Any]]:
    """Print the table (records/s of each backlog, ratios to the peers and to the static
    row, latency) and return its rows."""
    final = {name: r.phases[-1] for name, r in results.items() if r.phases}
    print(
        f"\nskewed keyed count: {args.records:,} records per backlog over {args.keys:,} keys; "
        f"millstream batches of {args.batch:,}; x<row> = records/s of the last backlog / that "
        "row's"
    )
    columns = [n for n in NAMES if n in final]
    header = (
        f"{'system':<20} {'backlog 1':>10} {'backlog 2':>10} "
        + " ".join(f"{'x' + n.split('-')[-1]:>9}" for n in columns)
        + f" {'rate/s':>7} {'p50 ms':>7} {'p95 ms':>7}  check"
    )
    print(header)
    print("-" * len(header))
    rows = []
    for name, result in results.items():
        phases = [f"{p:>10,.0f}" for p in result.phases] + [f"{'-':>10}"] * 2
        value = final.get(name)
        ratios = " ".join(
            f"{value / final[c]:>9.2f}" if value is not None else f"{'-':>9}" for c in columns
        )
        p50 = percentile(result.latency_ms, 50) if result.latency_ms else None
        p95 = percentile(result.latency_ms, 95) if result.latency_ms else None
        latency = (
            f"{result.rate:>7,.0f} {p50:>7,.0f} {p95:>7,.0f}"
            if p50 is not None and p95 is not None and result.rate is not None
            else f"{'-':>7} {'-':>7} {'-':>7}"
        )
        print(
            f"{name:<20} {phases[0]} {phases[1]} {ratios} {latency}  {result.error or result.check}"
        )
        rows.append(
            {
                "system": name,
                "records_per_s": result.phases,
                "rate": result.rate,
                "p50_ms": p50,
                "p95_ms": p95,
                "check": result.check,
                "error": result.error,
                "notes": result.notes,
            }
        )
    static, balanced = final.get("millstream-static"), final.get("millstream-balanced")
    if static and balanced:
        print(f"\nbalanced / static, backlog 2: {balanced / static:.2f}x records/s")
    return rows


if __name__ == "__main__":
    raise SystemExit(main())
