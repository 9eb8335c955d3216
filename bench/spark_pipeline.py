"""Latency and throughput of a two-stage pipeline on the Spark runner, against the bare floor.

Three runs on the local stack, each on fresh topics and keyspace:

* ``floor``: Spark alone, Kafka → ``foreachBatch`` → Kafka, doing nothing else;
* ``strong``: the runner with strong productions and exactly-once on (the defaults);
* ``weak``: weak productions and exactly-once off (paper 6.1.3).

Each run first injects ``--rate`` events/s for ``--seconds`` and measures per-stage latency from
Kafka timestamps: stage 1 = its production's append time minus the event's injection time,
stage 2 = its production's append time minus stage 1's (the ``floor`` has one stage). Then it
injects a ``--backlog`` at once and measures throughput (events/s through all stages, from the
injector's first poll). Events come from one injector per run (``bench.harness.inject_events``),
which reports watermarks as every injector does; the floor ignores them.
Ratios to the floor are printed at the end. Runtime: about two minutes with the defaults.

    python bench/spark_pipeline.py [--rate 50] [--seconds 10] [--backlog 2000]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

if __package__ in (None, ""):  # run as a script: make `bench.harness` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import (
    Injection,
    append_time,
    caught_up,
    delete_topics_containing,
    drop_keyspace,
    floor_query,
    inject_events,
    injection_time,
    latencies,
    percentiles,
    read_times,
    settle_compactions,
    wait_for,
)
from millstream.connectors import kafka as kafka_connector
from millstream.engine.computation import Computation
from millstream.engine.config import MillstreamConfig, load_config
from millstream.engine.context import Context
from millstream.engine.records import Record
from millstream.engine.topology import ComputationOptions, Topology
from millstream.spark.runner import ProcessingTime, RunningTopology, run_topology
from millstream.spark.session import spark_session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

INTERVALS = 8
TRIGGER_SECONDS = 0.2


class Stage(Computation):
    """Passes each event on, keyed by ``field`` of its value; the value names the event."""

    def __init__(self, output: str, by_user: bool) -> None:
        self.output = output
        self.by_user = by_user

    def process_record(self, ctx: Context, record: Record) -> None:
        count = ctx.state(_INT)
        count.set(count.get(0) + 1)
        origin = record.value[:16]
        key = f"user-{origin[0] % 50}" if self.by_user else f"query-{origin[1] % 20}"
        ctx.produce(self.output, origin, record.timestamp, key=key)


class _IntCodec:
    def encode(self, value: int, /) -> bytes:
        return value.to_bytes(8, "big")

    def decode(self, data: bytes, /) -> int:
        return int.from_bytes(data, "big")


_INT = _IntCodec()


@dataclass
class Result:
    mode: str
    stage_latencies: list[list[float]]  # per stage, ms
    throughput: float


def floor_run(
    config: MillstreamConfig, spark: SparkSession, args: argparse.Namespace, root: Path
) -> Result:
    suffix = uuid.uuid4().hex[:8]
    source, sink = f"bench_in_{suffix}", f"bench_out_{suffix}"
    keyspace = f"bench_{suffix}"  # only the injector's checkpoint
    settle_compactions(config)  # not during the one the mode before left (its DROP)
    kafka_connector.create_topics(config, [source, sink], partitions=2)
    query = floor_query(spark, config, source, sink, str(root / f"floor-{suffix}"), TRIGGER_SECONDS)
    reader = kafka_connector.consumer(config, "bench-offsets")
    try:
        count = int(args.rate * args.seconds)
        inject(config, source, count, args.rate, keyspace, "floor")
        wait_for(lambda: caught_up(query, reader, [source]), 120, "the floor query catching up")
        injected = read_times(config, source, count, 30, injection_time)
        out = read_times(config, sink, count, 30, append_time)
        stage = latencies(out, injected)
        backlog = inject(config, source, args.backlog, None, keyspace, "floor", first=count)
        wait_for(lambda: caught_up(query, reader, [source]), 300, "the floor backlog")
        throughput = args.backlog / (time.monotonic() - backlog.started)
    finally:
        reader.close()
        query.stop()
        delete_topics_containing(config, suffix)
        drop_keyspace(config, keyspace)
    return Result("floor", [stage], throughput)


def runner_run(
    mode: str,
    options: ComputationOptions,
    config: MillstreamConfig,
    spark: SparkSession,
    args: argparse.Namespace,
    root: Path,
) -> tuple[Result, RunningTopology]:
    suffix = uuid.uuid4().hex[:8]
    source, middle, sink = f"bench_in_{suffix}", f"bench_mid_{suffix}", f"bench_out_{suffix}"
    keyspace = f"bench_{suffix}"
    settle_compactions(config)  # not during the one the mode before left (its DROP)
    topology = Topology(f"bench_{suffix}", streams=[source])
    topology.add_computation(
        f"stage1_{suffix}", Stage(middle, True), inputs=[source], outputs=[middle], options=options
    )
    topology.add_computation(
        f"stage2_{suffix}", Stage(sink, False), inputs=[middle], outputs=[sink], options=options
    )
    running = run_topology(
        topology,
        config,
        replace(config.run, keyspace=keyspace, checkpoint_root=root),
        trigger=ProcessingTime(TRIGGER_SECONDS),
        spark=spark,
    )
    stage2 = f"stage2_{suffix}"

    def processed(total: int) -> Callable[[], bool]:
        def check() -> bool:
            running.raise_failure()
            done = running.metrics().get(stage2)
            return done is not None and done.processed >= total

        return check

    try:
        count = int(args.rate * args.seconds)
        inject(config, source, count, args.rate, keyspace, mode)
        wait_for(processed(count), 180, f"{mode}: stage 2 catching up")
        injected = read_times(config, source, count, 30, injection_time)
        first = read_times(config, middle, count, 30, append_time)
        second = read_times(config, sink, count, 30, append_time)
        stages = [latencies(first, injected), latencies(second, first)]
        backlog = inject(config, source, args.backlog, None, keyspace, mode, first=count)
        wait_for(processed(count + args.backlog), 300, f"{mode}: the backlog")
        throughput = args.backlog / (time.monotonic() - backlog.started)
        print(f"  {mode}: watermarks at the end (behind the last event's time):")
        for line in running.explain(stage2):
            print(f"    {line}")
    finally:
        running.stop()
        delete_topics_containing(config, suffix)
        drop_keyspace(config, keyspace)
    return Result(mode, stages, throughput), running


def inject(
    config: MillstreamConfig,
    stream: str,
    count: int,
    rate: float | None,
    keyspace: str,
    mode: str,
    first: int = 0,
) -> Injection:
    """One phase's events, by the same injector in every mode; prints its rate. Throughput
    counts from its first poll: connecting the injector (Cassandra, Kafka) is not counted."""
    injection = inject_events(config, stream, count, rate, keyspace=keyspace, first=first)
    print(f"  {mode}: injected {count} events at {injection.rate:,.0f} events/s")
    return injection


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=50.0, help="events/s in the latency phase")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of that phase")
    parser.add_argument("--backlog", type=int, default=2000, help="events of the throughput phase")
    parser.add_argument("--batches", action="store_true", help="print every batch's metrics")
    args = parser.parse_args(argv)
    # A watermark topic of its own, removed at the end.
    config = replace(
        load_config(), kafka_watermark_topic=f"bench_watermarks_{uuid.uuid4().hex[:8]}"
    )
    spark = spark_session(config, app_name="millstream-bench")
    root = Path(tempfile.mkdtemp(prefix="millstream-bench-"))
    results: list[Result] = []
    try:
        results.append(floor_run(config, spark, args, root))
        for mode, options in (
            ("strong", ComputationOptions(key_intervals=INTERVALS)),
            (
                "weak",
                ComputationOptions(
                    key_intervals=INTERVALS, strong_productions=False, exactly_once=False
                ),
            ),
        ):
            result, running = runner_run(mode, options, config, spark, args, root)
            results.append(result)
            for name, metrics in sorted(running.metrics().items()):
                batches = running.batches(name)
                if args.batches:
                    for b in batches:
                        print(
                            f"    batch {b.batch_id}: {b.seconds:.2f} s, {b.inputs} inputs, "
                            f"{b.intervals} intervals ({b.rescans} rescans), "
                            f"watermarks {b.watermark_seconds:.2f} s"
                        )
                seconds = sum(b.seconds for b in batches)
                on_watermarks = sum(b.watermark_seconds for b in batches)
                print(
                    f"  {mode} {name}: {on_watermarks:.1f} s of {seconds:.1f} s in batches "
                    "went to watermarks"
                )
                print(
                    f"  {mode} {name}: {metrics.batches} batches, cache hit rate "
                    f"{metrics.cache_hit_rate:.0%} ({metrics.cache_hits}/{metrics.intervals}), "
                    f"{metrics.late} late"
                )
    finally:
        spark.stop()
        shutil.rmtree(root, ignore_errors=True)
        kafka_connector.delete_wake_topics(config)
        kafka_connector.delete_topics(config, [config.kafka_watermark_topic])
    floor = results[0]
    print(
        f"\nlatency at {args.rate:g} events/s, trigger {TRIGGER_SECONDS} s; throughput of a "
        f"{args.backlog}-event backlog"
    )
    for result in results:
        for number, stage in enumerate(result.stage_latencies, 1):
            print(f"  {result.mode:6} stage {number}: {percentiles(stage)}")
        print(f"  {result.mode:6} throughput: {result.throughput:8.0f} events/s")
    floor_p50 = statistics.median(floor.stage_latencies[0])
    for result in results[1:]:
        p50s = [statistics.median(stage) for stage in result.stage_latencies if stage]
        print(
            f"  {result.mode}/floor: per-stage p50 latency x"
            f"{', x'.join(f'{p / floor_p50:.1f}' for p in p50s)}, "
            f"throughput x{result.throughput / floor.throughput:.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
