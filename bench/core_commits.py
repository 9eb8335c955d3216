"""Commits and records per second through the core store on the real Cassandra.

    python bench/core_commits.py [--seconds 3] [--sizes 1,10,100,1000]
                                 [--max-batch-bytes N] [--nodelay off|on|both]
                                 [--tombstones N]

Needs the local stack (``millstream up``) or the Cassandra named by the configuration. Runs
in a keyspace of its own, dropped at the end, in two modes, each at 1, 10, 100 and 1000 keys
per interval commit, for ``--seconds`` per cell (about 70 s in all by default):

* ``protocol``: the per-key protocol (:class:`~millstream.engine.protocol.IntervalWorker`)
  with one record per key per batch: acquire, dedup check, user code (a counter in state
  that produces one record), commit, send to an in-memory sink, delete the acknowledged
  productions. One batch is one interval commit.
* ``store``: :meth:`CassandraIntervalStore.commit` alone, under one lease, with per key the
  changes one record makes: a state write, one dedup ID and one pending production.

Commits are sequential (one worker, one interval), so the figures are the latency-bound
throughput of one interval; a job runs many intervals in parallel.

``--nodelay`` runs the driver's sockets with TCP_NODELAY (``on``, the default: what
``millstream.connectors.cassandra.connect`` sets), without it (``off``: the driver's own
default), or ``both`` for the comparison. Without it, a request of more than a few KB waits
for the server's delayed ACK (Nagle's algorithm), about 40 ms per LWT.

``--tombstones N`` first deletes ``N`` dedup rows before each cell's interval's rows (plain
deletes, before its first acquire): what a long-running interval holds in front of its live
rows once dedup IDs expired, kept as tombstones for ``gc_grace_seconds``. A conditional
write reads the partition's first live row, so it passes over them unless the interval's
anchor row stops it (``millstream.engine.stores.cassandra.schema.ANCHOR_KIND``).
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from cassandra.cluster import Cluster
from cassandra.concurrent import execute_concurrent_with_args

from millstream.connectors import cassandra as cassandra_connector
from millstream.engine.clock import SystemClock
from millstream.engine.computation import Computation
from millstream.engine.config import DEFAULT_TABLE, MillstreamConfig, load_config
from millstream.engine.context import Context
from millstream.engine.productions import Production
from millstream.engine.protocol import Delivery, IntervalWorker
from millstream.engine.records import Record, injector_record_id
from millstream.engine.state import KeyChanges
from millstream.engine.stores.cassandra import (
    DEFAULT_MAX_BATCH_BYTES,
    CassandraIntervalStore,
    create_schema,
)
from millstream.engine.testing import TestingSink
from millstream.engine.topology import ComputationOptions, ComputationSpec, InputStream

STATE_BYTES = 100
VALUE_BYTES = 100
DEDUP_TTL = 10 * 60 * 1_000_000


@dataclass
class Cell:
    """One measurement: ``commits`` interval commits of ``keys`` keys in ``seconds``."""

    nodelay: bool
    mode: str
    keys: int
    commits: int
    seconds: float
    latencies: list[float]
    lwts: int

    @property
    def commits_per_second(self) -> float:
        return self.commits / self.seconds

    @property
    def records_per_second(self) -> float:
        return self.commits * self.keys / self.seconds


@dataclass(frozen=True)
class Setup:
    session: Any
    keyspace: str
    nodelay: bool
    seconds: float
    max_batch_bytes: int
    tombstones: int = 0

    def store(self) -> CassandraIntervalStore:
        return CassandraIntervalStore(
            self.session, self.keyspace, SystemClock(), max_batch_bytes=self.max_batch_bytes
        )

    def bury(self, computation: str) -> None:
        """``tombstones`` deleted dedup rows in front of interval 0's rows (plain deletes:
        a benchmark's setup, not the store's writes)."""
        if not self.tombstones:
            return
        delete = self.session.prepare(
            f"DELETE FROM {self.keyspace}.{DEFAULT_TABLE} WHERE computation = ? AND interval = 0 "
            "AND kind = 'dedup' AND key = ? AND item = 0x"
        )
        rows = [(computation, f"expired-{n:07d}") for n in range(self.tombstones)]
        for ok, result in execute_concurrent_with_args(self.session, delete, rows, concurrency=64):
            if not ok:
                raise result

    def name(self, mode: str, keys: int) -> str:
        return f"{mode}_{keys}_{'nodelay' if self.nodelay else 'nagle'}"


class Counter(Computation):
    """Counts records per key in state; produces one record per input."""

    def process_record(self, ctx: Context, record: Record) -> None:
        count = int(ctx.get_state() or b"0") + 1
        ctx.set_state(str(count).encode().rjust(STATE_BYTES, b"0"))
        ctx.produce("out", b"v" * VALUE_BYTES, record.timestamp)


def _measure(
    setup: Setup, mode: str, keys: int, step: Callable[[], None], store: CassandraIntervalStore
) -> Cell:
    step()  # warm up: connections, the interval's first acquire and state reads
    before = store.stats.acquire_attempts + store.stats.batches
    latencies: list[float] = []
    started = time.monotonic()
    while time.monotonic() - started < setup.seconds:
        tick = time.monotonic()
        step()
        latencies.append(time.monotonic() - tick)
    elapsed = time.monotonic() - started
    lwts = store.stats.acquire_attempts + store.stats.batches - before
    return Cell(setup.nodelay, mode, keys, len(latencies), elapsed, latencies, lwts)


def key_change(key: str, record_id: bytes) -> KeyChanges:
    """What one record makes of ``key`` in ``store`` mode: its state, its production and its
    dedup ID."""
    production = Production("out", Record(key, b"v" * VALUE_BYTES, 1, record_id))
    return KeyChanges(key, b"s" * STATE_BYTES, {}, [production], [record_id])


def bench_store(setup: Setup, keys: int) -> Cell:
    store = setup.store()
    setup.bury(setup.name("store", keys))
    lease = store.acquire(setup.name("store", keys), 0)
    offsets = itertools.count()

    def step() -> None:
        changes = [
            key_change(f"key-{n:05d}", injector_record_id("bench", keys, next(offsets)))
            for n in range(keys)
        ]
        store.commit(lease, changes, dedup_ttl=DEDUP_TTL)

    return _measure(setup, "store", keys, step, store)


def bench_protocol(setup: Setup, keys: int) -> Cell:
    store = setup.store()
    clock = SystemClock()
    spec = ComputationSpec(
        setup.name("protocol", keys),
        Counter(),
        (InputStream("in"),),
        ("out",),
        ComputationOptions(key_intervals=1),
    )
    sink = TestingSink()
    setup.bury(spec.name)
    worker = IntervalWorker(spec, 0, store=store, sink=sink, clock=clock)
    offsets = itertools.count()

    def step() -> None:
        deliveries = []
        for n in range(keys):
            key = f"key-{n:05d}"
            record_id = injector_record_id("bench", keys, next(offsets))
            deliveries.append(Delivery(key, Record(key, b"x", clock.now(), record_id)))
        result = worker.process(deliveries, 0)
        if result.processed != keys or result.pending:
            raise RuntimeError(f"a benchmark batch did not commit and send everything: {result}")
        sink.sent.clear()  # only the acknowledgements matter here

    return _measure(setup, "protocol", keys, step, store)


@contextmanager
def _session(config: MillstreamConfig, session: Any, nodelay: bool) -> Iterator[Any]:
    if nodelay:
        yield session  # the connector's session sets TCP_NODELAY
        return
    # The connector's settings less TCP_NODELAY: the driver's default, for comparison.
    cluster = Cluster(
        contact_points=list(config.cassandra_hosts),
        port=config.cassandra_port,
        protocol_version=5,
    )
    try:
        yield cluster.connect()
    finally:
        cluster.shutdown()


def _table(cells: Sequence[Cell]) -> str:
    header = (
        f"{'nodelay':<9}{'mode':<10}{'keys/commit':>11}{'commits/s':>11}{'records/s':>11}"
        f"{'p50 ms':>9}{'p95 ms':>9}{'LWTs/commit':>13}"
    )
    lines = [header, "-" * len(header)]
    for cell in cells:
        ordered = sorted(cell.latencies)
        p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
        lines.append(
            f"{'on' if cell.nodelay else 'off':<9}{cell.mode:<10}{cell.keys:>11}"
            f"{cell.commits_per_second:>11.1f}{cell.records_per_second:>11.0f}"
            f"{statistics.median(ordered) * 1e3:>9.1f}{p95 * 1e3:>9.1f}"
            f"{cell.lwts / cell.commits:>13.1f}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="measuring time per cell")
    parser.add_argument("--sizes", default="1,10,100,1000", help="keys per commit")
    parser.add_argument("--max-batch-bytes", type=int, default=DEFAULT_MAX_BATCH_BYTES)
    parser.add_argument("--nodelay", choices=("off", "on", "both"), default="on")
    parser.add_argument(
        "--tombstones", type=int, default=0, help="deleted rows before each interval's rows"
    )
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]
    nodelays = {"off": [False], "on": [True], "both": [False, True]}[args.nodelay]

    config = load_config()
    cluster, session = cassandra_connector.connect(config)
    keyspace = f"bench_{uuid.uuid4().hex[:12]}"
    try:
        version = session.execute("SELECT release_version FROM system.local").one()[0]
        cassandra_connector.create_keyspace(session, keyspace, config.cassandra_replication)
        create_schema(session, keyspace)
        print(
            f"Cassandra {version} at {config.cassandra_hosts[0]}:{config.cassandra_port}; "
            f"max batch {args.max_batch_bytes} B; per key {STATE_BYTES} B state and a "
            f"{VALUE_BYTES} B production; {args.seconds:g} s per cell; "
            f"{args.tombstones} tombstones before each interval's rows",
            flush=True,
        )
        cells = []
        for nodelay in nodelays:
            with _session(config, session, nodelay) as bench_session:
                setup = Setup(
                    bench_session,
                    keyspace,
                    nodelay,
                    args.seconds,
                    args.max_batch_bytes,
                    args.tombstones,
                )
                for bench in (bench_protocol, bench_store):
                    for keys in sizes:
                        cells.append(bench(setup, keys))
                        print(f"  . {setup.name(cells[-1].mode, keys)}", flush=True)
        print(_table(cells))
    finally:
        cassandra_connector.drop_keyspace(session, keyspace)
        cluster.shutdown()


if __name__ == "__main__":
    main()
