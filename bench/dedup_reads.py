"""A steady job's dedup reads on the real Cassandra: a batch's lookup and a takeover's load.

    python bench/dedup_reads.py [--keys 200] [--live 50] [--expired 0] [--repeats 20]

Needs the local stack (``millstream up``) or the Cassandra named by the configuration. Runs
in a keyspace of its own, dropped at the end. Builds one interval as a job that ran for a
while leaves it: each of ``--keys`` keys committed ``--expired`` times with IDs that have
expired since (Cassandra keeps them as tombstones for ``gc_grace_seconds``, ten days), then
``--live`` times within the dedup TTL (ten minutes; the store's clock moves 0.2 s a commit,
a batch's trigger), every commit one row of the key's IDs. Then times ``--repeats`` of:

* ``lookup``: a batch's dedup lookup (``seen``) of every key, one candidate ID each, none
  seen: what a Bloom filter's positives cost, and every batch of an interval holding more
  IDs than its filter takes;
* ``load``: a takeover's first dedup reads, by a new store each time: the Bloom filter's load
  (``dedup_ids``), then one key's lookup.

Prints each one's p50 and p95 (ms). The script uses the store's public methods only, so the
same run on an earlier checkout (``PYTHONPATH`` at its typecheck tree) compares layouts. How
many tombstones each read passes over, the store's tests check from Cassandra's traces
(``tests/engine/stores/cassandra/test_store.py``); a trace of these reads, paged, reports
only part of what they read.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `bench.*` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import percentile
from millstream.connectors import cassandra as cassandra_connector
from millstream.engine.clock import ManualClock
from millstream.engine.config import load_config
from millstream.engine.sequencer import Lease
from millstream.engine.state import KeyChanges
from millstream.engine.stores.cassandra import CassandraIntervalStore, create_schema

DEDUP_TTL = 10 * 60 * 1_000_000
TRIGGER = 200_000  # µs of the store's clock between two commits


def _now() -> int:
    return time.time_ns() // 1_000


def _commit_all(store: CassandraIntervalStore, lease: Lease, keys: list[str], ttl: int) -> None:
    changes = [KeyChanges(key, dedup_ids=[uuid.uuid4().bytes]) for key in keys]
    store.commit(lease, changes, dedup_ttl=ttl)


def _timed(run: Callable[[], object], repeats: int) -> list[float]:
    run()  # warm: statements prepared, connections open
    latencies = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        latencies.append((time.perf_counter() - started) * 1_000)
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=200, help="keys of the interval")
    parser.add_argument("--live", type=int, default=50, help="live commits of every key")
    parser.add_argument("--expired", type=int, default=0, help="expired commits of every key")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()

    config = load_config()
    cluster, session = cassandra_connector.connect(config)
    keyspace = f"bench_{uuid.uuid4().hex[:12]}"
    keys = [f"key-{n:05d}" for n in range(args.keys)]
    try:
        cassandra_connector.create_keyspace(session, keyspace, config.cassandra_replication)
        create_schema(session, keyspace)
        clock = ManualClock(_now())

        def store() -> CassandraIntervalStore:
            return CassandraIntervalStore(session, keyspace, clock)

        writer = store()
        lease = writer.acquire("c", 0)
        for _ in range(args.expired):
            _commit_all(writer, lease, keys, 1_000_000)
        if args.expired:
            time.sleep(2.2)  # their TTL: 1 s rounded up, plus one
        clock.set(_now())
        for _ in range(args.live):
            clock.advance(TRIGGER)
            _commit_all(writer, lease, keys, DEDUP_TTL)
        print(
            f"{args.keys} keys, each committed {args.expired} times with IDs expired since "
            f"and {args.live} times within the TTL; {args.repeats} repeats",
            flush=True,
        )

        asked = {key: [uuid.uuid4().bytes] for key in keys}

        def lookup() -> None:
            if writer.seen(lease, asked):
                raise SystemExit("a fresh ID counted as seen")

        def load() -> None:
            taker = store()
            taken = taker.acquire("c", 0)
            loaded = taker.dedup_ids(taken, 10_000_000)
            if loaded is None or len(loaded) != args.keys * args.live:
                raise SystemExit(f"the load found {loaded and len(loaded)} IDs")
            taker.seen(taken, {keys[0]: asked[keys[0]]})

        print(f"{'read':8} {'p50 ms':>8} {'p95 ms':>8}")
        for name, run in (("lookup", lookup), ("load", load)):
            latencies = _timed(run, args.repeats)
            p50, p95 = percentile(latencies, 50), percentile(latencies, 95)
            print(f"{name:8} {p50:8.1f} {p95:8.1f}", flush=True)
    finally:
        cassandra_connector.drop_keyspace(session, keyspace)
        cluster.shutdown()


if __name__ == "__main__":
    main()
