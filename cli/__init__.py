"""The ``millstream`` command.

::

    millstream up        start local Kafka + Cassandra (reuses running ones)
    millstream status    pid, address, health and memory of each
    millstream down      stop them by pid
                         (each with --nodes 3: the replicated stack on 127.0.0.2-4;
                         with --secure: the secured single node on 127.0.0.5)
    millstream jars      the Spark Kafka connector jars, comma separated, for spark-submit --jars
    millstream run MODULE:TOPOLOGY [options]
                         run a topology on Spark (see millstream.spark.runner);
                         MODULE is imported from the working directory or PYTHONPATH,
                         TOPOLOGY is a Topology or a zero-argument callable returning one
    millstream produce STREAM [options]
                         send JSON lines from stdin to a stream, one record each
                         ({"key": ..., "value": ..., "timestamp": µs, "id": ...})
    millstream watermarks [--json]
                         every source's low watermark, lag and what holds it
    millstream tail STREAM [options]
                         print a stream's records as JSON lines
                         (see millstream.connectors.streams)
    millstream state COMPUTATION KEY [options]
                         a key's state and timers, its interval's sequencer and pending
                         productions, from Cassandra (see millstream.connectors.state_view)

Settings (ports, data directory) come from :mod:`millstream.engine.config`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from millstream.engine.config import load_config
from millstream.engine.errors import MillstreamError

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="millstream", description=__doc__.split("::")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name, purpose in (
        ("up", "start the local Kafka and Cassandra"),
        ("status", "report the local services"),
        ("down", "stop the local services"),
    ):
        local = commands.add_parser(name, help=purpose)
        which = local.add_mutually_exclusive_group()
        which.add_argument(
            "--secure",
            action="store_true",
            help="the secured single-node stack on 127.0.0.5: Kafka over SASL_SSL "
            "(SCRAM-SHA-512), Cassandra with a password and TLS (data, CA and credentials in "
            "<home>/secure/)",
        )
        which.add_argument(
            "--nodes",
            type=int,
            choices=(1, 3),  # stack.NODE_COUNTS, not imported for --help
            default=1,
            help="1: the single-node stack on 127.0.0.1 (default); 3: the replicated stack, "
            "three Cassandra nodes and three Kafka brokers on 127.0.0.2-4 (replication 3)",
        )
    commands.add_parser(
        "jars", help="print the Spark Kafka connector jars (resolved by Maven) for --jars"
    )
    run = commands.add_parser("run", help="run a topology on Spark Structured Streaming")
    run.add_argument("target", metavar="MODULE:TOPOLOGY")
    run.add_argument("--keyspace", default="millstream", help="Cassandra keyspace of the state")
    run.add_argument(
        "--checkpoint-root", type=Path, default=None, help="default: <home>/checkpoints"
    )
    when = run.add_mutually_exclusive_group()
    when.add_argument(
        "--available-now", action="store_true", help="process what the topics hold, then exit"
    )
    when.add_argument(
        "--processing-time", type=float, default=1.0, help="seconds between micro-batches"
    )
    run.add_argument("--partitions", type=int, default=2, help="partitions of created topics")
    run.add_argument("--max-offsets-per-trigger", type=int, default=None)
    run.add_argument(
        "--no-create-keyspace",
        action="store_true",
        help="the keyspace exists (by default a development keyspace is created if missing)",
    )
    run.add_argument(
        "--metrics-port",
        default="0",
        metavar="[ADDRESS:]PORT",
        help="serve Prometheus metrics at http://ADDRESS:PORT/metrics (ADDRESS defaults to "
        "127.0.0.1; 0, the default: off)",
    )
    produce = commands.add_parser(
        "produce", help="send JSON lines from stdin to a stream, one record each"
    )
    produce.add_argument("stream", metavar="STREAM")
    produce.add_argument(
        "--source",
        default="stdin",
        metavar="NAME",
        help="names the input: record IDs derive from it, so re-sending an input under the "
        "same name is deduplicated downstream (default: stdin)",
    )
    produce.add_argument(
        "--partitions",
        type=_positive,
        default=2,
        metavar="N",
        help="partitions of the topic if it is created (default: 2)",
    )
    produce.add_argument(
        "--report-watermark",
        action="store_true",
        help="then report a low watermark just past the newest timestamp sent, as source "
        "injector/produce-SOURCE/0 (it holds the stream there until it reports again)",
    )
    tail = commands.add_parser("tail", help="print a stream's records as JSON lines")
    tail.add_argument("stream", metavar="STREAM")
    tail.add_argument(
        "--from-beginning", action="store_true", help="start at the oldest record, not the end"
    )
    tail.add_argument(
        "--follow", action="store_true", help="keep printing new records until Ctrl-C"
    )
    tail.add_argument("--dedup", action="store_true", help="print each record ID once")
    tail.add_argument(
        "--max", type=_positive, default=None, metavar="N", help="stop after N records"
    )
    tail.add_argument(
        "--value",
        choices=("text", "json", "hex"),  # streams.VALUE_FORMATS, not imported for --help
        default="text",
        help="how to print values: UTF-8 text, parsed JSON, or hex (default: text)",
    )
    watermarks = commands.add_parser(
        "watermarks",
        help="every source's low watermark, its lag and what holds it (from the watermark topic)",
    )
    watermarks.add_argument("--json", action="store_true", help="one JSON object per source")
    state = commands.add_parser(
        "state", help="a key's state, timers and its interval's pending productions (Cassandra)"
    )
    state.add_argument("computation", metavar="COMPUTATION")
    state.add_argument("key", metavar="KEY")
    state.add_argument("--keyspace", default="millstream", help="Cassandra keyspace of the state")
    where = state.add_mutually_exclusive_group()
    where.add_argument(
        "--topology",
        metavar="MODULE:TOPOLOGY",
        help="take the computation's key intervals from its topology (and register the Avro "
        "schemas its module registers); default: look in every interval of the computation",
    )
    where.add_argument(
        "--intervals", type=_positive, metavar="N", help="the computation's key_intervals"
    )
    state.add_argument(
        "--codec",
        choices=("auto", "json", "int", "text", "hex"),  # state_view.STATE_CODECS
        default="auto",
        help="how to show the state (default auto: Avro with a registered schema, JSON, "
        "text, else hex)",
    )
    state.add_argument(
        "--value",
        choices=("text", "json", "hex"),
        default="text",
        help="how to show pending productions' values, as for tail (default: text)",
    )
    state.add_argument("--json", action="store_true", help="print one JSON object")
    prove = commands.add_parser(
        "prove",
        help="run a workload on the local stack under a seeded fault schedule and check that "
        "nothing was lost or duplicated (the proving ground)",
    )
    prove.add_argument(
        "--tier", choices=("ci", "t1", "t2"), default="ci", help="the run's size (default: ci)"
    )
    prove.add_argument("--seed", type=int, default=1, help="the fault schedule's seed")
    prove.add_argument(
        "--nodes",
        type=int,
        choices=(1, 3),
        default=1,
        help="run on the single-node stack (default) or on the replicated one (millstream up "
        "--nodes 3), where the Kafka and Cassandra faults kill one node of three",
    )
    prove.add_argument(
        "--repeat", type=_positive, default=1, metavar="N", help="N runs, seeds SEED..SEED+N-1"
    )
    prove.add_argument(
        "--faults",
        default=None,
        metavar="KIND,...",
        help="only these faults (default: the tier's; docs/guides/proving-ground.md lists them)",
    )
    prove.add_argument("--records", type=_positive, default=None, help="override the tier's")
    prove.add_argument("--keys", type=_positive, default=None, help="override the tier's")
    prove.add_argument(
        "--faults-per-kind", type=_positive, default=None, help="override the tier's"
    )
    prove.add_argument(
        "--keep", action="store_true", help="keep the run's topics, keyspace and directory"
    )
    prove.add_argument("--json", type=Path, default=None, help="also write the reports here")
    args = parser.parse_args(argv)
    if args.command == "prove":
        return _prove(args)
    if args.command == "state":
        return _state(args)
    if args.command == "run":
        return _run(args)
    if args.command == "watermarks":
        return _watermarks(args)
    if args.command in ("produce", "tail"):
        return _streams(args)

    started = time.monotonic()

    def progress(message: str) -> None:
        # One write per line: nodes starting in parallel threads report at once.
        line = f"[{time.monotonic() - started:6.1f}s] {message}\n"
        print(line, end="", file=sys.stderr, flush=True)

    try:
        # Imported here so `millstream --help` stays fast and free of driver imports.
        from millstream.devtools.local.stack import LocalStack

        config = load_config()
        if args.command == "jars":
            from millstream.spark.session import local_connector_jars

            print(",".join(str(jar) for jar in local_connector_jars(config, progress)))
            return 0
        stack = LocalStack(config, progress, nodes=args.nodes, secure=args.secure)
        replicated = args.nodes > 1
        width = max(10, *(len(service.name) for service in stack.services))
        if args.command == "up":
            statuses = stack.up()
            if args.secure:
                client = stack.client_config()
                data = config.home / "secure"
                print(f"millstream secured local stack is up (data and credentials in {data}):")
            elif replicated:
                # The cluster is not where the configuration points: say so.
                client = stack.client_config()
                data = config.home / "cluster"
                print(f"millstream local {args.nodes}-node cluster is up (data in {data}):")
            else:
                client = config
                print(f"millstream local stack is up (data in {config.home}):")
            for status in statuses:
                print(f"  {status.describe(width)}")
            print(f"  kafka bootstrap: {client.kafka_bootstrap}")
            hosts = ",".join(client.cassandra_hosts)
            print(f"  cassandra contact points: {hosts} port {client.cassandra_port}")
            if replicated:
                variables = stack.client_environment()
                print("To use it, export these settings:")
                print("export " + " ".join(f"{k}={v}" for k, v in variables.items()))
            if args.secure:
                print("To use it, run these lines (the passwords are read from their files):")
                for line in stack.client_exports():
                    print(line)
                print("In Python: LocalStack(load_config(), print, secure=True).client_config()")
            return 0
        if args.command == "status":
            statuses = stack.status()
            for status in statuses:
                print(status.describe(width))
            return 0 if all(status.healthy for status in statuses) else 3
        stack.down()
        return 0
    except MillstreamError as exc:
        print(f"millstream {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"millstream {args.command}: interrupted", file=sys.stderr)
        return 130


def _run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr
    )
    # The driver's py4j chatter is not what an operator needs to read.
    logging.getLogger("py4j").setLevel(logging.WARNING)
    try:
        from millstream.connectors.prometheus import listen_address
        from millstream.spark.runner import (
            AvailableNow,
            ProcessingTime,
            load_topology,
            run_topology,
        )

        metrics_address, metrics_port = listen_address(args.metrics_port)
        topology, module = load_topology(args.target)
        # Executors import millstream but not the user's module: ship its code with each task.
        from pyspark import cloudpickle

        cloudpickle.register_pickle_by_value(module)  # type: ignore[no-untyped-call]
        trigger = AvailableNow() if args.available_now else ProcessingTime(args.processing_time)
        running = run_topology(
            topology,
            load_config(),
            trigger=trigger,
            keyspace=args.keyspace,
            checkpoint_root=args.checkpoint_root,
            partitions=args.partitions,
            max_offsets_per_trigger=args.max_offsets_per_trigger,
            create_keyspace=not args.no_create_keyspace,
            metrics_port=metrics_port,
            metrics_address=metrics_address,
        )
        try:
            if args.available_now:
                rounds = running.process_available()
                print(f"millstream run: processed everything available in {rounds} round(s)")
            else:
                running.await_termination()
        finally:
            running.stop()
        for name, metrics in sorted(running.metrics().items()):
            print(
                f"  {name}: {metrics.inputs} inputs, {metrics.processed} processed, "
                f"{metrics.duplicates} duplicates, {metrics.dead_letters} dead letters, "
                f"cache hit rate {metrics.cache_hit_rate:.0%}"
            )
        return 0
    except MillstreamError as exc:
        print(f"millstream run: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("millstream run: interrupted", file=sys.stderr)
        return 130


def _prove(args: argparse.Namespace) -> int:
    from millstream.devtools.local.stack import LocalStack
    from millstream.devtools.proving import TIERS, prove

    def progress(message: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)

    tier = TIERS[args.tier]
    overrides = {
        "records": args.records,
        "keys": args.keys,
        "faults": args.faults_per_kind,
    }
    tier = dataclasses.replace(tier, **{k: v for k, v in overrides.items() if v is not None})
    kinds = None if args.faults is None else tuple(args.faults.split(","))
    try:
        stack = LocalStack(load_config(), progress, nodes=args.nodes)
        stack.up()
        reports = []
        for seed in range(args.seed, args.seed + args.repeat):
            report = prove(
                stack.client_config(),
                tier,
                seed,
                services=stack.services,
                kinds=kinds,
                keep=args.keep,
                progress=progress,
                environment=stack.client_environment(),
            )
            print(report.render(), flush=True)
            reports.append(report)
        if args.json is not None:
            args.json.write_text(json.dumps([r.to_json() for r in reports], indent=2))
        if len(reports) > 1:
            passed = sum(r.passed for r in reports)
            print(f"{passed} of {len(reports)} runs passed")
        return 0 if all(r.passed for r in reports) else 1
    except MillstreamError as exc:
        print(f"millstream prove: error: {exc}", file=sys.stderr)
        return 2


def _watermarks(args: argparse.Namespace) -> int:
    try:
        from millstream.connectors.kafka import WatermarkReader
        from millstream.connectors.streams import event_time_iso
        from millstream.engine.clock import SystemClock
        from millstream.engine.watermarks import watermark_overview

        reader = WatermarkReader(load_config())
        try:
            rows = watermark_overview(reader.read(), SystemClock().now())
        finally:
            reader.close()
    except MillstreamError as exc:
        print(f"millstream watermarks: error: {exc}", file=sys.stderr)
        return 2
    for row in rows:
        if args.json:
            print(json.dumps(dataclasses.asdict(row)))
            continue
        when = (
            "never reported"
            if row.watermark is None
            else event_time_iso(row.watermark) or str(row.watermark)
        )
        lag = "" if row.lag is None else f"  lag {row.lag / 1e6:,.1f} s"
        heuristic = "".join(
            f"  p{p:g}: {event_time_iso(value) or value}"
            for p, value in sorted(row.percentiles.items())
        )
        timers = (
            ""
            if row.timer_watermark is None
            else f"  timers at: {event_time_iso(row.timer_watermark) or row.timer_watermark}"
        )
        hot = (
            "  hot: " + ", ".join(f"interval {i} ({n:,} records)" for i, n in row.hot)
            if row.hot
            else ""
        )
        print(
            f"{row.source}: {when}{lag}{heuristic}{timers}  held by: {row.held_by}{hot}"
            f"  streams: {', '.join(row.streams)}"
        )
    if not rows:
        print("no source has reported on the watermark topic yet", file=sys.stderr)
    return 0


def _streams(args: argparse.Namespace) -> int:
    try:
        from millstream.connectors import streams

        config = load_config()
        if args.command == "produce":
            # Bytes: a line that is not UTF-8 is rejected alone (a StringIO has no buffer).
            lines = getattr(sys.stdin, "buffer", sys.stdin)
            summary = streams.produce_lines(
                config,
                args.stream,
                lines,
                source=args.source,
                partitions=args.partitions,
                report_watermark=args.report_watermark,
                errors=sys.stderr,
            )
            print(f"millstream produce: {summary.describe()}", file=sys.stderr)
            return summary.exit_code
        streams.tail_stream(
            config,
            args.stream,
            out=sys.stdout,
            from_beginning=args.from_beginning,
            follow=args.follow,
            dedup=args.dedup,
            max_records=args.max,
            value_format=args.value,
        )
        return 0
    except MillstreamError as exc:
        print(f"millstream {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if args.command == "tail":
            return 0  # how --follow ends
        print("millstream produce: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `millstream tail ... | head`: the reader is done. Keep the exit flush from failing.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _state(args: argparse.Namespace) -> int:
    try:
        from millstream.connectors.state_view import key_intervals_of, show_state

        intervals = args.intervals
        if args.topology is not None:
            from millstream.spark.runner import load_topology

            topology, _ = load_topology(args.topology)
            intervals = key_intervals_of(topology, args.computation)
        return show_state(
            load_config(),
            args.computation,
            args.key,
            keyspace=args.keyspace,
            intervals=intervals,
            codec=args.codec,
            value_format=args.value,
            as_json=args.json,
        )
    except MillstreamError as exc:
        print(f"millstream state: error: {exc}", file=sys.stderr)
        return 2


def _positive(text: str) -> int:
    try:
        number = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {number}")
    return number


if __name__ == "__main__":
    sys.exit(main())
