"""The executor side of the Spark runner: routing a micro-batch and working its key intervals.

:mod:`millstream.engine.spark.runner` ships two pandas functions per computation and batch to
Spark's Python workers:

1. :func:`router` (``mapInPandas``): decodes each Kafka message, applies the consumer's key
   extractor *of the stream (topic) the message came from*, and tags the row with its key
   interval. A message that cannot be made a delivery (oversized, undecodable, unknown schema,
   failing or non-``str`` key extractor) becomes a *rejected* row in the interval of the empty
   key, carrying its raw bytes.
2. :func:`interval_task` (``groupBy("interval").applyInPandas``): turns one interval's rows
   back into :class:`~millstream.engine.protocol.Delivery` / ``Rejected`` inputs, in
   (stream, partition, offset) order, and runs the interval's
   :class:`~millstream.engine.protocol.IntervalWorker` on them, against a
   :class:`~millstream.engine.stores.cassandra.CassandraIntervalStore` and a
   :class:`~millstream.connectors.kafka.KafkaProductionSink`. It returns one row of counts
   per interval, which the driver collects as the batch's metrics, with what the interval has
   left to do (its :class:`~millstream.engine.watermarks.IntervalProgress`), which the driver
   needs for watermarks. A *tick* (:func:`tick_rows`: a row with no stream) makes an interval
   run without input, for its due timers and unacknowledged productions.

**Per-process cache.** Spark reuses Python worker processes across tasks
(``spark.python.worker.reuse``, on by default), so each process keeps, at module level, one
Cassandra session, one store, one Kafka producer per set of endpoints, and the
``IntervalWorker`` of every (computation run, interval) it has worked on, sharing one
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
(see :mod:`millstream.engine.spark.runner`). Rejected input is re-decoded here rather than
shipped as an exception object: user exceptions need not be picklable, and re-running the
(deterministic) decoder and extractor yields the genuine exception for the dead letter.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import pandas as pd

from millstream.connectors.kafka import stream_topic
from millstream.engine.cache import StateCache
from millstream.engine.clock import SystemClock
from millstream.engine.config import MillstreamConfig
from millstream.engine.deadletters import Origin
from millstream.engine.keys import key_interval
from millstream.engine.protocol import Delivery, IntervalWorker, Rejected
from millstream.engine.records import Record
from millstream.engine.routing import decode_delivery
from millstream.engine.spark.metrics import RESULT_SCHEMA, interval_counts
from millstream.engine.topology import ComputationSpec

if TYPE_CHECKING:
    from millstream.connectors.kafka import KafkaProductionSink
    from millstream.engine.stores.cassandra import CassandraIntervalStore

__all__ = [
    "RESULT_SCHEMA",
    "ROUTED_SCHEMA",
    "TaskSettings",
    "clear_process_cache",
    "decode_delivery",
    "interval_task",
    "router",
    "tick_rows",
]

ROUTED_SCHEMA: Final = (
    "interval int, stream string, partition int, offset long, kafka_ts long, "
    "key string, record_key string, record_value binary, record_ts long, record_id binary, "
    "raw binary, error string"
)
"""The rows :func:`router` emits: a delivery has ``key`` and the ``record_*`` fields, a
rejected message ``raw`` and ``error`` (a description; the exception is rebuilt later)."""

_PROGRESS_COLUMNS: Final = {
    "oldest_work": "Int64",
    "next_event_timer": "Int64",
    "next_wall_timer": "Int64",
}

_RESULT_COLUMNS: Final = [part.split()[0] for part in RESULT_SCHEMA.split(", ")]
_ROUTED_COLUMNS: Final = [part.split()[0] for part in ROUTED_SCHEMA.split(", ")]


@dataclass(frozen=True, slots=True)
class TaskSettings:
    """What an executor needs besides the computation: endpoints, store table, run token."""

    config: MillstreamConfig
    keyspace: str
    table: str
    run_token: str

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
    """One process's connections to one set of endpoints, and its interval workers."""

    cluster: Any
    store: CassandraIntervalStore
    sink: KafkaProductionSink
    cache: StateCache
    workers: dict[tuple[str, str, int], IntervalWorker] = field(default_factory=dict)


_CACHE: dict[tuple[str, tuple[str, ...], int, str, str], _Resources] = {}


def clear_process_cache() -> None:
    """Drop this process's cached workers and close its connections (tests, shutdown)."""
    while _CACHE:
        _, resources = _CACHE.popitem()
        resources.sink.close()
        resources.cluster.shutdown()


def _resources(settings: TaskSettings) -> _Resources:
    resources = _CACHE.get(settings.endpoints)
    if resources is None:
        # Imported here: the driver imports this module without needing the drivers loaded.
        from millstream.connectors.cassandra import connect
        from millstream.connectors.kafka import KafkaProductionSink
        from millstream.engine.stores.cassandra import CassandraIntervalStore

        cluster, session = connect(settings.config)
        try:
            store = CassandraIntervalStore(
                session, settings.keyspace, SystemClock(), table=settings.table
            )
            sink = KafkaProductionSink(settings.config)
        except BaseException:
            cluster.shutdown()
            raise
        resources = _Resources(
            cluster, store, sink, StateCache(settings.config.executor_cache_bytes)
        )
        _CACHE[settings.endpoints] = resources
    return resources


def router(
    spec: ComputationSpec,
) -> Callable[[Iterator[pd.DataFrame]], Iterator[pd.DataFrame]]:
    """The ``mapInPandas`` function that decodes, keys and routes ``spec``'s input.

    Input columns: ``value`` (bytes), ``topic``, ``partition``, ``offset``, ``kafka_ts``
    (the Kafka message timestamp in µs). Output: :data:`ROUTED_SCHEMA`.
    """
    intervals = spec.options.key_intervals
    reject_interval = key_interval("", intervals)
    streams = _streams_by_topic(spec)

    def route(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for frame in frames:
            rows: list[tuple[Any, ...]] = []
            for value, topic, partition, offset, kafka_ts in zip(
                frame["value"].tolist(),
                frame["topic"].tolist(),
                frame["partition"].tolist(),
                frame["offset"].tolist(),
                frame["kafka_ts"].tolist(),
                strict=True,
            ):
                raw = bytes(value)
                stream = streams[topic]
                record, key, error = decode_delivery(spec, stream, raw)
                if error is None:
                    assert record is not None
                    assert key is not None
                    rows.append(
                        (
                            key_interval(key, intervals),
                            stream,
                            partition,
                            offset,
                            kafka_ts,
                            key,
                            record.key,
                            record.value,
                            record.timestamp,
                            record.record_id,
                            None,
                            None,
                        )
                    )
                else:
                    rows.append(
                        (
                            reject_interval,
                            stream,
                            partition,
                            offset,
                            kafka_ts,
                            *(None,) * 5,
                            raw,
                            f"{type(error).__qualname__}: {error}",
                        )
                    )
            yield pd.DataFrame.from_records(rows, columns=_ROUTED_COLUMNS)

    return route


def _streams_by_topic(spec: ComputationSpec) -> dict[str, str]:
    return {stream_topic(i.stream): i.stream for i in spec.inputs}


def tick_rows(intervals: Iterable[int]) -> list[tuple[Any, ...]]:
    """:data:`ROUTED_SCHEMA` rows that make an interval run without input (a *tick*): for its
    due timers and unacknowledged productions."""
    return [(interval, *(None,) * (len(_ROUTED_COLUMNS) - 1)) for interval in intervals]


def interval_task(
    spec: ComputationSpec, settings: TaskSettings, watermark: int, timer_watermark: int
) -> Callable[[pd.DataFrame], pd.DataFrame]:
    """The ``applyInPandas`` function that runs one interval's share of a batch.

    Records run under the input low watermark before the batch (``watermark``), event-time
    timers under the one after it (see :meth:`IntervalWorker.process`). Raises whatever the
    interval's worker raises, failing the task; see the module docstring.
    """

    def run(frame: pd.DataFrame) -> pd.DataFrame:
        started = time.monotonic()
        interval = int(frame["interval"].iloc[0])
        frame = frame.sort_values(["stream", "partition", "offset"], kind="stable")
        inputs = _inputs(spec, frame)
        resources = _resources(settings)
        worker_key = (settings.run_token, spec.name, interval)
        worker = resources.workers.get(worker_key)
        cached = worker is not None
        if worker is None:
            worker = IntervalWorker(
                spec,
                interval,
                store=resources.store,
                sink=resources.sink,
                clock=SystemClock(),
                cache=resources.cache,
            )
            resources.workers[worker_key] = worker
        result = worker.process(inputs, watermark, timer_watermark=timer_watermark)
        progress = result.progress
        rejected = sum(isinstance(item, Rejected) for item in inputs)  # ticks are no input
        counts = interval_counts(len(inputs), rejected, result, cached)
        row = (
            spec.name,
            interval,
            *counts.counts().values(),
            os.getpid(),
            time.monotonic() - started,
            progress.oldest_work,
            progress.next_event_timer,
            progress.next_wall_timer,
        )
        # Nullable integers: Arrow sends None as null, not as a float NaN.
        return pd.DataFrame.from_records([row], columns=_RESULT_COLUMNS).astype(_PROGRESS_COLUMNS)

    return run


def _inputs(spec: ComputationSpec, frame: pd.DataFrame) -> list[Delivery | Rejected]:
    inputs: list[Delivery | Rejected] = []
    for stream, partition, offset, kafka_ts, key, r_key, r_value, r_ts, r_id, raw in zip(
        frame["stream"].tolist(),
        frame["partition"].tolist(),
        frame["offset"].tolist(),
        frame["kafka_ts"].tolist(),
        frame["key"].tolist(),
        frame["record_key"].tolist(),
        frame["record_value"].tolist(),
        frame["record_ts"].tolist(),
        frame["record_id"].tolist(),
        frame["raw"].tolist(),
        strict=True,
    ):
        if stream is None:
            continue  # a tick: the interval runs for its timers and resends only
        origin = Origin(stream=stream, partition=int(partition), offset=int(offset))
        if raw is None:
            record = Record(str(r_key), bytes(r_value), int(r_ts), bytes(r_id))
            inputs.append(Delivery(str(key), record, origin))
        else:
            inputs.append(_rejected(spec, origin, bytes(raw), int(kafka_ts)))
    return inputs


def _rejected(spec: ComputationSpec, origin: Origin, raw: bytes, kafka_ts: int) -> Rejected:
    assert origin.stream is not None
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
