"""``python -m zeitgeist``: the main job on the local stack; ``--help`` for the inputs."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from millstream.connectors import MillstreamConfig, load_config, route_logs
from millstream.engine import MillstreamError
from millstream.spark import Console, spark_session
from millstream.ui import DEFAULT_PORT, RunningView, start_view
from zeitgeist.evaluation import (
    JobInput,
    Report,
    describe_slice,
    print_reports,
    run_input,
    run_offline,
)
from zeitgeist.generate import generate
from zeitgeist.model import ModelParams
from zeitgeist.pipeline import Names
from zeitgeist.progress import JobProgress
from zeitgeist.series import load_series

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

NAB = Path(__file__).parent / "data" / "nab"
DEFAULT_DAYS = 18.0  # the default NAB slice: Feb 26 to Mar 16, seven labelled windows
_DAY = 86_400_000_000


def _nab_input(directory: Path, name: str, days: float | None) -> JobInput:
    series = load_series(directory)
    if days is not None:
        start = min(s.start for s in series)
        series = [s.between(start, start + int(days * _DAY)) for s in series]
    return JobInput(name, series)


def _generated_input(seed: int, days: int, queries: int) -> JobInput:
    traffic = generate(seed=seed, days=days, queries=queries)
    return JobInput(
        "generated",
        traffic.series,
        truth={kind: traffic.windows(kind) for kind in ("spike", "dip")},
        outages=[(a.query, *a.window) for a in traffic.anomalies if a.outage],
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="zeitgeist", description=__doc__)
    parser.add_argument(
        "--full",
        action="store_true",
        help="the whole two months of the NAB series, then the generated traffic",
    )
    parser.add_argument(
        "--days",
        type=float,
        default=None,
        help=f"replay the first DAYS days of each series (default {DEFAULT_DAYS:g} for the "
        "shipped NAB series, everything with --full or --series)",
    )
    parser.add_argument(
        "--series",
        type=Path,
        default=None,
        metavar="DIR",
        help="run on a directory of NAB-format CSVs (timestamp,value) with a labels.json",
    )
    parser.add_argument("--generated", action="store_true", help="also run generated traffic")
    parser.add_argument("--seed", type=int, default=7, help="generated traffic's seed")
    parser.add_argument("--generated-days", type=int, default=10)
    parser.add_argument("--generated-queries", type=int, default=5)
    parser.add_argument("--run", default=None, help="the run's name (default: the time)")
    parser.add_argument("--no-plots", action="store_true")
    parser.add_argument(
        "--offline",
        action="store_true",
        help="score the inputs with the offline reference (what the job finds, found in one "
        "process without the stack): for series too big to replay as events",
    )
    parser.add_argument(
        "--ui-port",
        type=int,
        default=DEFAULT_PORT,
        metavar="PORT",
        help=f"serve the live view of the job (millstream ui) at http://127.0.0.1:PORT/ while "
        f"it runs (default: {DEFAULT_PORT}; 0: no view)",
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="show the logs here too (Spark's, Kafka's, millstream's); by default they go to "
        "a file under ~/.millstream/logs and the console shows progress and anomalies",
    )
    args = parser.parse_args(argv)

    run = args.run or time.strftime("%Y%m%dt%H%M%S")
    inputs: list[JobInput] = []
    if args.series is not None:
        inputs.append(_nab_input(args.series, args.series.name or "series", args.days))
    else:
        days = None if args.full else (args.days if args.days is not None else DEFAULT_DAYS)
        inputs.append(_nab_input(NAB, "nab", days))
    if args.full or args.generated:
        inputs.append(_generated_input(args.seed, args.generated_days, args.generated_queries))

    if args.offline:
        print_reports([run_offline(job) for job in inputs])
        return 0
    config = load_config()
    # Spark's, Kafka's and millstream's logs go to a file; the console shows progress.
    routing = route_logs(config, "zeitgeist", verbose=args.verbose)
    print(routing.where(), flush=True)
    spark: SparkSession | None = None
    reports: list[Report] = []
    view = _live_view(config, args.ui_port, run)
    try:
        # One Spark session for every input (the runner would otherwise make one per
        # topology); its JVM logs to the file too.
        spark = spark_session(config, app_name=f"zeitgeist-{run}")
        for job in inputs:
            names = Names(f"{run}_{job.name}".replace("-", "_"))
            console = Console(live=False if args.verbose else None, log_file=routing.path)
            progress = JobProgress(job.name, console=console)
            progress.replaying(describe_slice(job.series))
            workdir = config.home / "zeitgeist" / names.run
            reports.append(
                run_input(
                    config,
                    job,
                    names,
                    workdir,
                    params=job.params(ModelParams()),
                    spark=spark,
                    progress=progress,
                    plot=not args.no_plots,
                )
            )
    except Exception as exc:
        # The traceback goes to the log file; the console gets the line that names the error.
        print(f"zeitgeist: error: {routing.failed(exc)}", file=sys.stderr)
        return 1
    finally:
        if spark is not None:
            spark.stop()
        if view is not None:
            view.stop()
        routing.close()
    print_reports(reports)
    print(f"\nthe anomalies are on stream 'anomalies' (field run = '{run}_...'):")
    print("  .venv/bin/millstream tail anomalies --from-beginning --value json")
    return 0


def _live_view(config: MillstreamConfig, port: int, run: str) -> RunningView | None:
    """The live view of this run's topologies while the job runs; none if ``port`` is 0 or
    taken (by a ``millstream ui`` already running, say: the job goes on without its own)."""
    if port == 0:
        return None
    try:
        view = start_view(config, port=port, topologies=[f"zeitgeist_{run}_*"])
    except MillstreamError as exc:
        print(f"zeitgeist: no live view ({exc}); the job goes on without it", flush=True)
        return None
    print(f"watch it live: {view.address} (up while the job runs)", flush=True)
    return view


if __name__ == "__main__":
    sys.exit(main())
