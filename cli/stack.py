"""The local services: ``millstream up``, ``status``, ``down`` and ``jars``.

``up`` starts Kafka and Cassandra (reusing running ones) and says how to reach them,
``status`` shows each service's pid, address, health and memory (exit 1 if one is not
healthy), ``down`` stops them by pid. Each takes ``--nodes 3`` (the replicated stack on
127.0.0.2-4) or ``--secure`` (the secured single node on 127.0.0.5). ``jars`` prints the Spark
Kafka connector jars Maven resolved, comma separated, for ``spark-submit --jars``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from millstream.cli.arguments import add_command

if TYPE_CHECKING:
    from millstream.devtools.local.stack import LocalStack

__all__ = ["register", "run"]


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    for name, summary, description in (
        (
            "up",
            "start the local Kafka and Cassandra",
            "Start the local Kafka and Cassandra, reusing those already running, and print how "
            "to reach them. The first start downloads them (about 200 MB).",
        ),
        (
            "status",
            "report the local Kafka and Cassandra",
            "Print the pid, address, health and memory of each local service. Exit code 1 if "
            "one is not running or not healthy.",
        ),
        (
            "down",
            "stop the local Kafka and Cassandra",
            "Stop the local services, by the pids they were started with.",
        ),
    ):
        local = add_command(commands, name, summary=summary, description=description)
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
        local.set_defaults(handler=run)
    jars = add_command(
        commands,
        "jars",
        summary="print the Spark Kafka connector jars (for --jars)",
        description="Print the Spark Kafka connector jars that Maven resolved from the pinned "
        "POM, comma separated, as spark-submit's --jars takes them (resolving them first if "
        "needed).",
    )
    jars.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    # Imported here so `millstream --help` stays fast and free of driver imports.
    from millstream.devtools.local.stack import LocalStack
    from millstream.engine.config import load_config

    progress = _progress()
    config = load_config()
    if args.command == "jars":
        from millstream.spark.session import local_connector_jars

        print(",".join(str(jar) for jar in local_connector_jars(config, progress)))
        return 0
    stack = LocalStack(config, progress, nodes=args.nodes, secure=args.secure)
    if args.command == "up":
        _up(stack, args)
        return 0
    if args.command == "status":
        statuses = stack.status()
        width = _width(stack)
        for status in statuses:
            print(status.describe(width))
        return 0 if all(status.healthy for status in statuses) else 1
    stack.down()
    return 0


def _up(stack: LocalStack, args: argparse.Namespace) -> None:
    config = stack.config
    statuses = stack.up()
    replicated = args.nodes > 1
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
    width = _width(stack)
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


def _width(stack: LocalStack) -> int:
    return max(10, *(len(service.name) for service in stack.services))


def _progress() -> Callable[[str], None]:
    started = time.monotonic()

    def progress(message: str) -> None:
        # One write per line: nodes starting in parallel threads report at once.
        line = f"[{time.monotonic() - started:6.1f}s] {message}\n"
        print(line, end="", file=sys.stderr, flush=True)

    return progress
