"""The executor's batch task, without Spark or Kafka: each task reads the batch's messages
(here from a list), routes them and works the intervals of its number."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast
from unittest.mock import patch

import pytest

from millstream.connectors.stream_reader import InputMessage
from millstream.engine.clock import ManualClock
from millstream.engine.computation import Computation
from millstream.engine.config import MillstreamConfig, RunSettings
from millstream.engine.context import Context
from millstream.engine.deadletters import DeadLetter, Origin, decode_dead_letter
from millstream.engine.errors import FencedError
from millstream.engine.layout import IntervalLayout
from millstream.engine.protocol import STEPS
from millstream.engine.records import (
    Deletion,
    Record,
    encode_record,
    injector_record_id,
)
from millstream.engine.routing import rejected_interval
from millstream.engine.stores.memory.store import MemoryIntervalStore
from millstream.engine.testing import TestingSink
from millstream.engine.topology import ComputationOptions, ComputationSpec, Topology
from millstream.engine.worker_pool import WorkerPool
from millstream.spark import executor
from millstream.spark.executor import (
    BatchInput,
    BatchTask,
    IntervalSlots,
    Skip,
    TaskSettings,
    WarmTask,
    batch_task,
    claim_slot,
    meet_workers,
)
from millstream.spark.isolation import OffsetRange, Position
from millstream.spark.metrics import RESULT_COLUMNS, RESULT_SCHEMA, ROUTING, ResultRow

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
    monkeypatch.setattr(executor, "_LAST_RAN", {})
    yield sink
    threads.shutdown()


SETTINGS = TaskSettings(MillstreamConfig(), "keyspace", "table", "run-1", "keyspace.table.0")
SPEC_OF_DEFAULTS = Topology("t", streams=["in"]).add_computation("c", Computation(), inputs=["in"])


def messages(
    values: Sequence[bytes | None], keys: Sequence[bytes | None] | None = None
) -> list[InputMessage]:
    """Messages of stream ``in``, partition 0, at offsets 0, 1, ..., Kafka timestamp 5."""
    keys = keys or [None] * len(values)
    return [
        InputMessage("in", 0, offset, 5, key, value)
        for offset, (key, value) in enumerate(zip(keys, values, strict=True))
    ]


def run_batch(
    spec: ComputationSpec,
    sent: list[InputMessage],
    layout: IntervalLayout | None = None,
    *,
    tasks: int = 2,
    ticks: Iterable[int] = (),
    timer_watermark: int = 0,
    quarantine: Mapping[Position, str] | None = None,
    claims: Path | None = None,
    processes: Sequence[dict[str, int]] = (),
) -> list[ResultRow]:
    """Every task of a batch of ``sent`` (read in one range), as Spark would run them; the
    rows of all of them. Checks that no interval ran in two tasks. With ``claims``, task
    ``n`` runs in a process whose last slots are ``processes[n]``. The reader leaves out
    what a task says to skip, as Kafka's does."""
    layout = layout or IntervalLayout.initial(spec.options.starting_intervals())
    batch = BatchInput(
        ranges=(OffsetRange("in", 0, 0, len(sent)),),
        ticks=tuple(ticks),
        slots=IntervalSlots(tasks),
        quarantine=quarantine or {},
        claims=None if claims is None else str(claims),
    )

    def read(
        settings: TaskSettings, ranges: Sequence[OffsetRange], skip: Skip
    ) -> list[InputMessage]:
        assert settings == SETTINGS
        assert tuple(ranges) == batch.ranges
        return [m for m in sent if not skip(m.topic, m.value)]

    results: list[ResultRow] = []
    for number in range(tasks):
        task = batch_task(spec, SETTINGS, 0, timer_watermark, layout, batch, read)
        process = processes[number] if processes else {}
        with patch.object(executor, "_LAST_SLOT", process):
            # Partition `number` of the job's RDD, whose one element is its number.
            rows = [ResultRow.of(row) for row in task(number, iter([number]))]
        slot = number if claims is None else process[SETTINGS.run_token]
        assert all(batch.slots.task_of(row.interval) == slot for row in rows)
        results += rows
    intervals = [row.interval for row in results]
    assert len(intervals) == len(set(intervals)), "an interval ran in two tasks"
    return results


def record(key: str, timestamp: int, number: int) -> bytes:
    return encode_record(Record(key, key.encode(), timestamp, injector_record_id("t", 0, number)))


def test_the_result_schema_names_the_result_columns() -> None:
    assert [part.split()[0] for part in RESULT_SCHEMA.split(", ")] == [
        name for name, _ in RESULT_COLUMNS
    ]


def windows(intervals: int) -> tuple[ComputationSpec, IntervalLayout]:
    """A ``Windows`` computation over ``intervals`` key intervals, and their layout."""
    topology = Topology("t", streams=["in"])
    spec = topology.add_computation(
        "windows",
        Windows(),
        inputs=["in"],
        outputs=["out"],
        options=ComputationOptions(key_intervals=intervals),
    )
    return spec, IntervalLayout.initial(intervals)


def test_messages_are_routed_worked_and_counted_by_interval(sink: TestingSink) -> None:
    spec, layout = windows(4)
    sent = messages([record("a", 10, 0), b"not a record", record("b", 20, 1)])
    busy = {layout.interval_of("a"), layout.interval_of("b"), rejected_interval(spec, layout)}
    quiet = next(i for i in layout.ids if i not in busy)
    results = run_batch(spec, sent, layout, ticks=[quiet], timer_watermark=1_000)
    by_interval = {row.interval: row for row in results}
    assert set(by_interval) == {*busy, quiet}
    assert by_interval[quiet].counts.inputs == 0  # the tick ran the interval without input
    assert sum(row.counts.inputs for row in results) == 3
    assert sum(row.counts.rejected for row in results) == 1
    assert by_interval[rejected_interval(spec, layout)].counts.rejected == 1
    assert sum(row.counts.processed for row in results) == 2
    assert sum(row.counts.fired_timers for row in results) == 2  # both windows closed at 1000
    assert all(row.computation == "windows" and row.counts.intervals == 1 for row in results)
    assert by_interval[layout.interval_of("a")].progress.oldest_work is None  # nothing left
    assert sorted(p.record.value for p in sink.delivered("out")) == [b"a", b"b"]
    letter = dead_letters(sink, "windows")[1]
    assert (letter.origin, letter.raw) == (Origin("in", 0, 1), b"not a record")
    assert letter.error_type == "MalformedRecordError"


def test_a_row_times_its_intervals_steps_and_a_task_its_routing_once(sink: TestingSink) -> None:
    spec, layout = windows(4)
    sent = messages([record("a", 10, 0), record("b", 20, 1), record("c", 30, 2)])
    results = run_batch(spec, sent, layout, ticks=layout.ids)
    assert len(results) == 4
    assert all(list(row.steps) in (list(STEPS), [*STEPS, ROUTING]) for row in results)
    assert sum(ROUTING in row.steps for row in results) == 2  # the two tasks
    assert all(t.seconds >= 0 and t.cpu_seconds >= 0 for r in results for t in r.steps.values())


def test_a_task_checks_the_leases_its_intervals_keep_while_it_reads_its_input(
    sink: TestingSink, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec, layout = windows(4)
    (ran,) = {row.interval for row in run_batch(spec, messages([record("a", 10, 0)]), layout)}
    store = executor._CACHE[SETTINGS.endpoints].workers.store
    checked: list[int] = []
    asked = threading.Event()
    holds = store.holds

    def counted(lease: Any) -> bool:
        checked.append(lease.interval)
        asked.set()
        return holds(lease)

    monkeypatch.setattr(store, "holds", counted)
    later = InputMessage("in", 0, 1, 5, None, record("a", 20, 1))
    batch = BatchInput(
        ranges=(OffsetRange("in", 0, 1, 2),), ticks=(), slots=IntervalSlots(2), quarantine={}
    )

    def read(
        settings: TaskSettings, ranges: Sequence[OffsetRange], skip: Skip
    ) -> list[InputMessage]:
        # The check of the interval the last batch ran began before the read: it overlaps it.
        assert asked.wait(5), "no lease was checked before the input was read"
        return [later]

    task = batch_task(spec, SETTINGS, 0, 0, layout, batch, read)
    number = batch.slots.task_of(ran)
    (row,) = [ResultRow.of(r) for r in task(number, iter([number]))]
    assert (row.interval, row.counts.processed) == (ran, 1)
    assert checked == [ran]  # read once, ahead: the batch took that answer
    assert row.counts.rescans == 0


def test_a_fence_is_raised_before_another_intervals_failure(
    sink: TestingSink, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A zombie stopped mid-batch: one interval's commit is fenced, and a request of another
    # interval (earlier in order) timed out across the stop. The task says it was fenced.
    run_interval = executor._run_interval

    def stopped(
        spec: ComputationSpec, token: str, workers: WorkerPool, interval: int, *rest: Any
    ) -> dict[str, Any]:
        if interval == 0:
            raise TimeoutError("a request timed out while the process was stopped")
        if interval == 3:
            raise FencedError("interval 3 was taken over")
        return run_interval(spec, token, workers, interval, *rest)

    monkeypatch.setattr(executor, "_run_interval", stopped)
    with pytest.raises(FencedError, match="taken over"):
        run_batch(SPEC_OF_DEFAULTS, [], tasks=1, ticks=[0, 1, 2, 3])


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
    results = run_batch(spec, messages([record("a", 10, 0), None, b"", record("b", 20, 1)]))
    assert sum(row.counts.rejected for row in results) == 2
    assert sum(row.counts.processed for row in results) == 2
    letters = dead_letters(sink, "windows")
    assert {offset: letter.error_type for offset, letter in letters.items()} == {
        1: "TombstoneError",
        2: "MalformedRecordError",
    }
    assert letters[1].origin == Origin(stream="in", partition=0, offset=1)
    assert (letters[1].raw, letters[1].raw_size) == (b"", 0)
    assert "tombstones='deliver'" in letters[1].error_message
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
    layout = IntervalLayout.initial(4)
    sent = messages(
        [record("a", 10, 0), record("b", 11, 1), None, None, None],
        [b"a", b"b", b"a", None, b"\xff"],
    )
    results = run_batch(spec, sent, layout)
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


def claim_in(process: dict[str, int], claims: Path, task: int, slots: int = 2) -> int:
    """:func:`claim_slot` in a process whose last slots are ``process``."""
    with patch.object(executor, "_LAST_SLOT", process):
        return claim_slot(str(claims), task, slots, "run")


def test_each_task_claims_the_slot_its_process_worked_last(tmp_path: Path) -> None:
    first: dict[str, int] = {}  # two Python workers, new
    second: dict[str, int] = {}
    assert [claim_in(first, tmp_path / "1", 0), claim_in(second, tmp_path / "1", 1)] == [0, 1]
    # Spark gives them each other's task numbers: each keeps its slot.
    assert [claim_in(second, tmp_path / "2", 0), claim_in(first, tmp_path / "2", 1)] == [1, 0]
    # A second attempt of a task, in another process, takes the slot of its first attempt.
    third: dict[str, int] = {}
    assert claim_in(third, tmp_path / "2", 1) == 0
    # A new process whose task number is taken gets the free slot.
    assert [claim_in(first, tmp_path / "3", 0), claim_in(third, tmp_path / "3", 1)] == [0, 1]
    with pytest.raises(RuntimeError, match="more tasks than slots"):
        claim_in({}, tmp_path / "3", 2)


def test_tasks_claiming_at_once_share_the_slots_out(tmp_path: Path) -> None:
    slots = 8

    def claim(task: int) -> int:
        return claim_slot(str(tmp_path), task, slots, "run")

    # Threads of one process, which worked slot 3 last: all go for it at once.
    with patch.object(executor, "_LAST_SLOT", {"run": 3}), ThreadPoolExecutor(slots) as threads:
        claimed = list(threads.map(claim, range(slots)))
    assert sorted(claimed) == list(range(slots))


def test_a_batch_whose_tasks_claim_their_slots_runs_every_interval_once(
    sink: TestingSink, tmp_path: Path
) -> None:
    spec, layout = windows(8)
    keys = [f"k{n}" for n in range(40)]
    sent = messages([record(key, 10, n) for n, key in enumerate(keys)])
    # Four processes that worked slots 2, 0, 3 and 1 last: task n runs in process n.
    processes = [{SETTINGS.run_token: slot} for slot in (2, 0, 3, 1)]
    results = run_batch(spec, sent, layout, tasks=4, claims=tmp_path, processes=processes)
    assert sorted(row.interval for row in results) == sorted(
        {layout.interval_of(key) for key in keys}
    )
    assert sum(row.counts.processed for row in results) == len(keys)
    assert sorted(p.record.value for p in sink.delivered("out")) == sorted(k.encode() for k in keys)


def test_each_task_skips_the_records_of_the_others_undecoded_and_loses_none(
    sink: TestingSink, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec, layout = windows(8)
    keys = [f"k{n}" for n in range(40)]
    # A record cut after its key: rejected, under its key, by the task that owns the key.
    broken = record("broken", 7, 99)[:-5]
    sent = messages([*(record(key, 10, n) for n, key in enumerate(keys)), broken])
    decoded: list[bytes] = []
    real_decode = executor.decode_delivery

    def counting(spec: ComputationSpec, stream: str, raw: bytes | None, *extractor: Any) -> Any:
        decoded.append(cast(bytes, raw))
        return real_decode(spec, stream, raw, *extractor)

    monkeypatch.setattr(executor, "decode_delivery", counting)
    results = run_batch(spec, sent, layout, tasks=4)
    assert len(decoded) == len(sent)  # each message decoded once, by one of the 4 tasks
    assert sum(row.counts.inputs for row in results) == len(sent)
    assert sum(row.counts.processed for row in results) == len(keys)
    assert sorted(p.record.value for p in sink.delivered("out")) == sorted(k.encode() for k in keys)
    letter = dead_letters(sink, "windows")[len(keys)]
    assert (letter.origin.key, letter.error_type) == ("broken", "MalformedRecordError")
    by_interval = {row.interval: row for row in results}
    assert by_interval[layout.interval_of("broken")].counts.rejected == 1


def test_a_record_kept_for_its_envelopes_key_and_routed_to_another_task_is_a_bug(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The other tasks skipped it for that key: a task that drops it would lose it."""
    spec, layout = windows(2)
    key = next(f"k{n}" for n in range(100) if layout.interval_of(f"k{n}") == 0)
    sent = messages([record(key, 10, 1)])
    real_router = executor.message_router

    def misrouting(*args: Any) -> Any:
        route = real_router(*args)
        return lambda message: (1, route(message)[1])

    monkeypatch.setattr(executor, "message_router", misrouting)
    with pytest.raises(RuntimeError, match="routed to interval 1, another task's, not to 0"):
        run_batch(spec, sent, layout, tasks=2)


class Closable:
    """A connection, sink or consumer that says when it was closed."""

    def __init__(self, closed: list[str], name: str) -> None:
        self.closed = closed
        self.name = name

    def close(self) -> None:
        self.closed.append(self.name)

    def shutdown(self) -> None:
        self.closed.append(self.name)


def test_a_process_keeps_the_resources_of_its_most_recently_used_endpoints_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Python worker serves one topology after another: the connections of tables it no
    longer serves are closed once more than ``KEPT_ENDPOINTS`` are held; those in use stay."""
    import millstream.connectors.cassandra as cassandra_connector
    import millstream.connectors.kafka as kafka_connector
    import millstream.engine.stores.cassandra as cassandra_store

    closed: list[str] = []
    made: list[str] = []

    def connect(config: MillstreamConfig) -> tuple[Closable, object]:
        made.append("cluster")
        return Closable(closed, f"cluster {len(made)}"), object()

    monkeypatch.setattr(cassandra_connector, "connect", connect)
    monkeypatch.setattr(
        cassandra_store, "CassandraIntervalStore", lambda session, keyspace, clock, table: object()
    )
    monkeypatch.setattr(
        kafka_connector, "KafkaProductionSink", lambda config: Closable(closed, "sink")
    )
    monkeypatch.setattr(
        kafka_connector,
        "KafkaTransactionalSink",
        lambda config, namespace: Closable(closed, "transactions"),
    )
    monkeypatch.setattr(executor, "_CACHE", {})
    # This is pytest's process, not a Python worker: its collector stays as it is.
    config = MillstreamConfig(executor_gc_threshold=0)

    def settings(table: str) -> TaskSettings:
        return TaskSettings(config, "keyspace", table, "run", f"keyspace.{table}")

    first = executor._resources(settings("t0"))
    for n in range(1, executor.KEPT_ENDPOINTS):
        executor._resources(settings(f"t{n}"))
    assert executor._resources(settings("t0")) is first  # used again: now the most recent
    assert closed == []
    executor._resources(settings("new"))  # one more than kept: t1, least recently used, goes
    assert closed == ["transactions", "sink", "cluster 2"]
    assert len(executor._CACHE) == executor.KEPT_ENDPOINTS
    assert executor._resources(settings("t0")) is first
    assert settings("t1").endpoints not in executor._CACHE
    executor.clear_process_cache()
    assert len(closed) == 3 * (executor.KEPT_ENDPOINTS + 1)


# In a process of its own: the collector's settings and frozen objects are the process's.
TUNED_COLLECTOR = """
import gc
from millstream.spark.executor import tune_collector

defaults = gc.get_threshold()
assert not tune_collector(0) and gc.get_threshold() == defaults and gc.get_freeze_count() == 0
assert tune_collector(50_000)
assert gc.get_threshold() == (50_000, *defaults[1:]), gc.get_threshold()
assert gc.get_freeze_count() > 0  # what the process held by then: never scanned again
assert not tune_collector(1_000) and gc.get_threshold()[0] == 50_000  # once per process
"""


def test_a_worker_process_tunes_its_collector_once_and_zero_leaves_it() -> None:
    done = subprocess.run(
        [sys.executable, "-c", TUNED_COLLECTOR], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr


class Forward(Computation):
    """Produces each record to ``mid`` (the first stage) or ``out`` (the second)."""

    def __init__(self, output: str) -> None:
        self.output = output

    def process_record(self, ctx: Context, record: Record) -> None:
        ctx.produce(self.output, record.value, record.timestamp)


def pipeline() -> tuple[ComputationSpec, ComputationSpec]:
    """``first`` (in -> mid) and ``second`` (mid -> out), one key interval each."""
    topology = Topology("t", streams=["in", "mid", "out"])
    options = ComputationOptions(key_intervals=1)
    first = topology.add_computation(
        "first", Forward("mid"), inputs=["in"], outputs=["mid"], options=options
    )
    second = topology.add_computation(
        "second", Forward("out"), inputs=["mid"], outputs=["out"], options=options
    )
    return first, second


class RecordedEnds:
    """A stand-in for :func:`~millstream.spark.executor.committed_ends_from_kafka`: gives
    ``found`` and keeps the partitions each call asked for in ``asked``."""

    def __init__(self, found: Mapping[tuple[str, int], int] | None = None) -> None:
        self.found = dict(found or {})
        self.asked: list[Sequence[tuple[str, int]]] = []

    def __call__(
        self, settings: TaskSettings, places: Sequence[tuple[str, int]]
    ) -> dict[tuple[str, int], int]:
        self.asked.append(places)
        return self.found


def two_stages(
    read: executor.Reader,
    ends: executor.EndOffsets,
    stages: Sequence[tuple[ComputationSpec, OffsetRange]],
) -> list[tuple[int, BatchTask]]:
    """A topology job's parts: each of ``stages`` (a computation and its batch's one range),
    one task each, on one key interval, in the order given."""
    layout = IntervalLayout.initial(1)
    return [
        (1, batch_task(spec, SETTINGS, 0, 0, layout, batch, read, ends))
        for spec, batch in (
            (spec, BatchInput((planned,), (), IntervalSlots(1), {})) for spec, planned in stages
        )
    ]


def test_upstream_first_puts_a_computation_after_those_writing_its_input() -> None:
    topology = Topology("t", streams=["in", "mid", "out", "other", "loop"])
    third = topology.add_computation("third", Forward("out"), inputs=["out"], outputs=[])
    second = topology.add_computation("second", Forward("out"), inputs=["mid"], outputs=["out"])
    first = topology.add_computation("first", Forward("mid"), inputs=["in"], outputs=["mid"])
    alone = topology.add_computation("alone", Forward("other"), inputs=["in"], outputs=["other"])
    assert executor.upstream_first([third, second, first, alone]) == [[2, 3], [1], [0]]
    # A cycle's computations (ping and pong) share a level, after what writes into it.
    ping = topology.add_computation(
        "ping", Forward("loop"), inputs=["other", "out"], outputs=["loop"]
    )
    pong = topology.add_computation("pong", Forward("out"), inputs=["loop"], outputs=["out"])
    assert executor.upstream_first([ping, pong, first, second]) == [[2], [3], [0, 1]]


def test_a_later_stage_reads_what_an_earlier_one_just_wrote_and_then_leaves_it_out(
    sink: TestingSink,
) -> None:
    # The topology's job runs `first`, then `second`, which reads `mid` past its planned end
    # up to what is committed (here: what `ends` says); its next batch leaves those out.
    first, second = pipeline()
    mid = [InputMessage("mid", 0, n, 5, None, record(f"m{n}", 10, 100 + n)) for n in range(7)]
    log: list[tuple[str, tuple[OffsetRange, ...]]] = []

    def part(spec: ComputationSpec, ranges: tuple[OffsetRange, ...], ends: int) -> BatchTask:
        def read(
            settings: TaskSettings, asked: Sequence[OffsetRange], skip: Skip
        ) -> list[InputMessage]:
            log.append((spec.name, tuple(asked)))
            sent = messages([record("a", 10, 0)]) if spec is first else mid
            return [m for m in sent if any(m.offset in range(r.start, r.end) for r in asked)]

        def committed(
            settings: TaskSettings, places: Sequence[tuple[str, int]]
        ) -> dict[tuple[str, int], int]:
            assert list(places) == [("mid", 0)]
            return {("mid", 0): ends}

        batch = BatchInput(ranges, (), IntervalSlots(1), {})
        return batch_task(spec, SETTINGS, 0, 0, IntervalLayout.initial(1), batch, read, committed)

    def job(planned_mid: OffsetRange, ends: int) -> dict[str, int]:
        """One batch of the two as the topology's job (`second` listed first): inputs each."""
        parts = [
            (1, part(second, (planned_mid,), ends)),
            (1, part(first, (OffsetRange("in", 0, 0, 1),), ends)),
        ]
        rows = {
            number: rows
            for number, _, rows, error in executor.topology_task(parts)(0, iter([0]))
            if error is None and rows is not None
        }
        return {
            name: sum(ResultRow.of(row).counts.inputs for row in rows.get(number, []))
            for number, name in enumerate(("second", "first"))
        }

    assert job(OffsetRange("mid", 0, 0, 3), ends=5) == {"first": 1, "second": 5}
    assert [name for name, _ in log] == ["first", "second"]  # upstream first
    assert list(log[1][1]) == [OffsetRange("mid", 0, 0, 3), OffsetRange("mid", 0, 3, 5)]
    assert sorted(p.record.value for p in sink.delivered("out")) == [
        f"m{n}".encode() for n in range(5)
    ]
    # Its next batch plans 3 to 5, which it read ahead, and reads ahead 5 and 6.
    log.clear()
    assert job(OffsetRange("mid", 0, 3, 5), ends=7) == {"first": 1, "second": 2}
    assert list(log[1][1]) == [OffsetRange("mid", 0, 3, 5), OffsetRange("mid", 0, 5, 7)]
    assert sorted(p.record.value for p in sink.delivered("out")) == [
        f"m{n}".encode() for n in range(7)
    ]
    # A batch whose planned records were all read ahead runs no interval of `second`.
    log.clear()
    assert job(OffsetRange("mid", 0, 5, 7), ends=7) == {"first": 1, "second": 0}
    assert list(log[1][1]) == [OffsetRange("mid", 0, 5, 7)]  # nothing committed past its end
    assert len(sink.delivered("out")) == 7


def test_a_stage_reads_ahead_only_after_an_upstream_part_that_succeeded(
    sink: TestingSink,
) -> None:
    first, second = pipeline()
    ends = RecordedEnds()

    def read(settings: TaskSettings, ranges: Sequence[OffsetRange], skip: Skip) -> list[Any]:
        if any(r.topic == "in" for r in ranges):
            raise RuntimeError("the first stage's read failed")
        return []

    parts = two_stages(
        read, ends, [(first, OffsetRange("in", 0, 0, 1)), (second, OffsetRange("mid", 0, 0, 1))]
    )
    results = list(executor.topology_task(parts)(0, iter([0])))
    assert [(number, error is None) for number, _, _, error in results] == [(0, False), (1, True)]
    assert "the first stage's read failed" in str(results[0][3])
    assert ends.asked == []  # `first` wrote nothing in this task: `second` read its batch alone


def test_a_read_ahead_begins_at_the_planned_end_of_every_partition_empty_ranges_too() -> None:
    _, second = pipeline()
    batch = BatchInput(
        (OffsetRange("mid", 0, 4, 6),),
        (),
        IntervalSlots(1),
        {},
        ends={("mid", 0): 6, ("mid", 1): 3, ("mid", 2): 7},  # 1 and 2: nothing planned
    )
    committed = RecordedEnds({("mid", 0): 8, ("mid", 1): 5, ("mid", 2): 7})
    ranges, ahead = executor._read_ahead(SETTINGS, second, batch, {"mid"}, committed)
    assert committed.asked == [[("mid", 0), ("mid", 1), ("mid", 2)]]
    assert sorted(ranges) == [
        OffsetRange("mid", 0, 4, 6),
        OffsetRange("mid", 0, 6, 8),
        OffsetRange("mid", 1, 3, 5),
    ]
    assert ahead == {("mid", 0): 8, ("mid", 1): 5}  # partition 2 had nothing new
    # A batch's cap on what it reads holds for what it reads ahead, shared by the partitions.
    capped = replace(
        SETTINGS, config=MillstreamConfig().with_run(RunSettings(max_offsets_per_trigger=3))
    )
    ranges, ahead = executor._read_ahead(capped, second, batch, {"mid"}, committed)
    assert sorted(ranges)[1:] == [OffsetRange("mid", 0, 6, 7), OffsetRange("mid", 1, 3, 4)]
    assert ahead == {("mid", 0): 7, ("mid", 1): 4}


def test_a_batch_with_a_part_past_the_hand_off_bound_runs_its_stages_at_once(
    sink: TestingSink,
) -> None:
    first, second = pipeline()
    ends = RecordedEnds()
    reads: list[str] = []

    def read(settings: TaskSettings, ranges: Sequence[OffsetRange], skip: Skip) -> list[Any]:
        reads.append(ranges[0].topic)
        return []

    def job(mid_offsets: int, in_offsets: int = 1) -> tuple[list[str], list[Any]]:
        reads.clear()
        ends.asked.clear()
        parts = two_stages(
            read,
            ends,
            [
                (second, OffsetRange("mid", 0, 0, mid_offsets)),
                (first, OffsetRange("in", 0, 0, in_offsets)),
            ],
        )
        results = list(executor.topology_task(parts)(0, iter([0])))
        assert all(error is None for *_, error in results)
        return reads, ends.asked

    bound = executor.HAND_OFF_MOST_OFFSETS
    # Upstream first, and the later stage reads ahead.
    assert job(bound) == (["in", "mid"], [[("mid", 0)]])
    # The bound is a part's, not the batch's: two stages at it, handed on all the same.
    assert job(bound, bound) == (["in", "mid"], [[("mid", 0)]])
    # One part past it (the later stage's, say, after a backlog): as listed, nothing read ahead.
    assert job(bound + 1) == (["mid", "in"], [])
    assert job(1, bound + 1) == (["mid", "in"], [])


class _Offsets:
    """Last stable offsets that move as a scripted reply each time they are asked, a fake
    clock that a sleep moves on, and the high watermarks, for :func:`executor.settled_ends`."""

    def __init__(self, replies: Sequence[Mapping[tuple[str, int], int]], high: Mapping[Any, int]):
        self.replies = list(replies)
        self.tops = dict(high)
        self.asked = 0
        self.high_asked = 0
        self.now = 0.0
        self.slept: list[float] = []

    def stable(self) -> Mapping[tuple[str, int], int]:
        reply = self.replies[min(self.asked, len(self.replies) - 1)]
        self.asked += 1
        return reply

    def high(self) -> Mapping[tuple[str, int], int]:
        self.high_asked += 1
        return self.tops

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds

    def settle(self, stuck_at: dict[tuple[str, int], int]) -> Mapping[tuple[str, int], int]:
        return executor.settled_ends(
            self.stable,
            self.high,
            stuck_at,
            seconds=0.1,
            poll=0.005,
            clock=lambda: self.now,
            sleep=self.sleep,
        )


def test_a_read_ahead_waits_for_the_transactions_open_as_it_asks_and_no_longer() -> None:
    # Partition 0 has a transaction open (stable 5, high 9) that commits two asks later;
    # partition 1 has none.
    offsets = _Offsets(
        [
            {("mid", 0): 5, ("mid", 1): 3},
            {("mid", 0): 5, ("mid", 1): 3},
            {("mid", 0): 9, ("mid", 1): 3},
        ],
        {("mid", 0): 9, ("mid", 1): 3},
    )
    stuck: dict[tuple[str, int], int] = {}
    assert offsets.settle(stuck) == {("mid", 0): 9, ("mid", 1): 3}
    assert offsets.slept == [0.005, 0.005]
    assert stuck == {}

    nothing_open = _Offsets([{("mid", 0): 9}], {("mid", 0): 9})
    assert nothing_open.settle(stuck) == {("mid", 0): 9}
    assert nothing_open.slept == []


def test_a_transaction_left_open_is_waited_for_once_until_its_partition_moves() -> None:
    stuck: dict[tuple[str, int], int] = {}
    hanging = _Offsets([{("mid", 0): 5, ("mid", 1): 3}], {("mid", 0): 9, ("mid", 1): 3})
    assert hanging.settle(stuck) == {("mid", 0): 5, ("mid", 1): 3}
    assert 0.1 <= hanging.now < 0.11, "it waited past its bound, or not to it"
    assert stuck == {("mid", 0): 5}

    again = _Offsets([{("mid", 0): 5, ("mid", 1): 3}], {("mid", 0): 9, ("mid", 1): 3})
    assert again.settle(stuck) == {("mid", 0): 5, ("mid", 1): 3}
    assert again.slept == []
    alone = _Offsets([{("mid", 0): 5}], {("mid", 0): 9})
    assert alone.settle(stuck) == {("mid", 0): 5}
    assert alone.high_asked == 0, "a partition stuck where it was is not asked about again"
    elsewhere = _Offsets([{("out", 0): 4}], {("out", 0): 4})  # another stage's read-ahead
    assert elsewhere.settle(stuck) == {("out", 0): 4}
    assert stuck == {("mid", 0): 5}, "a stuck partition was forgotten by a read of others"

    moved = _Offsets(
        [{("mid", 0): 7, ("mid", 1): 3}, {("mid", 0): 12, ("mid", 1): 3}],
        {("mid", 0): 12, ("mid", 1): 3},
    )
    assert moved.settle(stuck) == {("mid", 0): 12, ("mid", 1): 3}
    assert moved.slept == [0.005]
    assert stuck == {}


def test_the_tasks_warming_a_computations_workers_wait_for_each_other_up_to_a_bound(
    tmp_path: Path,
) -> None:
    # Two tasks at once meet at once; a task alone (its partner ran before it in the same
    # process, or never started) waits the bound out and goes on.
    started = time.monotonic()
    with ThreadPoolExecutor(2) as pool:
        met = list(
            pool.map(lambda name: meet_workers(tmp_path / "job", name, 2, 30.0), ["h:1", "h:2"])
        )
    assert met == [2, 2]
    assert time.monotonic() - started < 10.0
    started = time.monotonic()
    assert meet_workers(tmp_path / "alone", "h:1", 2, 0.3) == 1
    assert time.monotonic() - started >= 0.3
    assert sorted(os.listdir(tmp_path / "job")) == ["h:1", "h:2"]


def test_a_warm_up_makes_read_aheads_admin_for_the_topics_upstream_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A computation that reads another's output in one query gets its read-ahead's admin
    client made, and asked those topics' metadata, by the warm-up
    (``tests/spark/test_executor_kafka.py`` asks a real broker); one that reads no other's
    output gets none."""
    resources = SimpleNamespace(reader_topics=set())
    made: list[set[str]] = []
    monkeypatch.setattr(executor, "_resources", lambda settings: resources)
    monkeypatch.setattr(executor, "_batch_reader", lambda resources, settings: object())
    monkeypatch.setattr(executor, "learn_topics", lambda reader, topics, known, timeout: None)

    def admin(resources: object, settings: TaskSettings, topics: set[str]) -> object:
        made.append(set(topics))
        return object()

    monkeypatch.setattr(executor, "_end_offsets_admin", admin)
    spec, _ = windows(2)
    settings = TaskSettings(MillstreamConfig(), "keyspace", "table", "run", "keyspace.table")
    assert list(WarmTask(spec, settings, ("a", "b"))(0, [])) == [(executor._HOST, os.getpid(), ())]
    assert made == []
    list(WarmTask(spec, settings, ("a", "b"), upstream=("b",))(0, []))
    assert made == [{"b"}]
