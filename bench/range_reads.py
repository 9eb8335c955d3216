"""How long a Spark task's reader takes to read a batch of a topic it has not read before.

    python bench/range_reads.py [--topics N] [--messages M]

A Python worker keeps one consumer for the batches' ranges (``read_ranges``), assigned to
each batch's topics in turn. librdkafka learns of a topic assigned to a consumer that did
not know it at its next scan of its topics, once a second, unless the consumer asked for the
topic's metadata first. This reads ``--topics`` fresh topics of ``--messages`` messages each,
each one three ways, taking turns: millstream's reader (a long-lived consumer that asks for
a topic's metadata the first time it reads it), the same consumer told the topic is known
(so it does not ask: the reader before it did), and librdkafka's floor, a consumer made for
that one read. Prints each way's percentiles (ms) and the ratio of medians to the floor.
Needs the local stack (``millstream up``).
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `bench.*` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from confluent_kafka import Consumer

from bench.harness import percentile, percentiles
from millstream.connectors import kafka as kafka_connector
from millstream.connectors.stream_reader import range_reader, read_ranges
from millstream.engine.config import MillstreamConfig, load_config
from millstream.spark.isolation import OffsetRange

_PARTITIONS = 2


def _fill(config: MillstreamConfig, topic: str, messages: int) -> list[OffsetRange]:
    kafka_connector.create_topics(config, [topic], partitions=_PARTITIONS)
    writer = kafka_connector.producer(config)
    for n in range(messages):
        writer.produce(topic, value=b"x" * 40, partition=n % _PARTITIONS)
    if writer.flush(30) != 0:
        raise SystemExit(f"could not produce to {topic}")
    return [
        OffsetRange(topic, p, 0, len(range(p, messages, _PARTITIONS))) for p in range(_PARTITIONS)
    ]


def _read(
    config: MillstreamConfig,
    way: str,
    ranges: list[OffsetRange],
    asking: Consumer,
    asking_known: set[str],
    told: Consumer,
) -> int:
    """Read ``ranges`` one ``way``; the messages read."""
    if way == "asks first":
        return sum(1 for _ in read_ranges(asking, ranges, known_topics=asking_known))
    if way == "told it knows":
        known = {r.topic for r in ranges}
        return sum(1 for _ in read_ranges(told, ranges, known_topics=known))
    reader = range_reader(config)
    try:
        return sum(1 for _ in read_ranges(reader, ranges, known_topics=set()))
    finally:
        reader.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--topics", type=int, default=8, help="fresh topics per way")
    parser.add_argument("--messages", type=int, default=20_000, help="messages per topic")
    args = parser.parse_args()
    config = load_config()
    prefix = f"bench_reads_{uuid.uuid4().hex[:8]}"
    asking, told = range_reader(config), range_reader(config)
    asking_known: set[str] = set()
    times: dict[str, list[float]] = {"asks first": [], "told it knows": [], "fresh consumer": []}
    try:
        for round_number in range(args.topics):
            # Each way gets a topic of its own, made before any of the round's reads: a
            # topic is new to the reader that reads it.
            topics = {way: f"{prefix}_{round_number}_{n}" for n, way in enumerate(times)}
            ranges = {way: _fill(config, topic, args.messages) for way, topic in topics.items()}

            order = list(times) if round_number % 2 == 0 else list(reversed(times))
            for way in order:
                started = time.monotonic()
                count = _read(config, way, ranges[way], asking, asking_known, told)
                times[way].append((time.monotonic() - started) * 1000)
                if count != args.messages:
                    raise SystemExit(f"read {count} messages, expected {args.messages}")
    finally:
        asking.close()
        told.close()
        kafka_connector.delete_topics(
            config, [f"{prefix}_{r}_{n}" for r in range(args.topics) for n in range(len(times))]
        )
    floor = percentile(times["fresh consumer"], 50)
    print(f"first read of a fresh topic, {args.messages:,} messages, {args.topics} topics a way")
    for way, found in times.items():
        print(f"  {way:15} {percentiles(found)}  x{percentile(found, 50) / floor:.2f} of the floor")


if __name__ == "__main__":
    main()
