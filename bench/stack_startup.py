"""Time `millstream up` with a cold and a warm cache, and the memory of each service.

    python bench/stack_startup.py [--keep-cache DIR]

Runs a separate stack on ports 19092/19093 (Kafka) and 19042/17000 (Cassandra), so a
running default stack is not disturbed. "Cold" is an empty Maven repository and data
directory (everything is downloaded, storage is formatted); "warm" is the same
directories again after a stop (nothing is downloaded; the services restart on existing
data). Prints one table.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from millstream.devtools.local.service import ServiceStatus
from millstream.devtools.local.stack import LocalStack
from millstream.engine.config import MillstreamConfig


def _quiet(message: str) -> None:
    print(f"  . {message}", flush=True)


def _timed_up(stack: LocalStack) -> tuple[float, list[ServiceStatus]]:
    started = time.monotonic()
    stack.up()
    elapsed = time.monotonic() - started
    time.sleep(5)  # let start-up allocations settle before reading RSS
    return elapsed, stack.status()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep-cache", type=Path, help="use (and keep) this scratch folder")
    args = parser.parse_args()
    scratch = args.keep_cache or Path(tempfile.mkdtemp(prefix="millstream-bench-"))
    config = MillstreamConfig(
        home=scratch / "home",
        kafka_bootstrap="127.0.0.1:19092",
        kafka_controller_port=19093,
        cassandra_port=19042,
        cassandra_storage_port=17000,
    )
    stack = LocalStack(config, _quiet, maven_repo_local=scratch / "m2")
    rows: list[tuple[str, float, list[ServiceStatus]]] = []
    try:
        print("cold up (empty Maven repository, empty data directory):")
        rows.append(("cold", *_timed_up(stack)))
        stack.down()
        print("warm up (cached artifacts, existing data):")
        rows.append(("warm", *_timed_up(stack)))
    finally:
        stack.down()
        if args.keep_cache is None:
            shutil.rmtree(scratch, ignore_errors=True)
    print()
    print(
        f"{'start':<6} {'seconds':>8}  " + "  ".join(f"{s.name + ' RSS':>16}" for s in rows[0][2])
    )
    for label, seconds, statuses in rows:
        memory = "  ".join(f"{(s.rss_bytes or 0) / 2**20:>12.0f} MiB" for s in statuses)
        print(f"{label:<6} {seconds:>8.1f}  {memory}")


if __name__ == "__main__":
    main()
