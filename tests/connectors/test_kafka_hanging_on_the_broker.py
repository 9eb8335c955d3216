"""Hanging transactions on the real broker: one no coordinator knows pins its partition's
last stable offset until the sweep aborts it; a live transaction, however old it looks, is
left to its producer."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from pyspark.sql import SparkSession

from millstream.connectors.kafka import admin_client, java_client_settings
from millstream.connectors.kafka.clients import producer
from millstream.connectors.kafka.hanging import (
    HangingTransactionSweeper,
    JavaTransactionAdmin,
    find_hanging,
)
from millstream.connectors.kafka.stalls import stable_offsets
from millstream.devtools.local.hanging_transactions import write_hanging_transaction
from millstream.engine.clock import SystemClock
from millstream.engine.config import MillstreamConfig
from tests.waiting import wait_until

pytestmark = pytest.mark.integration


def last_stable_offset(config: MillstreamConfig, topic: str, partition: int) -> int:
    admin = admin_client(config)
    stable, _ = stable_offsets(admin, [topic])[(topic, partition)]
    return stable


@pytest.fixture
def java_admin(services: MillstreamConfig, spark: SparkSession) -> Iterator[JavaTransactionAdmin]:
    admin = JavaTransactionAdmin(spark.sparkContext._jvm, java_client_settings(services))
    yield admin
    admin.close()


def test_a_hanging_transaction_pins_its_partition_until_swept_and_a_live_one_is_left(
    services: MillstreamConfig,
    kafka_topic: Callable[..., str],
    java_admin: JavaTransactionAdmin,
    unique: Callable[[str], str],
) -> None:
    topic = kafka_topic(partitions=2)
    producer_id, offset = write_hanging_transaction(services, topic, 0, age=600.0)
    # A live transaction on partition 1, begun by a real producer and still open.
    settings: dict[str, str | int] = {"transactional.id": unique("live"), "linger.ms": 0}
    live = producer(services, **settings)
    live.init_transactions(30)
    live.begin_transaction()
    live.produce(topic, b"live", partition=1)
    live.flush(30)
    plain = producer(services)
    plain.produce(topic, b"after", partition=0)
    plain.flush(30)
    # read_committed readers stop at the hanging transaction's first record, for good.
    assert last_stable_offset(services, topic, 0) == offset
    assert last_stable_offset(services, topic, 1) == 0

    found = find_hanging(
        java_admin,
        java_admin.partitions([topic]),
        now_ms=SystemClock().now() // 1000,
        older_than_ms=0,
    )
    assert [(t.topic, t.partition, t.producer_id) for t in found] == [(topic, 0, producer_id)]

    # Ten minutes silent against a minute: the sweep aborts it, and only it.
    sweeper = HangingTransactionSweeper(
        lambda: java_admin, lambda: [topic], SystemClock(), older_than=60.0
    )
    [aborted] = sweeper.sweep()
    assert (aborted.topic, aborted.partition, aborted.start_offset) == (topic, 0, offset)
    # Past the aborted record, the plain record and the abort marker.
    assert last_stable_offset(services, topic, 0) == offset + 3
    assert last_stable_offset(services, topic, 1) == 0
    assert sweeper.sweep() == []
    # The live transaction was left whole: it still commits.
    live.commit_transaction(30)
    # A producer's commit returns once its coordinator has logged the decision; the
    # coordinator writes the commit markers to the partitions after that, and only a marker
    # moves the last stable offset (under load the read right after the commit came first).
    wait_until(
        "the live transaction's commit marker",
        lambda: last_stable_offset(services, topic, 1) >= 2,
    )
    assert last_stable_offset(services, topic, 1) == 2
