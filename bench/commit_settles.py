"""What settling a transaction's commit adds to delivering it.

    python bench/commit_settles.py [--transactions N] [--productions M]

A worker takes an interval's transactional productions for delivered only once the commit's
marker reads back as committed (``KafkaTransactionalSink.settled``, a ``require_stable``
offset fetch asked again while the coordinator's markers are not written yet). One interval
delivers transactions of M productions back to back, as a worker under a backlog does, N
for each row: the floor's are the deliveries alone (begin, produce, add the marker, commit:
what the worker waited for before), millstream's the delivery and the settling read after
it. A delivery begun right after a commit waits for that commit's markers (the broker
refuses its partitions as concurrent until they are written), which the settling read has
waited for already: each row's figure is the time from one delivery's start to the next's.
Prints each one's percentiles, the settling read's own, how many reads had to be asked
again, and the ratio of medians. Needs the local stack (``millstream up``).
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `bench.*` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import percentile, percentiles
from millstream.connectors.kafka.topics import admin_client, create_topics
from millstream.connectors.kafka.transactions import (
    KafkaTransactionalSink,
    create_transaction_marker_topic,
    delete_transaction_markers,
)
from millstream.engine.config import load_config
from millstream.engine.productions import CommitTag, DeliveryOutcome, Production
from millstream.engine.records import Record, encode_record, injector_record_id

_TIMEOUT = 10.0
_BLOCK = 10


class _CountingReads(KafkaTransactionalSink):
    """The sink, counting the marker reads its settling makes."""

    reads = 0

    def _read_marker(self, name: str, timeout: float) -> CommitTag | None:
        self.reads += 1
        return super()._read_marker(name, timeout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transactions", type=int, default=100, help="deliveries of each row")
    parser.add_argument("--productions", type=int, default=100, help="productions a delivery")
    args = parser.parse_args()
    config = load_config()
    create_transaction_marker_topic(config)
    keyspace = f"bench_settles_{uuid.uuid4().hex[:8]}"
    topic = f"{keyspace}.out"
    create_topics(config, [topic], partitions=2)
    sink = _CountingReads(config, f"{keyspace}.intervals.{uuid.uuid4().hex[:12]}")
    delivered: list[float] = []
    settled: list[float] = []
    reads: list[float] = []
    retried = 0
    try:
        sink.open("bench", 0, _TIMEOUT)
        number = 0
        # Blocks of each row in turn, so that both see the same moments of a shared machine;
        # a block's first delivery, which follows the other row's, is not counted.
        for block in range(2 * args.transactions // _BLOCK):
            settling = block % 2 == 1
            for step in range(_BLOCK + 1):
                number += 1
                productions = []
                for n in range(args.productions):
                    record = Record(f"k{n}", b"v", 1, injector_record_id("bench", number, n))
                    productions.append(Production(topic, record, encode_record(record)))
                marker = CommitTag(1, number)
                started = time.monotonic()
                outcome = sink.deliver("bench", 0, productions, marker, _TIMEOUT)
                answered = time.monotonic()
                if outcome is not DeliveryOutcome.COMMITTED:
                    raise SystemExit(f"transaction {number} ended {outcome.value}")
                before = sink.reads
                if settling and not sink.settled("bench", 0, marker, _TIMEOUT):
                    raise SystemExit(f"transaction {number} did not settle")
                done = time.monotonic()
                if step == 0:
                    continue
                if not settling:
                    delivered.append((done - started) * 1000)
                    continue
                settled.append((done - started) * 1000)
                reads.append((done - answered) * 1000)
                retried += sink.reads - before > 1
    finally:
        sink.close()
        admin_client(config).delete_topics([topic])
        delete_transaction_markers(config, keyspace)
    print(
        f"delivering a transaction of {args.productions} productions, "
        f"{args.transactions} transactions a row"
    )
    print(f"  floor (delivery)      {percentiles(delivered)}")
    print(f"  millstream (settled)  {percentiles(settled)}")
    print(f"  of which the read     {percentiles(reads)}  asked again: {retried}")
    for q in (50, 95):
        ratio = percentile(settled, q) / percentile(delivered, q)
        print(f"  millstream p{q} / floor p{q}: x{ratio:.2f}")


if __name__ == "__main__":
    main()
