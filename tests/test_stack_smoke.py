"""Smoke test through all three real parts: Kafka -> Spark Structured Streaming -> Cassandra LWT."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from millstream.connectors import cassandra as cassandra_connector
from millstream.connectors.kafka import producer
from millstream.engine.config import MillstreamConfig
from millstream.engine.records import Record, decode_record, encode_record, injector_record_id
from millstream.spark.session import kafka_stream

if TYPE_CHECKING:
    from cassandra.cluster import Session
    from pyspark.sql import DataFrame, SparkSession

pytestmark = pytest.mark.integration

_BASE_TIME_US = 1_700_000_000_000_000


class LwtWriter:
    """foreachBatch sink: executors decode each record and insert it with ``IF NOT EXISTS``."""

    def __init__(self, config: MillstreamConfig, keyspace: str) -> None:
        self.config = config
        self.keyspace = keyspace
        self.applied = 0
        self.rejected = 0
        self.batches = 0

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        config, keyspace = self.config, self.keyspace

        def write_partition(rows: Iterable[Any]) -> Iterator[bool]:
            cluster, session = cassandra_connector.connect(config, keyspace)
            try:
                insert = session.prepare(
                    "INSERT INTO events (key, record_id, value, timestamp) VALUES (?, ?, ?, ?) "
                    "IF NOT EXISTS"
                )
                for row in rows:
                    record = decode_record(bytes(row.value))
                    result = session.execute(
                        insert, (record.key, record.record_id, record.value, record.timestamp)
                    )
                    yield bool(result.was_applied)
            finally:
                cluster.shutdown()

        outcomes = batch.select("value").rdd.mapPartitions(write_partition).collect()
        self.applied += sum(outcomes)
        self.rejected += len(outcomes) - sum(outcomes)
        self.batches += 1


def test_avro_records_flow_from_kafka_through_spark_into_cassandra_lwt(
    services: MillstreamConfig,
    kafka_topic: Callable[..., str],
    cassandra_keyspace: Callable[[], str],
    cassandra: Session,
    spark: SparkSession,
    tmp_path: Path,
) -> None:
    topic = kafka_topic(partitions=2)
    keyspace = cassandra_keyspace()
    cassandra.execute(
        f"CREATE TABLE {keyspace}.events "
        "(key text, record_id blob, value blob, timestamp bigint, PRIMARY KEY (key, record_id))"
    )
    records = [
        Record(
            key=f"user-{i % 5}",
            value=f"query {i}".encode(),
            timestamp=_BASE_TIME_US + i,
            record_id=injector_record_id("smoke-test", 0, i),
        )
        for i in range(50)
    ]
    # 1. produce Avro records; the first ten twice, as a retrying injector would.
    kafka = producer(services)
    for record in records + records[:10]:
        kafka.produce(topic, key=record.key.encode(), value=encode_record(record))
    assert kafka.flush(30) == 0

    # 2./3. Spark reads the topic through the Kafka connector; foreachBatch writes by LWT.
    writer = LwtWriter(services, keyspace)
    query = (
        kafka_stream(spark, services, [topic])
        .writeStream.foreachBatch(writer)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(timeout=240), "the streaming query did not finish in 240 s"
    assert query.exception() is None

    assert writer.batches >= 1
    assert (writer.applied, writer.rejected) == (50, 10)

    # 4. read the rows back.
    rows = cassandra.execute(f"SELECT key, record_id, value, timestamp FROM {keyspace}.events")
    stored = {Record(row.key, row.value, row.timestamp, row.record_id) for row in rows}
    assert stored == set(records)


def test_lwt_with_a_stale_sequencer_is_rejected(
    cassandra: Session, cassandra_keyspace: Callable[[], str]
) -> None:
    keyspace = cassandra_keyspace()
    cassandra.execute(
        f"CREATE TABLE {keyspace}.intervals (interval int, key text, sequencer bigint static, "
        "state blob, PRIMARY KEY (interval, key))"
    )
    table = f"{keyspace}.intervals"
    assert cassandra.execute(
        f"INSERT INTO {table} (interval, sequencer) VALUES (0, 1) IF NOT EXISTS"
    ).was_applied
    # Worker B takes the interval over from worker A (sequencer 1 -> 2).
    assert cassandra.execute(
        f"UPDATE {table} SET sequencer = 2 WHERE interval = 0 IF sequencer = 1"
    ).was_applied

    # Worker A, a zombie, still believes it holds sequencer 1.
    stale = cassandra.execute(
        f"BEGIN BATCH "
        f"UPDATE {table} SET state = 0x01 WHERE interval = 0 AND key = 'k' IF sequencer = 1; "
        f"APPLY BATCH"
    )
    assert not stale.was_applied
    assert stale.one().sequencer == 2

    fresh = cassandra.execute(
        f"BEGIN BATCH "
        f"UPDATE {table} SET state = 0x02 WHERE interval = 0 AND key = 'k' IF sequencer = 2; "
        f"APPLY BATCH"
    )
    assert fresh.was_applied
    rows = list(cassandra.execute(f"SELECT key, state FROM {table} WHERE interval = 0"))
    assert [(row.key, row.state) for row in rows] == [("k", b"\x02")]
