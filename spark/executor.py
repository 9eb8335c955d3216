"""The executor side of the Spark runner: routing a micro-batch and working its key intervals.

:mod:`millstream.spark.batch` ships two Arrow functions per computation and batch to
Spark's Python workers (``mapInArrow``: whole record batches, column by column, no pandas):

1. :func:`router`: decodes each Kafka message, applies the consumer's key
   extractor *of the stream (topic) the message came from*, and tags the row with its key
   interval. A message that cannot be made a delivery (oversized, undecodable, unknown schema,
   failing or non-``str`` key extractor, a tombstone the computation does not take) becomes
   a *rejected* row in the interval of the empty key, carrying its raw bytes and its error.
   A tombstone the computation takes (``ComputationOptions.tombstones``) becomes a
   *deletion* row under its Kafka message key.
2. :func:`interval_task`, after a shuffle that gives each task (one per core) every row of
   its share of the intervals: turns each interval's rows back into
   :class:`~millstream.engine.protocol.Delivery` / ``Rejected`` inputs, in (stream, partition,
   offset) order, and runs the interval's :class:`~millstream.engine.protocol.IntervalWorker`
   on them, on ``config.executor_interval_threads`` threads at once, against a
   :class:`~millstream.engine.stores.cassandra.CassandraIntervalStore` and a
   :class:`~millstream.connectors.kafka.KafkaProductionSink`. It returns one row of counts
   per interval, which the driver collects as the batch's metrics, with what the interval has
   left to do (its :class:`~millstream.engine.watermarks.IntervalProgress`), which the driver
   needs for watermarks. A *tick* (:func:`tick_rows`: a row with no stream) makes an interval
   run without input, for its due timers and unacknowledged productions.

**Per-process cache.** Spark reuses Python worker processes across tasks
(``spark.python.worker.reuse``, on by default), so each process keeps, at module level, one
Cassandra session, one store, one Kafka producer per set of endpoints, and the
``IntervalWorker`` of every (computation run, interval) it has worked on (a
:class:`~millstream.engine.protocol.WorkerPool`), sharing one
:class:`~millstream.engine.cache.StateCache` bounded by ``config.executor_cache_bytes``. A
worker's soft state (cached key state and timers, pending productions) is reused exactly when
the sequencer says nobody else acquired the interval since this process's last batch on it
(``BatchResult.rescanned`` is false); a batch of the interval that ran in another process, or
a retried task, makes the next batch here start over, reading only what it touches. Workers
are keyed by the computation's *run token* (fresh whenever a runner adds the computation, kept
across restarts of its query), so a computation removed and declared again never reuses
workers of the earlier declaration.

**Failures.** Whatever the worker raises (``FencedError``, an unresolved unknown outcome, a
store or Kafka outage) fails the task: the interval's commit either applied completely for a
key or not at all, the worker forgets its soft state, and the driver re-runs the batch
(see :mod:`millstream.spark.runner`). Rejected input is re-decoded here rather than
shipped as an exception object: user exceptions need not be picklable, and re-running the
(deterministic) decoder and extractor yields the genuine exception for the dead letter. A
quarantined message (:mod:`millstream.spark.quarantine`) is the exception: the router rejects
it undecoded, with its :class:`~millstream.engine.errors.PoisonRecordError` as text, and it is
never decoded here either. The fault points ``executor.task`` and ``executor.record``
(:mod:`millstream.engine.fault_points`) cost one test per task and one per interval unset.
"""

from __future__ import annotations

import os
import struct
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, NamedTuple, cast, get_args, get_type_hints

import mmh3
import pyarrow as pa

from millstream.connectors.kafka import stream_topic
from millstream.engine.cache import StateCache
from millstream.engine.clock import SystemClock
from millstream.engine.config import MillstreamConfig
from millstream.engine.deadletters import Origin
from millstream.engine.errors import PoisonRecordError, TombstoneError
from millstream.engine.fault_points import armed_faults, fault_point
from millstream.engine.layout import IntervalLayout
from millstream.engine.protocol import Delivery, Rejected, WorkerPool
from millstream.engine.records import Deletion, Record
from millstream.engine.routing import decode_delivery, decode_tombstone, rejected_interval
from millstream.engine.topology import ComputationSpec
from millstream.spark.isolation import Position
from millstream.spark.metrics import RESULT_SCHEMA, ResultRow, interval_counts
from millstream.spark.quarantine import POISON_ERROR_PREFIX

if TYPE_CHECKING:
    from millstream.connectors.kafka import KafkaProductionSink, KafkaTransactionalSink

__all__ = [
    "RESULT_SCHEMA",
    "ROUTED_SCHEMA",
    "IntervalSlots",
    "RoutedRow",
    "TaskSettings",
    "clear_process_cache",
    "decode_delivery",
    "interval_task",
    "partition_representatives",
    "router",
    "source_columns",
    "spark_int_hash",
    "tick_rows",
]


class RoutedRow(NamedTuple):
    """One row :func:`router` emits (:data:`ROUTED_SCHEMA`): a rejected message has an
    ``error`` (a description; the exception is rebuilt later) and ``raw`` (``None`` for a
    tombstone); a delivery has no ``error``, its ``key`` and the ``record_*`` fields; a
    deletion (a tombstone the computation takes) has no ``error``, its ``key``,
    ``record_ts`` and ``record_id`` and no ``record_value``; a tick (:func:`tick_rows`) has
    nothing but its interval. ``slot`` is the value to repartition by that sends the row to
    its interval's task (:class:`IntervalSlots`)."""

    interval: int
    stream: str | None
    partition: int | None
    offset: int | None
    kafka_ts: int | None
    key: str | None
    record_key: str | None
    record_value: bytes | None
    record_ts: int | None
    record_id: bytes | None
    raw: bytes | None
    error: str | None
    slot: int

    @classmethod
    def tick(cls, interval: int, slot: int) -> RoutedRow:
        """A row that makes ``interval`` run without input."""
        return cls._make((interval, *(None,) * (len(cls._fields) - 2), slot))


_INT_COLUMNS: Final = frozenset({"interval", "partition", "slot"})  # Spark ints; others long
_SPARK_TYPES: Final = {int: "long", str: "string", bytes: "binary", float: "double"}


def _row_schema(row: type[tuple[Any, ...]]) -> str:
    """The Spark DDL schema of a row type's fields, in order."""
    columns = []
    for name, hint in get_type_hints(row).items():
        kind = next(t for t in get_args(hint) or (hint,) if t is not type(None))
        columns.append(f"{name} {'int' if name in _INT_COLUMNS else _SPARK_TYPES[kind]}")
    return ", ".join(columns)


ROUTED_SCHEMA: Final = _row_schema(RoutedRow)
"""The rows :func:`router` emits: :class:`RoutedRow`."""

_INT: Final = struct.Struct("<i")
_SPARK_HASH_SEED: Final = 42


def spark_int_hash(value: int) -> int:
    """Spark's ``hash()`` of an ``int`` column (Murmur3 x86 32-bit, seed 42), which its hash
    partitioning takes modulo the partition count."""
    return int(mmh3.hash(_INT.pack(value), _SPARK_HASH_SEED))


def partition_representatives(partitions: int) -> list[int]:
    """For each partition ``p`` of ``partitions``, the smallest non-negative int that Spark's
    ``repartition(partitions, column)`` sends to ``p``."""
    found: dict[int, int] = {}
    value = 0
    while len(found) < partitions:
        found.setdefault(spark_int_hash(value) % partitions, value)
        value += 1
    return [found[p] for p in range(partitions)]


class IntervalSlots:
    """Which of a batch's ``tasks`` works each key interval: ``assignment[i]``, else
    ``i mod tasks``, whole intervals.

    Hash partitioning by the interval itself spreads 16 intervals over 2 tasks as unevenly
    as 11 and 5; instead each row carries, as ``slot``, an integer that Spark's partitioning
    hash sends to the intended task (:func:`partition_representatives`). Computed where the
    rows are made, so the plan stays the same size however many intervals there are.
    """

    def __init__(self, tasks: int, assignment: Mapping[int, int] | None = None) -> None:
        self.tasks = tasks
        self.assignment = dict(assignment or {})
        self._representatives = partition_representatives(tasks)

    def task_of(self, interval: int) -> int:
        return self.assignment.get(interval, interval % self.tasks)

    def slot(self, interval: int) -> int:
        """The value of the row's ``slot`` column: ``repartition(tasks, "slot")`` sends it
        to :meth:`task_of`."""
        return self._representatives[self.task_of(interval)]


_ARROW_TYPES: Final = {
    "int": pa.int32(),
    "long": pa.int64(),
    "double": pa.float64(),
    "boolean": pa.bool_(),
    "string": pa.string(),
    "binary": pa.binary(),
}


def _arrow_schema(ddl: str) -> pa.Schema:
    """The Arrow schema Spark expects for a DDL schema string of simple types."""
    return pa.schema(
        [pa.field(name, _ARROW_TYPES[kind]) for name, kind in (p.split() for p in ddl.split(", "))]
    )


_ROUTED_ARROW: Final = _arrow_schema(ROUTED_SCHEMA)
_RESULT_ARROW: Final = _arrow_schema(RESULT_SCHEMA)
_SOURCE_COLUMNS: Final = ("value", "topic", "partition", "offset", "kafka_ts")


def source_columns(spec: ComputationSpec) -> tuple[str, ...]:
    """The Kafka source's columns :func:`router` reads for ``spec``: the message key too
    only if the computation takes tombstones as deletions of their key (the default path
    carries no key it does not use)."""
    if spec.options.tombstones == "deliver":
        return (*_SOURCE_COLUMNS, "key")
    return _SOURCE_COLUMNS


@dataclass(frozen=True, slots=True)
class TaskSettings:
    """What an executor needs besides the computation: endpoints, store table, run token."""

    config: MillstreamConfig
    keyspace: str
    table: str
    run_token: str
    transaction_namespace: str  # connectors.kafka.store_namespace, resolved by the driver

    @property
    def endpoints(self) -> tuple[str, tuple[str, ...], int, str, str]:
        config = self.config
        return (
            config.kafka_bootstrap,
            config.cassandra_hosts,
            config.cassandra_port,
            self.keyspace,
            self.table,
        )


@dataclass
class _Resources:
    """One process's connections to one set of endpoints, its interval workers, and the
    threads that work a task's intervals at once."""

    cluster: Any
    sink: KafkaProductionSink
    transactions: KafkaTransactionalSink
    workers: WorkerPool
    threads: ThreadPoolExecutor


_CACHE: dict[tuple[str, tuple[str, ...], int, str, str], _Resources] = {}


def clear_process_cache() -> None:
    """Drop this process's cached workers and close its connections (tests, shutdown)."""
    while _CACHE:
        _, resources = _CACHE.popitem()
        resources.threads.shutdown()
        resources.transactions.close()
        resources.sink.close()
        resources.cluster.shutdown()


def _resources(settings: TaskSettings) -> _Resources:
    resources = _CACHE.get(settings.endpoints)
    if resources is None:
        # Imported here: the driver imports this module without needing the drivers loaded.
        from millstream.connectors.cassandra import connect
        from millstream.connectors.kafka import KafkaProductionSink, KafkaTransactionalSink
        from millstream.engine.stores.cassandra import CassandraIntervalStore

        cluster, session = connect(settings.config)
        try:
            store = CassandraIntervalStore(
                session, settings.keyspace, SystemClock(), table=settings.table
            )
            sink = KafkaProductionSink(settings.config)
            transactions = KafkaTransactionalSink(settings.config, settings.transaction_namespace)
        except BaseException:
            cluster.shutdown()
            raise
        workers = WorkerPool(
            store,
            sink,
            SystemClock(),
            cache=StateCache(settings.config.executor_cache_bytes),
            # Held while user code runs: one computation call at a time per process.
            user_code=threading.Lock(),
            transactions=transactions,
        )
        resources = _Resources(
            cluster,
            sink,
            transactions,
            workers,
            ThreadPoolExecutor(
                settings.config.executor_interval_threads, thread_name_prefix="millstream-interval"
            ),
        )
        _CACHE[settings.endpoints] = resources
    return resources


def router(
    spec: ComputationSpec,
    layout: IntervalLayout | None = None,
    slots: IntervalSlots | None = None,
    quarantine: Mapping[Position, str] | None = None,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function that decodes, keys and routes ``spec``'s input to the
    intervals of ``layout`` (default: those the computation starts with), and their tasks
    (``slots``; default: one task).

    ``quarantine`` maps the (topic, partition, offset) of each quarantined message
    (:mod:`millstream.spark.quarantine`) to its
    :class:`~millstream.engine.errors.PoisonRecordError` message: such a message is
    rejected as it is, before anything decodes it.

    Input columns (:func:`source_columns`): ``value`` (bytes; ``None`` for a tombstone),
    ``topic``, ``partition``, ``offset``, ``kafka_ts`` (the Kafka message timestamp in µs),
    and ``key`` (bytes) if the computation takes tombstones. Output: :data:`ROUTED_SCHEMA`,
    column by column (no pandas, no per-row objects beyond the decoded record). Every input
    row yields one output row.
    """
    layout = layout or IntervalLayout.initial(spec.options.key_intervals)
    slots = slots or IntervalSlots(1)
    reject_interval = rejected_interval(spec, layout)
    streams = _streams_by_topic(spec)
    quarantined = dict(quarantine or {})
    takes_tombstones = spec.options.tombstones == "deliver"

    def rejected(
        stream: str, partition: int, offset: int, kafka_ts: int, raw: bytes | None, error: str
    ) -> RoutedRow:
        """The row of a message that becomes a dead letter in the rejected interval."""
        return RoutedRow(
            interval=reject_interval,
            stream=stream,
            partition=partition,
            offset=offset,
            kafka_ts=kafka_ts,
            key=None,
            record_key=None,
            record_value=None,
            record_ts=None,
            record_id=None,
            raw=raw,
            error=error,
            slot=slots.slot(reject_interval),
        )

    def route(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            rows: list[RoutedRow] = []
            columns = [batch.column(name).to_pylist() for name in _SOURCE_COLUMNS]
            message_keys = (
                batch.column("key").to_pylist() if takes_tombstones else [None] * batch.num_rows
            )
            for value, topic, partition, offset, kafka_ts, message_key in zip(
                *columns, message_keys, strict=True
            ):
                stream = streams[topic]
                # One test per row when nothing is quarantined.
                poison = (
                    quarantined.get(Position(topic, partition, offset)) if quarantined else None
                )
                if poison is not None:
                    raw = value if value is not None else b""
                    error_text = POISON_ERROR_PREFIX + poison
                    rows.append(rejected(stream, partition, offset, kafka_ts, raw, error_text))
                    continue
                error: Exception | None
                if value is None and takes_tombstones:
                    deletion, error = decode_tombstone(
                        spec, stream, message_key, partition, offset, kafka_ts
                    )
                    if deletion is not None:
                        interval = layout.interval_of(deletion.key)
                        rows.append(
                            RoutedRow(
                                interval=interval,
                                stream=stream,
                                partition=partition,
                                offset=offset,
                                kafka_ts=kafka_ts,
                                key=deletion.key,
                                record_key=None,
                                record_value=None,
                                record_ts=deletion.timestamp,
                                record_id=deletion.record_id,
                                raw=None,
                                error=None,
                                slot=slots.slot(interval),
                            )
                        )
                        continue
                else:
                    record, key, error = decode_delivery(spec, stream, value)
                    if error is None:
                        assert record is not None
                        assert key is not None
                        interval = layout.interval_of(key)
                        rows.append(
                            RoutedRow(
                                interval=interval,
                                stream=stream,
                                partition=partition,
                                offset=offset,
                                kafka_ts=kafka_ts,
                                key=key,
                                record_key=record.key,
                                record_value=record.value,
                                record_ts=record.timestamp,
                                record_id=record.record_id,
                                raw=None,
                                error=None,
                                slot=slots.slot(interval),
                            )
                        )
                        continue
                assert error is not None
                rows.append(rejected(stream, partition, offset, kafka_ts, value, _described(error)))
            yield _record_batch(rows, _ROUTED_ARROW)

    return route


def _described(error: Exception) -> str:
    """A rejected row's ``error``: never empty, and naming the error's class first."""
    return f"{type(error).__qualname__}: {error}"


def _record_batch(rows: Iterable[Sequence[Any]], schema: pa.Schema) -> pa.RecordBatch:
    """Rows of a row type whose fields are ``schema``'s columns, in order, as a batch."""
    columns = list(zip(*rows, strict=True)) or [() for _ in schema]
    return pa.RecordBatch.from_arrays(
        [pa.array(c, type=f.type) for c, f in zip(columns, schema, strict=True)], schema=schema
    )


def _streams_by_topic(spec: ComputationSpec) -> dict[str, str]:
    return {stream_topic(i.stream): i.stream for i in spec.inputs}


def tick_rows(intervals: Iterable[int], slots: IntervalSlots | None = None) -> list[RoutedRow]:
    """:data:`ROUTED_SCHEMA` rows that make an interval run without input (a *tick*): for its
    due timers and unacknowledged productions."""
    slots = slots or IntervalSlots(1)
    return [RoutedRow.tick(interval, slots.slot(interval)) for interval in intervals]


def interval_task(
    spec: ComputationSpec,
    settings: TaskSettings,
    watermark: int,
    timer_watermark: int,
    layout: IntervalLayout | None = None,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function that runs the key intervals of one partition of a batch
    (the partitions are by interval, so each interval is in exactly one).

    Each interval's rows run, in (stream, partition, offset) order, through the interval's
    worker; records under the input low watermark before the batch (``watermark``), event-time
    timers under the one after it (see :meth:`IntervalWorker.process`). One
    :data:`RESULT_SCHEMA` row per interval. Raises whatever a worker raises, failing the task;
    see the module docstring.
    """

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        fault_point("executor.task", spec.name)
        faults = armed_faults("executor.record", spec.name)
        by_interval: dict[int, list[RoutedRow]] = {}
        for batch in batches:
            columns = (batch.column(name).to_pylist() for name in RoutedRow._fields)
            for row in map(RoutedRow._make, zip(*columns, strict=True)):
                by_interval.setdefault(row.interval, []).append(row)
        resources = _resources(settings)
        # The intervals' round trips to Cassandra and Kafka overlap on the pool's threads.
        futures = [
            resources.threads.submit(
                _run_interval,
                spec,
                settings.run_token,
                resources.workers,
                interval,
                interval_rows,
                watermark,
                timer_watermark,
                layout,
                faults,
            )
            for interval, interval_rows in sorted(by_interval.items())
        ]
        wait(futures)
        results = [future.result() for future in futures]  # raises the first failure
        if results:
            yield _record_batch(
                ([row[name] for name in _RESULT_ARROW.names] for row in results), _RESULT_ARROW
            )

    return run


def _run_interval(
    spec: ComputationSpec,
    run_token: str,
    workers: WorkerPool,
    interval: int,
    rows: list[RoutedRow],
    watermark: int,
    timer_watermark: int,
    layout: IntervalLayout | None,
    faults: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """Run one interval's rows; its :data:`RESULT_SCHEMA` row (:meth:`ResultRow.columns`).
    ``faults``: record IDs (hex) a fault harness armed (:mod:`~millstream.engine.fault_points`)."""
    started, cpu_started = time.monotonic(), time.thread_time()
    # Ticks (no stream) first; they carry no input.
    rows.sort(key=lambda row: (row.stream or "", row.partition or 0, row.offset or 0))
    inputs = _inputs(spec, rows)
    if faults:
        _inject_faults(spec, inputs, faults)
    worker, cached = workers.worker(spec, interval, layout, run=run_token)
    result = worker.process(inputs, watermark, timer_watermark=timer_watermark)
    rejected = sum(isinstance(item, Rejected) for item in inputs)
    return ResultRow(
        computation=spec.name,
        interval=interval,
        counts=interval_counts(len(inputs), rejected, result, cached),
        pid=os.getpid(),
        seconds=time.monotonic() - started,
        cpu_seconds=time.thread_time() - cpu_started,
        progress=result.progress,
    ).columns()


def _inject_faults(
    spec: ComputationSpec, inputs: list[Delivery | Rejected], faults: frozenset[str]
) -> None:
    for item in inputs:
        if isinstance(item, Delivery):
            fault_point("executor.record", spec.name, item.record.record_id.hex(), faults)


def _inputs(spec: ComputationSpec, rows: list[RoutedRow]) -> list[Delivery | Rejected]:
    inputs: list[Delivery | Rejected] = []
    for row in rows:
        if row.stream is None:
            continue  # a tick: the interval runs for its timers and resends only
        origin = Origin(stream=row.stream, partition=row.partition, offset=row.offset)
        if row.error is not None:
            inputs.append(_rejected(spec, origin, row.raw, cast(int, row.kafka_ts), row.error))
            continue
        assert row.key is not None
        assert row.record_ts is not None
        assert row.record_id is not None
        if row.record_value is None:
            deletion = Deletion(row.key, row.record_ts, row.stream, row.record_id)
            inputs.append(Delivery(row.key, deletion, origin))
            continue
        assert row.record_key is not None
        record = Record(row.record_key, row.record_value, row.record_ts, row.record_id)
        inputs.append(Delivery(row.key, record, origin))
    return inputs


def _rejected(
    spec: ComputationSpec, origin: Origin, raw: bytes | None, kafka_ts: int, error_text: str
) -> Rejected:
    assert origin.stream is not None
    if error_text.startswith(POISON_ERROR_PREFIX):
        # Quarantined: never decoded again (that may be what crashes); located by position.
        poison = PoisonRecordError(error_text.removeprefix(POISON_ERROR_PREFIX))
        return Rejected(origin, raw or b"", poison, kafka_ts)
    if raw is None:
        # A tombstone: no user code judged it, so the router's description is the whole
        # error (re-deciding would need the message key, which the row does not carry).
        message = error_text.removeprefix(f"{TombstoneError.__qualname__}: ")
        return Rejected(origin, b"", TombstoneError(message), kafka_ts)
    record, _, error = decode_delivery(spec, origin.stream, raw)
    if error is None:
        error = RuntimeError(
            f"message at {origin.stream}/{origin.partition}@{origin.offset} failed to decode "
            f"or key on the first attempt and succeeded on the second; the key extractor of "
            f"{spec.name!r} must be deterministic"
        )
    if record is not None:
        return Rejected(
            Origin(origin.stream, origin.partition, origin.offset, record_id=record.record_id),
            raw,
            error,
            record.timestamp,
        )
    return Rejected(origin, raw, error, kafka_ts)
