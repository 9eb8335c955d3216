"""The live view from a shell: ``millstream ui`` (:mod:`millstream.ui`)."""

from __future__ import annotations

import argparse
import sys

from millstream.cli.arguments import add_command

__all__ = ["register", "run"]


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    ui = add_command(
        commands,
        "ui",
        summary="a live web view of the topologies: graph, watermarks, lag, streams",
        description="Serve a read-only web page about the topologies on the configured "
        "services, live: the topology graph with each computation's watermark lag, rates, "
        "backlog and health, what holds a stuck watermark, the streams and their consumers' "
        "lag, and what changed. It reads Kafka itself, so it needs no driver and survives "
        "their restarts. It runs until interrupted.",
    )
    ui.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind (default: 127.0.0.1; any non-loopback address needs a token)",
    )
    ui.add_argument(
        "--port", type=_port, default=None, metavar="PORT", help="port to bind (default: 8470)"
    )
    ui.add_argument(
        "--token",
        default=None,
        metavar="TOKEN",
        help="the token every request needs (default: [ui] token, MILLSTREAM_UI_TOKEN; "
        "required off loopback); open the page once as /?token=TOKEN",
    )
    ui.add_argument(
        "--period",
        type=float,
        default=None,
        metavar="SECONDS",
        help="seconds between two readings of the services (default: 2)",
    )
    ui.add_argument(
        "--topology",
        action="append",
        default=[],
        metavar="PATTERN",
        help="show only the topologies whose names match (shell-style, e.g. 'zeitgeist_*'; "
        "repeatable), with the streams and injectors they use (default: every topology)",
    )
    ui.add_argument(
        "--keyspace",
        default=None,
        metavar="NAME",
        help="Cassandra keyspace of the computations' key intervals (default: [run] keyspace)",
    )
    ui.add_argument(
        "--table",
        default=None,
        metavar="NAME",
        help="their table in it (default: [run] table)",
    )
    ui.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from millstream.engine.config import load_config
    from millstream.ui import DEFAULT_PERIOD, DEFAULT_PORT, serve

    config = load_config()
    token = args.token
    if token is None and config.ui_token is not None:
        token = config.ui_token.reveal()
    serve(
        config,
        host=args.host,
        port=args.port or DEFAULT_PORT,
        token=token,
        period=max(0.2, DEFAULT_PERIOD if args.period is None else args.period),
        topologies=args.topology,
        keyspace=args.keyspace,
        table=args.table,
        started=lambda address: print(
            f"millstream ui: serving {address}", file=sys.stderr, flush=True
        ),
    )
    return 0


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 < port < 65536:
        raise argparse.ArgumentTypeError(f"a port is 1 to 65535, got {port}")
    return port
