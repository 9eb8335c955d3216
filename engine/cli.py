"""The ``millstream`` command.

::

    millstream up        start local Kafka + Cassandra (reuses running ones)
    millstream status    pid, address, health and memory of each
    millstream down      stop them by pid

Settings (ports, data directory) come from :mod:`millstream.engine.config`.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from millstream.engine.config import load_config
from millstream.engine.errors import MillstreamError

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="millstream", description=__doc__.split("::")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("up", help="start the local Kafka and Cassandra")
    commands.add_parser("status", help="report the local services")
    commands.add_parser("down", help="stop the local services")
    args = parser.parse_args(argv)

    started = time.monotonic()

    def progress(message: str) -> None:
        print(f"[{time.monotonic() - started:6.1f}s] {message}", file=sys.stderr, flush=True)

    try:
        # Imported here so `millstream --help` stays fast and free of driver imports.
        from millstream.connectors.local.stack import LocalStack

        config = load_config()
        stack = LocalStack(config, progress)
        if args.command == "up":
            statuses = stack.up()
            print(f"millstream local stack is up (data in {config.home}):")
            for status in statuses:
                print(f"  {status.describe()}")
            print(f"  kafka bootstrap: {config.kafka_bootstrap}")
            hosts = ",".join(config.cassandra_hosts)
            print(f"  cassandra contact points: {hosts} port {config.cassandra_port}")
            return 0
        if args.command == "status":
            statuses = stack.status()
            for status in statuses:
                print(status.describe())
            return 0 if all(status.healthy for status in statuses) else 3
        stack.down()
        return 0
    except MillstreamError as exc:
        print(f"millstream {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"millstream {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
