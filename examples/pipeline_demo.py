"""The main job, for now: search events through Kafka, Spark and Cassandra.

It produces a burst of generated search events (Avro envelopes) to the topic
``demo.searches``, runs a Structured Streaming query over that topic from its
checkpoint (so each run picks up exactly the events not yet counted), and has
the executors add per-query counts to ``millstream_demo.query_counts`` in
Cassandra with compare-and-set lightweight transactions. It prints what it did.

The anomaly detector of the MillWheel paper (section 2) replaces this job once
the engine runs topologies.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from millstream.connectors import cassandra as cassandra_connector
from millstream.connectors import kafka as kafka_connector
from millstream.engine.config import MillstreamConfig, load_config
from millstream.engine.records import Record, decode_record, encode_record, injector_record_id
from millstream.engine.spark.session import kafka_stream, spark_session

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

TOPIC = "demo.searches"
KEYSPACE = "millstream_demo"
QUERIES = ("weather", "football", "election", "recipes", "eclipse", "flu symptoms", "tickets")


def produce_searches(config: MillstreamConfig, topic: str, count: int, seed: int) -> None:
    """Produce ``count`` search events with IDs derived from (seed, sequence number)."""
    kafka_connector.create_topics(config, [topic], partitions=2)
    rng = random.Random(seed)
    now_us = int(time.time() * 1_000_000)
    producer = kafka_connector.producer(config)
    for i in range(count):
        query = rng.choices(QUERIES, weights=range(len(QUERIES), 0, -1))[0]
        record = Record(
            key=query,
            value=f'{{"query": "{query}", "user": {rng.randrange(1000)}}}'.encode(),
            timestamp=now_us - rng.randrange(60_000_000),
            record_id=injector_record_id(f"pipeline-demo-{seed}", 0, i),
        )
        producer.produce(topic, key=record.key.encode(), value=encode_record(record))
    remaining = producer.flush(60)
    if remaining:
        raise RuntimeError(f"{remaining} events were not acknowledged by Kafka within 60 s")


class CountWriter:
    """foreachBatch sink: count per query on the executors, add to Cassandra by LWT."""

    def __init__(self, config: MillstreamConfig, keyspace: str) -> None:
        self.config = config
        self.keyspace = keyspace
        self.batches: list[tuple[int, int]] = []

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        config, keyspace = self.config, self.keyspace

        def count_partition(rows: Iterable[Any]) -> Iterator[tuple[str, int]]:
            counts: dict[str, int] = {}
            for row in rows:
                record = decode_record(bytes(row.value))
                counts[record.key] = counts.get(record.key, 0) + 1
            yield from counts.items()

        def add_partition(pairs: Iterable[tuple[str, int]]) -> Iterator[int]:
            cluster, session = cassandra_connector.connect(config, keyspace)
            try:
                read = session.prepare("SELECT n FROM query_counts WHERE query = ?")
                insert = session.prepare(
                    "INSERT INTO query_counts (query, n) VALUES (?, ?) IF NOT EXISTS"
                )
                update = session.prepare("UPDATE query_counts SET n = ? WHERE query = ? IF n = ?")
                for query, added in pairs:
                    # Compare-and-set: retry until our read-modify-write wins.
                    while True:
                        row = session.execute(read, (query,)).one()
                        if row is None:
                            applied = session.execute(insert, (query, added)).was_applied
                        else:
                            applied = session.execute(
                                update, (row.n + added, query, row.n)
                            ).was_applied
                        if applied:
                            break
                    yield added
            finally:
                cluster.shutdown()

        per_query = (
            batch.select("value").rdd.mapPartitions(count_partition).reduceByKey(lambda a, b: a + b)
        )
        added = per_query.mapPartitions(add_partition).collect()
        self.batches.append((batch_id, sum(added)))


def run(
    config: MillstreamConfig,
    events: int,
    seed: int,
    topic: str = TOPIC,
    keyspace: str = KEYSPACE,
) -> None:
    print(f"producing {events} search events to Kafka topic {topic!r}")
    produce_searches(config, topic, events, seed)

    cluster, session = cassandra_connector.connect(config)
    try:
        cassandra_connector.create_keyspace(session, keyspace)
        session.execute(
            f"CREATE TABLE IF NOT EXISTS {keyspace}.query_counts (query text PRIMARY KEY, n bigint)"
        )

        spark = spark_session(config, app_name="millstream-pipeline-demo")
        writer = CountWriter(config, keyspace)
        started = time.monotonic()
        query = (
            kafka_stream(spark, config, [topic])
            .writeStream.foreachBatch(writer)
            .option(
                "checkpointLocation", str(config.home / "checkpoints" / f"pipeline-demo-{topic}")
            )
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        elapsed = time.monotonic() - started
        counted = sum(added for _, added in writer.batches)
        print(
            f"Spark counted {counted} new events in {len(writer.batches)} micro-batch(es) "
            f"in {elapsed:.1f} s and added them to Cassandra {keyspace}.query_counts by LWT"
        )
        print("query counts so far (all runs):")
        rows = sorted(
            session.execute(f"SELECT query, n FROM {keyspace}.query_counts"),
            key=lambda row: -row.n,
        )
        for row in rows:
            print(f"  {row.query:<14} {row.n:>8}")
        spark.stop()
    finally:
        cluster.shutdown()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=2000, help="events to generate")
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: time)")
    parser.add_argument("--topic", default=TOPIC, help="Kafka topic of the search events")
    parser.add_argument("--keyspace", default=KEYSPACE, help="Cassandra keyspace of the counts")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else time.time_ns()
    run(load_config(), args.events, seed, args.topic, args.keyspace)
    return 0


if __name__ == "__main__":
    sys.exit(main())
