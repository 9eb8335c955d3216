"""The executor's two Arrow functions, without Spark: rows are read and written by name."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import pyarrow as pa
import pytest

from millstream.engine.clock import ManualClock
from millstream.engine.computation import Computation
from millstream.engine.config import MillstreamConfig
from millstream.engine.context import Context
from millstream.engine.deadletters import DeadLetter, Origin, decode_dead_letter
from millstream.engine.layout import IntervalLayout
from millstream.engine.protocol import WorkerPool
from millstream.engine.records import (
    Deletion,
    Record,
    deletion_record_id,
    encode_record,
    injector_record_id,
)
from millstream.engine.stores.memory.store import MemoryIntervalStore
from millstream.engine.testing import TestingSink
from millstream.engine.topology import ComputationOptions, Topology
from millstream.spark import executor
from millstream.spark.executor import (
    ROUTED_SCHEMA,
    IntervalSlots,
    RoutedRow,
    TaskSettings,
    interval_task,
    router,
    tick_rows,
)
from millstream.spark.metrics import RESULT_COLUMNS, RESULT_SCHEMA, ResultRow

pytestmark = pytest.mark.unit

WINDOW = 100


class Windows(Computation):
    """Produces each record, and sets a timer at the end of its window."""

    def process_record(self, ctx: Context, record: Record) -> None:
        ctx.produce("out", record.value, record.timestamp)
        ctx.set_timer("window", record.timestamp // WINDOW * WINDOW + WINDOW - 1)


class Unused:
    def shutdown(self) -> None:
        pass


@pytest.fixture
def sink(monkeypatch: pytest.MonkeyPatch) -> Iterator[TestingSink]:
    """The process's resources for the test's settings: the memory store, a testing sink."""
    clock = ManualClock(1_000)
    sink = TestingSink()
    threads = ThreadPoolExecutor(2)
    # No Cassandra session, no Kafka producer to close: the pool holds what the tasks use.
    resources = executor._Resources(
        Unused(),
        cast(Any, sink),
        cast(Any, None),  # no transactions: productions go to the testing sink
        WorkerPool(MemoryIntervalStore(clock), sink, clock),
        threads,
    )
    monkeypatch.setitem(executor._CACHE, SETTINGS.endpoints, resources)
    yield sink
    threads.shutdown()


SETTINGS = TaskSettings(MillstreamConfig(), "keyspace", "table", "run-1", "keyspace.table.0")
SPEC_OF_DEFAULTS = Topology("t", streams=["in"]).add_computation("c", Computation(), inputs=["in"])


def messages(*values: bytes) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {
            "value": list(values),
            "topic": ["in"] * len(values),
            "partition": [0] * len(values),
            "offset": list(range(len(values))),
            "kafka_ts": [5] * len(values),
        }
    )


def record(key: str, timestamp: int, number: int) -> bytes:
    return encode_record(Record(key, key.encode(), timestamp, injector_record_id("t", 0, number)))


def test_the_row_schemas_are_the_spark_schemas_the_queries_were_started_with() -> None:
    assert ROUTED_SCHEMA == (
        "interval int, stream string, partition int, offset long, kafka_ts long, "
        "key string, record_key string, record_value binary, record_ts long, record_id binary, "
        "raw binary, error string, slot int"
    )
    assert [part.split()[0] for part in ROUTED_SCHEMA.split(", ")] == list(RoutedRow._fields)
    assert [part.split()[0] for part in RESULT_SCHEMA.split(", ")] == [
        name for name, _ in RESULT_COLUMNS
    ]


def test_messages_are_routed_worked_and_counted_by_interval(sink: TestingSink) -> None:
    topology = Topology("t", streams=["in"])
    spec = topology.add_computation(
        "windows",
        Windows(),
        inputs=["in"],
        outputs=["out"],
        options=ComputationOptions(key_intervals=4),
    )
    layout = IntervalLayout.initial(4)
    slots = IntervalSlots(2)
    routed = list(
        router(spec, layout, slots)(
            iter([messages(record("a", 10, 0), b"not a record", record("b", 20, 1))])
        )
    )
    rows = [RoutedRow(**row) for batch in routed for row in batch.to_pylist()]
    good = [row for row in rows if row.error is None]
    assert [(row.key, row.record_ts, row.interval) for row in good] == [
        ("a", 10, layout.interval_of("a")),
        ("b", 20, layout.interval_of("b")),
    ]
    (bad,) = [row for row in rows if row.error is not None]
    assert bad.raw == b"not a record"
    assert bad.error is not None
    assert bad.key is None
    assert all(row.slot == slots.slot(row.interval) for row in rows)

    quiet = next(i for i in layout.ids if i not in {row.interval for row in rows})
    ticks = pa.RecordBatch.from_pylist(
        [row._asdict() for row in tick_rows([quiet], slots)], schema=routed[0].schema
    )
    task = interval_task(spec, SETTINGS, 0, 1_000, layout)
    results = [
        ResultRow.of(row) for batch in task(iter([*routed, ticks])) for row in batch.to_pylist()
    ]
    by_interval = {row.interval: row for row in results}
    assert set(by_interval) == {*(row.interval for row in rows), quiet}
    assert by_interval[quiet].counts.inputs == 0  # the tick ran the interval without input
    assert sum(row.counts.inputs for row in results) == 3
    assert sum(row.counts.rejected for row in results) == 1
    assert sum(row.counts.processed for row in results) == 2
    assert sum(row.counts.fired_timers for row in results) == 2  # both windows closed at 1000
    assert all(row.computation == "windows" and row.counts.intervals == 1 for row in results)
    assert by_interval[good[0].interval].progress.oldest_work is None  # nothing left to do
    assert sorted(p.record.value for p in sink.delivered("out")) == [b"a", b"b"]


def kafka_batch(
    values: list[bytes | None], keys: list[bytes | None] | None = None
) -> pa.RecordBatch:
    """Messages of stream ``in`` at offsets 0, 1, ...; with ``keys``, the key column too."""
    columns = {
        "value": pa.array(values, pa.binary()),
        "topic": pa.array(["in"] * len(values)),
        "partition": pa.array([0] * len(values), pa.int32()),
        "offset": pa.array(range(len(values)), pa.int64()),
        "kafka_ts": pa.array([5] * len(values), pa.int64()),
    }
    if keys is not None:
        columns["key"] = pa.array(keys, pa.binary())
    return pa.RecordBatch.from_pydict(columns)


def dead_letters(sink: TestingSink, computation: str) -> dict[int | None, DeadLetter]:
    """The computation's dead letters by the offset of their input."""
    letters = (
        decode_dead_letter(p.record.value) for p in sink.delivered(f"{computation}.dead-letters")
    )
    return {letter.origin.offset: letter for letter in letters}


def test_a_tombstone_or_an_empty_value_is_dead_lettered_and_the_partition_goes_on(
    sink: TestingSink,
) -> None:
    topology = Topology("t", streams=["in"])
    spec = topology.add_computation("windows", Windows(), inputs=["in"], outputs=["out"])
    routed = list(
        router(spec)(iter([kafka_batch([record("a", 10, 0), None, b"", record("b", 20, 1)])]))
    )
    rows = [RoutedRow(**row) for batch in routed for row in batch.to_pylist()]
    assert len(rows) == 4
    tombstone, empty = rows[1], rows[2]
    assert tombstone.error is not None
    assert tombstone.error.startswith("TombstoneError: ")
    assert "tombstones='deliver'" in tombstone.error
    assert empty.error is not None
    assert empty.error.startswith("MalformedRecordError: ")

    task = interval_task(spec, SETTINGS, 0, 0)
    results = [ResultRow.of(row) for batch in task(iter(routed)) for row in batch.to_pylist()]
    assert sum(row.counts.rejected for row in results) == 2
    assert sum(row.counts.processed for row in results) == 2
    letters = dead_letters(sink, "windows")
    assert {offset: letter.error_type for offset, letter in letters.items()} == {
        1: "TombstoneError",
        2: "MalformedRecordError",
    }
    assert letters[1].origin == Origin(stream="in", partition=0, offset=1)
    assert (letters[1].raw, letters[1].raw_size) == (b"", 0)
    assert letters[1].error_message == tombstone.error.removeprefix("TombstoneError: ")
    assert sorted(p.record.value for p in sink.delivered("out")) == [b"a", b"b"]


class Registry(Computation):
    """Keeps each key's latest value; a deletion clears it and says so on ``out``."""

    def process_record(self, ctx: Context, record: Record) -> None:
        ctx.set_state(record.value)

    def process_deletion(self, ctx: Context, deletion: Deletion) -> None:
        ctx.clear_state()
        ctx.produce("out", f"deleted {deletion.key}".encode(), deletion.timestamp)


def test_a_computation_taking_tombstones_gets_each_keyed_one_as_a_deletion(
    sink: TestingSink,
) -> None:
    topology = Topology("t", streams=["in"])
    spec = topology.add_computation(
        "registry",
        Registry(),
        inputs=["in"],
        outputs=["out"],
        options=ComputationOptions(key_intervals=4, tombstones="deliver"),
    )
    assert executor.source_columns(spec) == (*executor.source_columns(SPEC_OF_DEFAULTS), "key")
    layout = IntervalLayout.initial(4)
    batch = kafka_batch(
        [record("a", 10, 0), record("b", 11, 1), None, None, None],
        [b"a", b"b", b"a", None, b"\xff"],
    )
    routed = list(router(spec, layout)(iter([batch])))
    rows = [RoutedRow(**row) for batch in routed for row in batch.to_pylist()]
    deletion = rows[2]
    assert (deletion.key, deletion.error, deletion.record_value) == ("a", None, None)
    assert (deletion.record_ts, deletion.record_id) == (5, deletion_record_id("in", 0, 2))
    assert deletion.interval == layout.interval_of("a")

    task = interval_task(spec, SETTINGS, 0, 0, layout)
    results = [ResultRow.of(row) for batch in task(iter(routed)) for row in batch.to_pylist()]
    assert sum(row.counts.processed for row in results) == 3  # two records, one deletion
    assert sum(row.counts.rejected for row in results) == 2
    store = executor._CACHE[SETTINGS.endpoints].workers.store
    assert isinstance(store, MemoryIntervalStore)
    assert store.states("registry") == {"b": b"b"}
    assert [p.record.value for p in sink.delivered("out")] == [b"deleted a"]
    letters = dead_letters(sink, "registry")
    assert {offset: letter.error_type for offset, letter in letters.items()} == {
        3: "TombstoneError",
        4: "TombstoneError",
    }
    assert "has no key" in letters[3].error_message
    assert "not UTF-8" in letters[4].error_message
