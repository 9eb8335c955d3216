"""``millstream run MODULE:TOPOLOGY``: run a topology on Spark Structured Streaming.

``MODULE`` is imported from the working directory (it comes first on ``sys.path``, as for
``python -m``) or from ``PYTHONPATH``; ``TOPOLOGY`` is a ``Topology`` or a zero-argument
callable returning one (:func:`millstream.spark.runner.load_topology`). The module's code
travels to the executors with each task, so they need only millstream installed.

The deployment flags (keyspace, checkpoints, partitions, batch cap, metrics) override the
``[run]`` settings (:class:`~millstream.engine.config.RunSettings`) when given; the settings
they leave alone come from ``millstream.toml`` and ``MILLSTREAM_RUN_*``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import TYPE_CHECKING

from millstream.cli.arguments import add_command, add_query_mode, path_here, positive

if TYPE_CHECKING:
    from millstream.engine.config import MillstreamConfig
    from millstream.ui import RunningView

__all__ = ["register", "run"]


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = add_command(
        commands,
        "run",
        summary="run a topology on Spark Structured Streaming",
        description="Run a topology on Spark Structured Streaming: one query per computation "
        "(or the whole topology in one, --one-query), state in Cassandra, checkpoints on "
        "disk. MODULE is imported from the working directory or PYTHONPATH; TOPOLOGY names "
        "a Topology in it, or a function that returns one. Without --available-now it runs "
        "until stopped (Ctrl-C).",
    )
    parser.add_argument(
        "target",
        metavar="MODULE:TOPOLOGY",
        help="the module to import and the Topology in it (or a function returning one)",
    )
    parser.add_argument(
        "--keyspace",
        default=None,
        metavar="NAME",
        help="Cassandra keyspace of the state (default: [run] keyspace, millstream)",
    )
    parser.add_argument(
        "--checkpoint-root",
        type=path_here,
        default=None,
        metavar="DIR",
        help="where the queries keep their checkpoints (default: <home>/checkpoints)",
    )
    when = parser.add_mutually_exclusive_group()
    when.add_argument(
        "--available-now", action="store_true", help="process what the topics hold, then exit"
    )
    when.add_argument(
        "--processing-time",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="seconds between micro-batches (default: 1)",
    )
    parser.add_argument(
        "--partitions",
        type=positive,
        default=None,
        metavar="N",
        help="partitions of the topics it creates (default: [run] partitions, 2)",
    )
    parser.add_argument(
        "--max-offsets-per-trigger",
        type=int,
        default=None,
        metavar="N",
        help="at most N records per micro-batch of each query (default: [run]'s, no limit)",
    )
    add_query_mode(
        parser,
        one_query="run the whole topology as one streaming query: a pipeline's record passes "
        "its stages in the batch that read it, and its computations are fixed while it runs",
    )
    parser.add_argument(
        "--no-create-keyspace",
        dest="create_keyspace",
        action="store_false",
        default=None,
        help="the keyspace exists (by default a development keyspace is created if missing)",
    )
    parser.add_argument(
        "--metrics-port",
        default=None,
        metavar="[ADDRESS:]PORT",
        help="serve Prometheus metrics at http://ADDRESS:PORT/metrics (ADDRESS defaults to "
        "127.0.0.1; 0: off, the default unless [run] metrics_port says otherwise)",
    )
    parser.add_argument(
        "--ui-port",
        default=None,
        metavar="[ADDRESS:]PORT",
        help="also serve the live view of this topology (millstream ui) at "
        "http://ADDRESS:PORT/ while it runs (ADDRESS defaults to 127.0.0.1; any other needs "
        "a token: [ui] token or MILLSTREAM_UI_TOKEN)",
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="show the logs here too (Spark's, Kafka's, millstream's); by default they go to "
        "a file under <home>/logs and the console shows progress and warnings",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from millstream.connectors.logs import route_logs
    from millstream.connectors.prometheus import listen_address
    from millstream.engine.config import load_config
    from millstream.spark.console import Console
    from millstream.spark.runner import AvailableNow, ProcessingTime, load_topology, run_topology

    config = load_config()
    flags = {
        "keyspace": args.keyspace,
        "checkpoint_root": args.checkpoint_root,
        "partitions": args.partitions,
        "max_offsets_per_trigger": args.max_offsets_per_trigger,
        "create_keyspace": args.create_keyspace,
        "one_query": args.one_query,
    }
    if args.metrics_port is not None:
        flags["metrics_address"], flags["metrics_port"] = listen_address(args.metrics_port)
    settings = dataclasses.replace(
        config.run, **{name: value for name, value in flags.items() if value is not None}
    )
    # Logs go to a file of the run's own (guarded() closes it), the console shows progress.
    routing = route_logs(config, "run", verbose=args.verbose)
    print(f"millstream run: {routing.where()}", file=sys.stderr, flush=True)
    # The runner ships the module's code to the executors itself.
    topology, _ = load_topology(args.target)
    trigger = AvailableNow() if args.available_now else ProcessingTime(args.processing_time)
    console = Console(live=False if args.verbose else None, log_file=routing.path)
    console.track_topology(topology)
    view = _start_view(config, args.ui_port, topology.name)
    try:
        running = run_topology(
            topology, config, settings, trigger=trigger, on_batch=console.on_batch
        )
    except BaseException:
        if view is not None:
            view.stop()
        raise
    console.start()
    try:
        if args.available_now:
            rounds = running.process_available()
            print(f"millstream run: processed everything available in {rounds} round(s)")
        else:
            running.await_termination()
    finally:
        running.stop()
        console.stop()
        if view is not None:
            view.stop()
    for name, metrics in sorted(running.metrics().items()):
        print(
            f"  {name}: {metrics.inputs} inputs, {metrics.processed} processed, "
            f"{metrics.duplicates} duplicates, {metrics.dead_letters} dead letters, "
            f"cache hit rate {metrics.cache_hit_rate:.0%}"
        )
    return 0


def _start_view(config: MillstreamConfig, listen: str | None, topology: str) -> RunningView | None:
    """The live view of ``topology`` from a child process of the driver, if ``--ui-port``
    asks."""
    if listen is None:
        return None
    from millstream.connectors.prometheus import listen_address
    from millstream.ui import start_view

    host, port = listen_address(listen)
    if port == 0:
        return None
    view = start_view(
        config,
        host=host,
        port=port,
        token=None if config.ui_token is None else config.ui_token.reveal(),
        topologies=[topology],
    )
    print(f"millstream run: the live view is at {view.address}", file=sys.stderr, flush=True)
    return view
