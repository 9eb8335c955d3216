"""Poison pills on the real Kafka, Cassandra and Spark: a record that makes the engine itself
fail is isolated, quarantined and dead-lettered once; a failure of every batch is not.

The engine fails through a fault point (:mod:`millstream.engine.fault_points`) armed in the
Python workers' environment, not in user code.
"""

from __future__ import annotations

import math
import shutil
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from millstream.connectors import kafka as kafka_connector
from millstream.engine import fault_points
from millstream.engine.codecs import IntCodec
from millstream.engine.computation import Computation
from millstream.engine.config import MillstreamConfig
from millstream.engine.context import Context
from millstream.engine.deadletters import DeadLetter, decode_dead_letter
from millstream.engine.fault_points import ALWAYS, ENVIRONMENT_VARIABLE, arm_fault
from millstream.engine.records import Record, decode_record, encode_record, injector_record_id
from millstream.engine.topology import ComputationOptions, Topology
from millstream.spark import executor
from millstream.spark.quarantine import QUARANTINE_DIRECTORY
from millstream.spark.runner import AvailableNow, RunningTopology, run_topology
from tests.spark.test_runner import read_topic, register_by_value

if TYPE_CHECKING:
    from cassandra.cluster import Session
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.integration

INTERVALS = 4  # as test_runner.states reads them
PARTITIONS = 3
BASE_TIME = 1_700_000_000_000_000


class KeyedCount(Computation):
    """Counts records per key; produces each input's record ID."""

    def __init__(self, output: str) -> None:
        self.output = output

    def process_record(self, ctx: Context, record: Record) -> None:
        count = ctx.state(IntCodec())
        count.set(count.get(0) + 1)
        ctx.produce(self.output, record.record_id, record.timestamp)


@dataclass
class Counting:
    """One test's names and checkpoints."""

    name: str
    keyspace: str
    checkpoints: Path
    faults: Path

    @property
    def inputs(self) -> str:
        return f"{self.name}_in"

    @property
    def outputs(self) -> str:
        return f"{self.name}_out"

    @property
    def dead_letters(self) -> str:
        return f"{self.name}.dead-letters"

    @property
    def checkpoint(self) -> Path:
        return self.checkpoints / self.name / self.name

    def topology(self) -> Topology:
        topology = Topology(self.name, streams=[self.inputs])
        topology.add_computation(
            self.name,
            KeyedCount(self.outputs),
            inputs=[self.inputs],
            outputs=[self.outputs],
            options=ComputationOptions(key_intervals=INTERVALS),
        )
        return topology


@pytest.fixture
def counting(
    services: MillstreamConfig,
    spark: SparkSession,
    unique: Callable[[str], str],
    cassandra_keyspace: Callable[[], str],
    tmp_path: Path,
) -> Iterator[Counting]:
    import sys

    register_by_value(sys.modules[__name__])
    made = Counting(unique("poison"), cassandra_keyspace(), tmp_path / "cp", tmp_path / "faults")
    made.faults.mkdir()
    # The Python workers read the fault points as they start: Spark starts workers of their
    # own for functions shipped with this environment, and the old ones again without it.
    environment = spark.sparkContext.environment
    environment[ENVIRONMENT_VARIABLE] = str(made.faults)
    kafka_connector.create_topics(services, [made.inputs], partitions=PARTITIONS)
    try:
        yield made
    finally:
        del environment[ENVIRONMENT_VARIABLE]
        kafka_connector.delete_topics(services, [made.inputs, made.outputs, made.dead_letters])


def _armed_in_a_worker(
    place: str, computation: str
) -> Callable[[int, Iterable[Any]], Iterator[dict[str, Any]]]:
    def probe(_index: int, elements: Iterable[Any]) -> Iterator[dict[str, Any]]:
        import os

        from millstream.engine.fault_points import ENVIRONMENT_VARIABLE, armed_faults

        for _ in elements:
            pass
        yield {
            "pid": os.getpid(),
            "directory": os.environ.get(ENVIRONMENT_VARIABLE),
            "armed": ",".join(sorted(armed_faults(place, computation))),
        }

    return probe


def assert_armed_in_the_workers(
    spark: SparkSession, counting: Counting, place: str, subject: str
) -> None:
    """The Spark Python workers that will run the batches see the fault armed (a fault that
    never fires would otherwise show only as a record counted or a batch that did not fail)."""
    # The executor's task is a closure, shipped by value with the functions it calls; a
    # function its module no longer holds (the module reloaded in this process) goes by value
    # too, with this process's unset fault directory, and never fires in the workers.
    assert vars(executor)["fault_point"] is fault_points.fault_point
    assert vars(executor)["armed_faults"] is fault_points.armed_faults
    tasks = spark.sparkContext.defaultParallelism
    numbers = spark.sparkContext.parallelize(range(tasks), tasks)  # as the engine's tasks
    seen = numbers.mapPartitionsWithIndex(_armed_in_a_worker(place, counting.name)).collect()
    assert all(row["armed"] == subject for row in seen), (
        f"the fault armed in {counting.faults} did not reach the Python workers: {seen}"
    )


def records(first: int, last: int) -> list[Record]:
    """Records ``first``..``last - 1``; record ``n`` goes to partition ``n % PARTITIONS``."""
    return [
        Record(f"key-{n % 11}", b"", BASE_TIME + n, injector_record_id("poison", 0, n))
        for n in range(first, last)
    ]


def produce(config: MillstreamConfig, topic: str, batch: list[Record], first: int) -> None:
    producer = kafka_connector.producer(config)
    for n, record in enumerate(batch, start=first):
        producer.produce(topic, value=encode_record(record), partition=n % PARTITIONS)
    assert producer.flush(30) == 0


def start(counting: Counting, config: MillstreamConfig, spark: SparkSession) -> RunningTopology:
    run = replace(
        config.run,
        keyspace=counting.keyspace,
        checkpoint_root=counting.checkpoints,
        create_keyspace=False,
        batch_attempts=2,
    )
    return run_topology(counting.topology(), config, run, trigger=AvailableNow(), spark=spark)


def dead_letters(config: MillstreamConfig, counting: Counting) -> list[DeadLetter]:
    return [
        decode_dead_letter(decode_record(value).value)
        for _, _, value in read_topic(config, counting.dead_letters)
    ]


def counts(session: Session, counting: Counting) -> dict[str, int]:
    """The count committed for each key, from every interval."""
    found: dict[str, int] = {}
    for interval in range(INTERVALS):
        rows = session.execute(
            f"SELECT key, value FROM {counting.keyspace}.intervals "
            "WHERE computation = %s AND interval = %s AND kind = 'state'",
            (counting.name, interval),
        )
        found.update({row.key: IntCodec().decode(row.value) for row in rows})
    return found


def assert_counted(
    config: MillstreamConfig, session: Session, counting: Counting, counted: list[Record]
) -> None:
    """State and outputs hold each of ``counted`` exactly once, and nothing else."""
    expected = Counter(record.key for record in counted)
    assert counts(session, counting) == dict(expected)
    outputs = [decode_record(value).value for _, _, value in read_topic(config, counting.outputs)]
    assert sorted(outputs) == sorted(record.record_id for record in counted)


def rewind(checkpoint: Path, batch_id: int) -> None:
    """Make the query's checkpoint say that ``batch_id`` ran but was not committed (a driver
    that died right after it): its next run replays the batch."""
    for log, after in (("offsets", batch_id + 1), ("commits", batch_id)):
        for entry in list((checkpoint / log).iterdir()):
            number = entry.name.removeprefix(".").removesuffix(".crc")
            if number.isdigit() and int(number) >= after:
                entry.unlink()  # the entry and its checksum file


def test_a_record_that_crashes_the_engine_is_dead_lettered_once_and_the_rest_counted(
    services: MillstreamConfig, spark: SparkSession, cassandra: Session, counting: Counting
) -> None:
    first = records(0, 300)
    poison = first[150]  # partition 0, offset 50
    arm_fault(counting.faults, "executor.record", counting.name, poison.record_id.hex())
    assert_armed_in_the_workers(spark, counting, "executor.record", poison.record_id.hex())
    produce(services, counting.inputs, first, 0)

    started = time.monotonic()
    with start(counting, services, spark) as running:
        running.process_available(timeout=300)
        batches = running.batches(counting.name)
        metrics = running.metrics()[counting.name]
    isolating = [batch for batch in batches if batch.isolation_runs]
    print(f"isolated in {time.monotonic() - started:.1f}s: {isolating}")

    good = [record for record in first if record is not poison]
    assert_counted(services, cassandra, counting, good)
    (letter,) = dead_letters(services, counting)
    assert letter.error_type == "PoisonRecordError"
    assert (letter.origin.stream, letter.origin.partition, letter.origin.offset) == (
        counting.inputs,
        0,
        50,
    )
    assert "InjectedFault" in letter.error_message
    assert "Traceback (most recent call last)" in letter.error_message
    assert letter.raw == encode_record(poison)
    (batch,) = isolating
    assert (metrics.isolated, batch.isolated) == (1, 1)
    records_in_batch = batch.inputs
    assert records_in_batch > 1
    assert batch.isolation_runs <= 2 * math.ceil(math.log2(records_in_batch)) + 3
    assert batch.rejected == batch.dead_letters == 1
    assert [p.name for p in (counting.checkpoint / QUARANTINE_DIRECTORY).iterdir()] == [
        f"{counting.inputs}@0@50.json"
    ]

    # A driver that died after the batch ran, before Spark committed it, replays it on the
    # same checkpoint, the fault still armed: the quarantine skips the record at once.
    rewind(counting.checkpoint, batch.batch_id)
    second = records(300, 330)
    produce(services, counting.inputs, second, 300)
    with start(counting, services, spark) as running:
        running.process_available(timeout=300)
        replayed = running.batches(counting.name)
        again = running.metrics()[counting.name]
    assert batch.batch_id in [b.batch_id for b in replayed]
    assert (again.isolated, again.isolation_runs, again.failed_attempts) == (0, 0, 0)
    assert again.duplicates >= len(good)  # the replayed batch's records, committed before
    assert_counted(services, cassandra, counting, good + second)
    assert len(dead_letters(services, counting)) == 1


def test_a_failure_of_every_batch_is_not_bisected_into_dead_letters(
    services: MillstreamConfig, spark: SparkSession, cassandra: Session, counting: Counting
) -> None:
    batch = records(0, 12)
    arm_fault(counting.faults, "executor.task", counting.name)  # every task, no matter what
    assert_armed_in_the_workers(spark, counting, "executor.task", ALWAYS)
    produce(services, counting.inputs, batch, 0)

    started = time.monotonic()
    with (
        start(counting, services, spark) as running,
        pytest.raises(Exception, match="InjectedFault") as failed,
    ):
        running.process_available(timeout=300)
    print(f"failed in {time.monotonic() - started:.1f}s")

    assert "PoisonIsolationError" not in str(failed.value)
    assert dead_letters(services, counting) == []
    assert not (counting.checkpoint / QUARANTINE_DIRECTORY).exists()
    assert counts(cassandra, counting) == {}

    # Disarmed, the same batch runs: nothing was lost.
    shutil.rmtree(counting.faults)
    counting.faults.mkdir()
    with start(counting, services, spark) as running:
        running.process_available(timeout=300)
    assert_counted(services, cassandra, counting, batch)
