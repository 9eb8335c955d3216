"""How long opening an interval's transactional producer takes, as Spark moves the interval.

    python bench/transaction_opens.py [--opens N]

Spark hands a task to whichever Python worker is idle, so an interval's transactional
producer is opened again (fencing the other worker's) about every other batch. Two sinks
take turns opening one interval, as two workers would: millstream's open
(``KafkaTransactionalSink.open``: a new producer, ``init_transactions``, the marker read)
against librdkafka's own floor, a new producer and ``init_transactions`` alone, in the same
run. Prints each one's percentiles, how many waited over 300 ms, and the ratio of medians.
Needs the local stack (``millstream up``).
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from confluent_kafka import KafkaException

if __package__ in (None, ""):  # run as a script: make `bench.*` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import percentile, percentiles
from millstream.connectors.kafka.clients import producer
from millstream.connectors.kafka.transactions import (
    KafkaTransactionalSink,
    create_transaction_marker_topic,
    delete_transaction_markers,
    transactional_id,
)
from millstream.engine.config import MillstreamConfig, load_config

_TIMEOUT = 10.0
_SLOW_MS = 300.0


def _timed(opens: int, open_one: Callable[[int], None]) -> list[float]:
    times = []
    for number in range(opens):
        started = time.monotonic()
        open_one(number)
        times.append((time.monotonic() - started) * 1000)
    return times


def _librdkafka(config: MillstreamConfig, namespace: str) -> Callable[[int], None]:
    name = transactional_id(namespace, "floor", 0)

    def open_one(_: int) -> None:
        settings: dict[str, str | int | bool] = {"transactional.id": name, "linger.ms": 0}
        made = producer(config, **settings)
        try:
            made.init_transactions(_TIMEOUT)
        except KafkaException as exc:
            raise SystemExit(f"init_transactions failed: {exc}") from exc

    return open_one


def _millstream(config: MillstreamConfig, namespace: str) -> Callable[[int], None]:
    sinks = (KafkaTransactionalSink(config, namespace), KafkaTransactionalSink(config, namespace))

    def open_one(number: int) -> None:
        sinks[number % 2].open("millstream", 0, _TIMEOUT)

    return open_one


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--opens", type=int, default=40, help="opens of each row")
    args = parser.parse_args()
    config = load_config()
    create_transaction_marker_topic(config)
    keyspace = f"bench_opens_{uuid.uuid4().hex[:8]}"
    namespace = f"{keyspace}.intervals.{uuid.uuid4().hex[:12]}"
    rows: dict[str, list[float]] = {}
    try:
        # Interleaved rounds, so that both rows see the same moments of a shared machine.
        for _ in range(2):
            for name, make in (("librdkafka", _librdkafka), ("millstream", _millstream)):
                rows.setdefault(name, []).extend(_timed(args.opens // 2, make(config, namespace)))
    finally:
        delete_transaction_markers(config, keyspace)
    print(f"opening a transactional producer, two owners taking turns, {args.opens} opens each")
    for name, times in rows.items():
        slow = sum(t > _SLOW_MS for t in times)
        print(f"  {name:<11} {percentiles(times)}  over {_SLOW_MS:.0f} ms: {slow}")
    for q in (50, 95):
        ratio = percentile(rows["millstream"], q) / percentile(rows["librdkafka"], q)
        print(f"  millstream p{q} / librdkafka p{q}: x{ratio:.2f}")


if __name__ == "__main__":
    main()
