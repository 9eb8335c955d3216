"""``millstream prove``: the proving ground (:mod:`millstream.devtools.proving`).

It runs a workload on the local stack under a seeded schedule of faults and checks that
nothing was lost or duplicated. Exit code 1 if a run failed a check or could not apply a fault.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

from millstream.cli.arguments import add_command, add_query_mode, positive, writable_file_here

__all__ = ["register", "run"]


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = add_command(
        commands,
        "prove",
        summary="check that faults lose or duplicate nothing",
        description="Run a workload on the local stack (started if needed) under a seeded "
        "schedule of faults (kill -9 of the driver, a worker, a broker, a node, the "
        "injector; zombies; outages) and check that nothing was lost or duplicated, that "
        "watermarks never went back and timers fired exactly once. Exit code 1 if a run "
        "failed a check or could not apply a fault.",
    )
    parser.add_argument(
        "--tier", choices=("ci", "t1", "t2"), default="ci", help="the run's size (default: ci)"
    )
    parser.add_argument("--seed", type=int, default=1, help="the fault schedule's seed")
    parser.add_argument(
        "--nodes",
        type=int,
        choices=(1, 3),
        default=1,
        help="run on the single-node stack (default) or on the replicated one (millstream up "
        "--nodes 3), where the Kafka and Cassandra faults kill one node of three",
    )
    parser.add_argument(
        "--repeat", type=positive, default=1, metavar="N", help="N runs, seeds SEED..SEED+N-1"
    )
    parser.add_argument(
        "--faults",
        default=None,
        metavar="KIND,...",
        help="only these faults (default: the tier's; docs/guides/proving-ground.md lists them)",
    )
    parser.add_argument(
        "--records", type=positive, default=None, metavar="N", help="override the tier's"
    )
    parser.add_argument(
        "--keys", type=positive, default=None, metavar="N", help="override the tier's"
    )
    parser.add_argument(
        "--faults-per-kind", type=positive, default=None, metavar="N", help="override the tier's"
    )
    parser.add_argument(
        "--plain-exactly-once",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="fail a run if a plain read_committed Kafka consumer reads a message of a "
        "transactional output stream twice (byte-identical: a re-send); the counts are "
        "reported either way (default: on)",
    )
    add_query_mode(
        parser,
        one_query="run the workload's topology as one streaming query (RunSettings.one_query), "
        "as millstream run --one-query does",
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the run's topics, keyspace and directory"
    )
    parser.add_argument(
        "--json",
        type=writable_file_here,
        default=None,
        metavar="FILE",
        help="also write the reports to FILE (its directory must exist)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from millstream.devtools.local.stack import LocalStack
    from millstream.devtools.proving import TIERS, prove
    from millstream.engine.config import load_config

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
            plain_exactly_once=args.plain_exactly_once,
            one_query=args.one_query,
        )
        print(report.render(), flush=True)
        reports.append(report)
    if args.json is not None:
        args.json.write_text(json.dumps([r.to_json() for r in reports], indent=2))
    if len(reports) > 1:
        passed = sum(r.passed for r in reports)
        print(f"{passed} of {len(reports)} runs passed")
    return 0 if all(r.passed for r in reports) else 1
