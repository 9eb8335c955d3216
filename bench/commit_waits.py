"""Where a paced commit's time goes on the Cassandra node: its commit log's syncs, traced.

    python bench/commit_waits.py [--intervals 4] [--keys 10] [--period-ms 200]
                                 [--seconds 10] [--busy 0,2] [--rounds 1] [--trace-every 4]

Each of ``--intervals`` threads holds an interval and commits ``--keys`` keys to it every
``--period-ms`` (a paced batch's commits, as a worker's interval threads send them: per key a
state row, a dedup ID and a production) through the store, for ``--seconds``, with
Cassandra's tracing on one commit in ``--trace-every``. The traces, read from
``system_traces`` afterwards, say where each traced commit went: the commit as the worker
timed it, as the node did, and the node's waits after each "Appending to commitlog" (with
the local stack's ``commitlog_sync: batch``, an append is acknowledged once the log is
synced; an LWT appends four times, one after another). ``--busy N`` runs N processes
spinning on the CPU meanwhile (0: none), the turns alternating for ``--rounds``: two busy
cores are where a batch's commits wait longest. A traced commit is slower than the others
(the node writes its trace's events too, to its commit log among other places): the table
gives both. Needs the local stack (``millstream up``). See docs/benchmarks.md for what it
found.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `bench.*` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cassandra.query import BatchStatement

from bench.core_commits import key_change
from bench.harness import percentile
from millstream.connectors import cassandra as cassandra_connector
from millstream.engine.clock import SystemClock
from millstream.engine.config import load_config
from millstream.engine.records import injector_record_id
from millstream.engine.state import KeyChanges
from millstream.engine.stores.cassandra import CassandraIntervalStore, create_schema

APPEND = "Appending to commitlog"
DEDUP_TTL = 10 * 60 * 1_000_000
# How long the node may take to write a traced request's last events (asynchronously).
_TRACES_SETTLE_SECONDS = 2.0


@dataclass(frozen=True)
class CommitTrace:
    """One traced commit: ``client_ms`` as its sender timed it, ``node_ms`` as the node did,
    ``waits_ms`` what followed each append to the commit log until the request's next event."""

    client_ms: float
    node_ms: float
    waits_ms: tuple[float, ...]

    @property
    def appends(self) -> int:
        return len(self.waits_ms)


def append_waits(events: Sequence[tuple[str, int]]) -> tuple[float, ...]:
    """Of a request's trace ``events`` (activity, µs since the request began), the ms from
    each append to the commit log to the next event: the append's own wait, a sync of the log
    included. An append with no later event (the trace's last) says nothing and counts not."""
    ordered = sorted(events, key=lambda event: event[1])
    return tuple(
        (later[1] - event[1]) / 1000
        for event, later in itertools.pairwise(ordered)
        if event[0].startswith(APPEND)
    )


class TracedSession:
    """A driver session whose conditional batches (the store's commits) are timed, one in
    ``every`` of them traced (a traced request writes some twenty events to
    ``system_traces``, on the same node): the traced ones' times and trace IDs are kept, and
    the others' times; everything else passes through."""

    def __init__(self, session: Any, every: int = 1) -> None:
        self._session = session
        self._every = every
        self._sent = 0
        self.traced: list[tuple[float, uuid.UUID]] = []
        self.untraced_ms: list[float] = []
        self._lock = threading.Lock()

    def execute(self, query: Any, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(query, BatchStatement):
            return self._session.execute(query, *args, **kwargs)
        with self._lock:
            self._sent += 1
            trace = self._sent % self._every == 0
        began = time.perf_counter()
        result = self._session.execute(query, *args, trace=trace, **kwargs)
        elapsed = (time.perf_counter() - began) * 1000
        with self._lock:
            if trace:
                ids = result.response_future.get_query_trace_ids()
                self.traced += [(elapsed, trace_id) for trace_id in ids]
            else:
                self.untraced_ms.append(elapsed)
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)


def read_traces(session: Any, traced: Sequence[tuple[float, uuid.UUID]]) -> list[CommitTrace]:
    """The node's account of each traced commit (those whose trace it has not written yet are
    left out)."""
    traces = []
    for client_ms, trace_id in traced:
        found = session.execute(
            "SELECT duration FROM system_traces.sessions WHERE session_id = %s", (trace_id,)
        ).one()
        if found is None or found[0] is None:
            continue
        events = session.execute(
            "SELECT activity, source_elapsed FROM system_traces.events WHERE session_id = %s",
            (trace_id,),
        )
        waits = append_waits([(activity, elapsed) for activity, elapsed in events])
        traces.append(CommitTrace(client_ms, found[0] / 1000, waits))
    return traces


def commit_keys(interval: int, keys: int, batch: int) -> list[KeyChanges]:
    """A batch's changes of ``keys`` keys, one record each (as ``bench/core_commits.py``'s
    ``store`` mode makes them)."""
    return [
        key_change(
            f"key-{interval}-{n:04d}",
            injector_record_id("commit-waits", interval, batch * keys + n),
        )
        for n in range(keys)
    ]


@contextlib.contextmanager
def spinning(processes: int) -> Iterator[None]:
    """``processes`` Python processes spinning on the CPU meanwhile (stopped by PID after)."""
    spinners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(processes)
    ]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def run_turn(
    session: Any,
    keyspace: str,
    *,
    intervals: int,
    keys: int,
    period: float,
    seconds: float,
    busy: int,
    trace_every: int = 1,
) -> tuple[list[CommitTrace], list[float]]:
    """One turn: every interval's commits every ``period`` s for ``seconds``, one in
    ``trace_every`` traced, ``busy`` processes spinning meanwhile; the traced commits, and the
    others' times (ms)."""
    traced = TracedSession(session, trace_every)
    store = CassandraIntervalStore(traced, keyspace, SystemClock())
    computation = f"commits_{uuid.uuid4().hex[:8]}"
    leases = [store.acquire(computation, interval) for interval in range(intervals)]
    traced.traced.clear()  # the acquires' batches: not commits
    traced.untraced_ms.clear()
    failures: list[BaseException] = []

    def commit_paced(interval: int) -> None:
        lease, due, batch = leases[interval], time.monotonic(), 0
        try:
            while time.monotonic() - started < seconds:
                store.commit(lease, commit_keys(interval, keys, batch), dedup_ttl=DEDUP_TTL)
                batch += 1
                due += period
                time.sleep(max(0.0, due - time.monotonic()))
        except BaseException as exc:  # reraised by the turn, after the other threads end
            failures.append(exc)

    with spinning(busy):
        started = time.monotonic()
        threads = [threading.Thread(target=commit_paced, args=(i,)) for i in range(intervals)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    if failures:
        raise failures[0]
    time.sleep(_TRACES_SETTLE_SECONDS)
    return read_traces(session, traced.traced), traced.untraced_ms


def summary(traces: Sequence[CommitTrace], untraced_ms: Sequence[float]) -> dict[str, float]:
    """Medians and p90s of a turn's commits (untraced and traced), the traced ones' waits on
    the commit log, and their share of the node's time."""
    waits = [wait for trace in traces for wait in trace.waits_ms]
    waited = [sum(trace.waits_ms) for trace in traces]
    return {
        "commits": len(traces),
        "untraced_p50": percentile(list(untraced_ms), 50),
        "client_p50": percentile([t.client_ms for t in traces], 50),
        "client_p90": percentile([t.client_ms for t in traces], 90),
        "node_p50": percentile([t.node_ms for t in traces], 50),
        "node_p90": percentile([t.node_ms for t in traces], 90),
        "waited_p50": percentile(waited, 50),
        "wait_p50": percentile(waits, 50),
        "wait_p90": percentile(waits, 90),
        "appends": statistics.median(trace.appends for trace in traces),
        "waited_share": sum(waited) / sum(trace.node_ms for trace in traces),
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--intervals", type=int, default=4)
    parser.add_argument("--keys", type=int, default=10, help="keys a commit")
    parser.add_argument("--period-ms", type=float, default=200.0, help="between an interval's")
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds a turn")
    parser.add_argument("--busy", default="0,2", help="processes spinning, a turn each")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--trace-every", type=int, default=4, help="one commit in this many")
    args = parser.parse_args(argv)
    busy = [int(n) for n in args.busy.split(",")]
    config = load_config()
    cluster, session = cassandra_connector.connect(config)
    keyspace = f"commit_waits_{uuid.uuid4().hex[:8]}"
    cassandra_connector.create_keyspace(session, keyspace, config.cassandra_replication)
    results: dict[int, list[dict[str, float]]] = {}
    try:
        create_schema(session, keyspace)
        turn = {
            "intervals": args.intervals,
            "keys": args.keys,
            "period": args.period_ms / 1000,
            "trace_every": args.trace_every,
        }
        run_turn(session, keyspace, seconds=2.0, busy=0, **turn)  # statements prepared, JIT
        for number in range(args.rounds):
            for spinners in busy if number % 2 == 0 else reversed(busy):
                traces, untraced = run_turn(
                    session, keyspace, seconds=args.seconds, busy=spinners, **turn
                )
                results.setdefault(spinners, []).append(summary(traces, untraced))
                print(
                    f"  round {number + 1}, {spinners} busy: {len(traces)} commits traced, "
                    f"{len(untraced)} not",
                    flush=True,
                )
    finally:
        cassandra_connector.drop_keyspace(session, keyspace)
        cluster.shutdown()
    print(
        f"\n{args.intervals} intervals, {args.keys} keys a commit every {args.period_ms:g} ms, "
        f"one in {args.trace_every} traced; medians of {args.rounds} round(s) of "
        f"{args.seconds:g} s; ms"
    )
    columns = [
        ("untraced_p50", "untraced p50"),
        ("client_p50", "traced p50"),
        ("client_p90", "p90"),
        ("node_p50", "node p50"),
        ("node_p90", "p90"),
        ("waited_p50", "log waits p50"),
        ("wait_p50", "a wait p50"),
        ("wait_p90", "p90"),
        ("appends", "appends"),
        ("waited_share", "share"),
    ]
    print(f"{'busy':>5}{'traced':>8}" + "".join(f"{title:>15}" for _, title in columns))
    for spinners, runs in results.items():
        cells = [statistics.median(run[name] for run in runs) for name, _ in columns]
        commits = statistics.median(run["commits"] for run in runs)
        print(f"{spinners:>5}{commits:>8.0f}" + "".join(f"{cell:>15.2f}" for cell in cells))


if __name__ == "__main__":
    main()
