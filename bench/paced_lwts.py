"""What a lightweight transaction costs the local Cassandra node when they come a few a second.

    python bench/paced_lwts.py [--rates 10,50,0] [--seconds 10] [--rounds 2]
                               [--other-slack-ns 50000]

One client writes an injector's checkpoint (a conditional write under the checkpoint's
sequencer, :class:`~millstream.injectors.checkpoint.CheckpointStore`) at each of ``--rates``
a second (0: back to back) for ``--seconds``, and reads the node's CPU from /proc. Prints, per
rate, the node's CPU milliseconds a write and the write's latency (p50, p90), with the node's
timer slack as it runs and, with ``--other-slack-ns``, with that slack written to every
thread of the node for the turn (restored after; needs the right to change another process's
timer slack, as its owner with CAP_SYS_NICE), the two taking turns for ``--rounds``. Needs
the local stack (``millstream up``). See docs/guides/local-stack.md for why the slack matters.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `bench.*` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import percentile, process_cpu, stack_services
from millstream.connectors import cassandra as cassandra_connector
from millstream.devtools.local.process import thread_timer_slacks
from millstream.engine.clock import SystemClock
from millstream.engine.config import load_config
from millstream.engine.stores.cassandra import CassandraIntervalStore, create_schema
from millstream.injectors.checkpoint import Checkpoint, CheckpointStore


@contextlib.contextmanager
def _slack(pid: int, nanoseconds: int | None) -> Iterator[None]:
    """Every thread of ``pid`` with ``nanoseconds`` of timer slack meanwhile (None: as is)."""
    if nanoseconds is None:
        yield
        return
    before = thread_timer_slacks(pid)
    for tid in before:
        with contextlib.suppress(FileNotFoundError):
            Path(f"/proc/{tid}/timerslack_ns").write_text(str(nanoseconds))
    try:
        yield
    finally:
        for tid, slack in before.items():
            with contextlib.suppress(FileNotFoundError):
                Path(f"/proc/{tid}/timerslack_ns").write_text(str(slack))


def _turn(
    checkpoints: CheckpointStore, pid: int, rate: float, seconds: float
) -> tuple[float, list[float]]:
    """Node CPU ms a write, and each write's latency (ms), at ``rate`` writes a second."""
    latencies: list[float] = []
    cpu = process_cpu(pid) or 0.0
    started = due = time.monotonic()
    while time.monotonic() - started < seconds:
        began = time.perf_counter()
        checkpoints.save(Checkpoint(watermark=len(latencies)))
        latencies.append((time.perf_counter() - began) * 1000)
        if rate > 0:
            due += 1 / rate
            time.sleep(max(0.0, due - time.monotonic()))
    used = (process_cpu(pid) or 0.0) - cpu
    return used * 1000 / len(latencies), latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", default="10,50,0", help="writes a second; 0: back to back")
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds a turn")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--other-slack-ns", type=int, help="also run with this slack")
    args = parser.parse_args()
    config = load_config()
    pid = stack_services(config).get("cassandra")
    if pid is None:
        raise SystemExit("no local Cassandra running: start the stack with `millstream up`")
    slacks = sorted(set(thread_timer_slacks(pid).values()))
    print(f"the node's threads run with a timer slack of {', '.join(map(str, slacks))} ns")
    ways: list[tuple[str, int | None]] = [("as it runs", None)]
    if args.other_slack_ns is not None:
        ways.append((f"{args.other_slack_ns} ns", args.other_slack_ns))
    rates = [float(rate) for rate in args.rates.split(",")]
    cluster, session = cassandra_connector.connect(config)
    keyspace = f"paced_lwts_{uuid.uuid4().hex[:8]}"
    session.execute(
        f"CREATE KEYSPACE {keyspace} WITH replication = "
        "{'class': 'SimpleStrategy', 'replication_factor': 1}"
    )
    try:
        create_schema(session, keyspace, "intervals")
        store = CassandraIntervalStore(session, keyspace, SystemClock())
        checkpoints = CheckpointStore(store, "bench", "paced")
        checkpoints.acquire()
        _turn(checkpoints, pid, 0, 10)  # the statements prepared, the node's JIT warmer
        results: dict[tuple[str, float], list[tuple[float, list[float]]]] = {}
        for number in range(args.rounds):
            for name, slack in ways if number % 2 == 0 else reversed(ways):
                for rate in rates:
                    with _slack(pid, slack):
                        result = _turn(checkpoints, pid, rate, args.seconds)
                    results.setdefault((name, rate), []).append(result)
                    print(
                        f"  round {number + 1}, {name}, {rate:g}/s: node CPU {result[0]:.2f} ms "
                        f"a write, p50 {percentile(result[1], 50):.2f} ms",
                        flush=True,
                    )
    finally:
        session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}")
        cluster.shutdown()
    print(f"\nmedians of {args.rounds} rounds of {args.seconds:.0f} s")
    print(f"{'slack':<14}{'writes/s':>10}{'node CPU ms a write':>22}{'p50 ms':>9}{'p90 ms':>9}")
    for (name, rate), runs in results.items():
        print(
            f"{name:<14}{'back to back' if rate == 0 else f'{rate:g}':>10}"
            f"{statistics.median(cpu for cpu, _ in runs):>22.2f}"
            f"{statistics.median(percentile(lat, 50) for _, lat in runs):>9.2f}"
            f"{statistics.median(percentile(lat, 90) for _, lat in runs):>9.2f}"
        )


if __name__ == "__main__":
    main()
