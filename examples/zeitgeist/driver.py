"""Process one run of the job to its end: ``python -m zeitgeist.driver RUN ORIGIN``.

The main job runs its topology and its injector together (:func:`zeitgeist.job.run_job`); this
runs the topology alone, its injector elsewhere (:func:`zeitgeist.job.inject`). Should the
driver die (a crash, kill -9), this resumes it: the queries restart from their checkpoints, the
state, timers and pending productions from Cassandra, and the anomalies stream receives nothing
twice that a reader deduplicating by record ID would see. It exits 0 once every computation's
input watermark reached the end of time and everything was processed.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from millstream.connectors import load_config
from zeitgeist.job import job_settings, process
from zeitgeist.model import ModelParams
from zeitgeist.pipeline import Names
from zeitgeist.progress import JobProgress


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="zeitgeist.driver", description=__doc__)
    parser.add_argument("run", help="the run's name (its streams are zeitgeist_RUN.*)")
    parser.add_argument("origin", type=int, help="where buckets start, µs mod their length")
    parser.add_argument(
        "--bucket-seconds", type=int, default=300, help="the buckets' length (default 300)"
    )
    parser.add_argument("--keyspace", default=None, help="default: [run] keyspace")
    parser.add_argument("--checkpoint-root", type=Path, default=None)
    parser.add_argument("--anomalies", default="anomalies", help="the anomalies stream")
    args = parser.parse_args(argv)
    config = load_config()
    settings = job_settings(config)
    if args.keyspace is not None:
        settings = dataclasses.replace(settings, keyspace=args.keyspace)
    if args.checkpoint_root is not None:
        settings = dataclasses.replace(settings, checkpoint_root=args.checkpoint_root)
    process(
        config,
        Names(args.run, anomalies=args.anomalies),
        origin=args.origin,
        params=ModelParams().for_bucket(args.bucket_seconds * 1_000_000),
        settings=settings,
        progress=JobProgress(args.run),
    )
    print("finished", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
