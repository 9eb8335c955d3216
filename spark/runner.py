"""Run a :class:`~millstream.engine.topology.Topology` on Spark Structured Streaming.

One driver runs a topology. Each computation is one streaming query over the Kafka topics of
its input streams, checkpointed under ``<checkpoint root>/<topology>/<computation>``
(default root: ``config.home / "checkpoints"``), so computations start, stop and fail
independently, and one can be added or removed while the others run. **Streams are Kafka
topics of the same name** (:func:`millstream.connectors.kafka.stream_topic`): stream
``searches`` is topic ``searches``, and a computation's dead letters go to
``<computation>.dead-letters`` unless its options name another stream.

A micro-batch flows like this (``foreachBatch`` on the driver only plans and collects)::

    Kafka ──► mapInArrow(router)             executors: decode, size-check, key extractor of
                │                                       the message's stream, key interval;
                │                                       undecodable → rejected row
                ▼
              repartition(cores, interval)      each task gets whole intervals, evenly
                .mapInArrow(interval_task)      executors: each interval's IntervalWorker
                │                                       (cached per Python worker process)
                │                                       acquires the sequencer, dedups, runs
                │                                       user code, commits by LWT to Cassandra,
                │                                       sends productions to Kafka
                ▼
              collect() ──► BatchMetrics        driver: one row per interval, summed

**Exactly once across Spark.** Every task attempt acquires its interval's sequencer before it
reads or writes, and every commit is conditional on it, so an attempt whose interval was
acquired by anyone after it (a retried or speculative attempt, a replayed batch, a second
driver) commits nothing: its write fails with ``FencedError``, which fails the task. A key's
changes are one conditional batch, so a failure never leaves part of a key applied; other
intervals (and earlier keys of the same interval) may have committed, which is harmless,
because the batch is then run again and everything already committed is a duplicate. The
driver re-runs a failed batch up to ``batch_attempts`` times (Spark's own task retries do not
exist in ``local`` mode); if it still fails, the computation's query stops with the error,
its checkpoint does not advance, and restarting it replays the batch. The same holds after a
driver crash: Structured Streaming replays the uncommitted batch, and every record it repeats
is dropped as a duplicate by its dedup ID (computations with ``exactly_once=False`` run such
records again, as they accept).

**Low watermarks** (:mod:`millstream.engine.watermarks`). Reports go to the compacted
watermark topic (``config.kafka_watermark_topic``), which the driver reads itself; a query
reads, besides its data topics, only the *wake topics* of its input streams and its own alarm
topic (:func:`~millstream.connectors.kafka.wake_topic`, ``alarm_topic``), so a report starts a
batch of the consumers of the streams it names and of no other query (its own computation
included), and a batch with nothing to do is never started by its own report. Per batch the
driver reads the new reports and the batch's end offsets from the query's offset log
(``<checkpoint>/offsets/<batch id>``), applies the reports that those offsets have caught up
with, and runs the batch: records under the input low watermark before it, event-time timers
under the one after it. Intervals with work but no input (a due timer, an unacknowledged
production; all of them in the first batch of a run, which a wake-up written at the query's
start guarantees) get a *tick* row so they run too. After the batch the driver publishes the
computation's report, ``min(input watermark, oldest pending work of its intervals)``, covering
its output topics' end offsets, if it changed. When a wall-time timer is due later, the driver
sets an alarm that writes a wake-up message to the alarm topic at that time, which starts the
batch that fires it.

Use it from Python::

    running = run_topology(topology, load_config(), keyspace="zeitgeist", trigger=ProcessingTime(1))
    running.await_idle(timeout=60)
    print(running.metrics())
    running.stop()

or ``millstream run MODULE:TOPOLOGY`` (see :mod:`millstream.cli`).
"""

from __future__ import annotations

import importlib
import json
import logging
import math
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from millstream.connectors import cassandra as cassandra_connector
from millstream.connectors import kafka as kafka_connector
from millstream.connectors.prometheus import DEFAULT_METRICS_ADDRESS
from millstream.connectors.services import reaching
from millstream.engine.authority import WatermarkAuthority
from millstream.engine.clock import Clock, SystemClock
from millstream.engine.computation import Computation
from millstream.engine.config import MillstreamConfig
from millstream.engine.errors import CheckpointStorageError, TopologyError
from millstream.engine.layout import IntervalLayout
from millstream.engine.outages import DEFAULT_OUTAGE_TIMEOUT
from millstream.engine.store import IntervalStore
from millstream.engine.stores.cassandra import (
    DEFAULT_KEYSPACE,
    DEFAULT_TABLE,
    CassandraIntervalStore,
    create_schema,
)
from millstream.engine.topology import (
    ComputationOptions,
    ComputationSpec,
    KeyExtractor,
    Topology,
)
from millstream.engine.watermarks import Hold
from millstream.spark.batch import BatchHandler, batch_offsets
from millstream.spark.driver_watermarks import (
    DriverWatermarks,
    WatermarkSnapshot,
    offsets_consumer,
)
from millstream.spark.executor import TaskSettings
from millstream.spark.metrics import (
    BatchMetrics,
    ComputationMetrics,
    MetricCounts,
    describe,
    totals,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

    from millstream.connectors.prometheus import MetricsServer
    from millstream.spark.prometheus import TopologyMetrics

__all__ = [
    "DEFAULT_KEYSPACE",
    "AvailableNow",
    "BatchMetrics",
    "ComputationMetrics",
    "MetricCounts",
    "ProcessingTime",
    "RunningTopology",
    "Trigger",
    "batch_offsets",
    "load_topology",
    "run_topology",
]

_log = logging.getLogger(__name__)

# What a JVM's IOException says when the disk under a checkpoint refuses a write.
_STORAGE_FAILURES = ("No space left on device", "Disk quota exceeded", "Read-only file system")


@dataclass(frozen=True, slots=True)
class AvailableNow:
    """Process what the input topics hold, then stop (batch jobs, tests): see
    :meth:`RunningTopology.process_available`."""


@dataclass(frozen=True, slots=True)
class ProcessingTime:
    """Run continuously, starting a micro-batch every ``seconds`` (if there is input)."""

    seconds: float = 1.0


Trigger = AvailableNow | ProcessingTime


def load_topology(target: str) -> tuple[Topology, ModuleType]:
    """The topology named by ``MODULE:ATTRIBUTE``, and the module it came from.

    ``MODULE`` is imported (the working directory comes first on ``sys.path``, as for
    ``python -m``); ``ATTRIBUTE`` is a :class:`Topology` or a zero-argument callable
    returning one.
    """
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise TopologyError(
            f"{target!r} does not name a topology; write MODULE:ATTRIBUTE, e.g. "
            "my_jobs.zeitgeist:topology"
        )
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise TopologyError(
            f"cannot import module {module_name!r} ({exc}); run from the directory that holds "
            "it or put it on PYTHONPATH"
        ) from exc
    try:
        found = getattr(module, attribute)
    except AttributeError:
        raise TopologyError(f"module {module_name!r} has no attribute {attribute!r}") from None
    topology = found() if callable(found) and not isinstance(found, Topology) else found
    if not isinstance(topology, Topology):
        raise TopologyError(
            f"{target} is {type(topology).__name__}, not a Topology (or a zero-argument "
            "callable returning one)"
        )
    return topology, module


def run_topology(
    topology: Topology,
    config: MillstreamConfig,
    *,
    trigger: Trigger | None = None,
    spark: SparkSession | None = None,
    keyspace: str = DEFAULT_KEYSPACE,
    table: str = DEFAULT_TABLE,
    checkpoint_root: Path | None = None,
    partitions: int = 2,
    topic_partitions: Mapping[str, int] | None = None,
    create_keyspace: bool = True,
    max_offsets_per_trigger: int | None = None,
    batch_attempts: int = 3,
    outage_timeout: float = DEFAULT_OUTAGE_TIMEOUT,
    on_batch: Callable[[BatchMetrics], None] | None = None,
    clock: Clock | None = None,
    metrics_port: int | None = None,
    metrics_address: str = DEFAULT_METRICS_ADDRESS,
) -> RunningTopology:
    """Prepare the topology's topics and store and start it; see :class:`RunningTopology`.

    ``trigger`` defaults to ``ProcessingTime(1.0)``. With :class:`AvailableNow` nothing runs
    until :meth:`RunningTopology.process_available`.
    """
    running = RunningTopology(
        topology,
        config,
        trigger=trigger or ProcessingTime(),
        spark=spark,
        keyspace=keyspace,
        table=table,
        checkpoint_root=checkpoint_root,
        partitions=partitions,
        topic_partitions=topic_partitions,
        create_keyspace=create_keyspace,
        max_offsets_per_trigger=max_offsets_per_trigger,
        batch_attempts=batch_attempts,
        outage_timeout=outage_timeout,
        on_batch=on_batch,
        clock=clock,
        metrics_port=metrics_port,
        metrics_address=metrics_address,
    )
    running.start()
    return running


class RunningTopology:
    """A topology running on Spark: one streaming query per computation.

    Topics missing for any of its streams are created (``partitions`` each, or
    ``topic_partitions[stream]``), and so are the Cassandra interval table and, with
    ``create_keyspace`` (SimpleStrategy, ``config.cassandra_replication`` replicas), its keyspace.
    ``max_offsets_per_trigger`` caps a micro-batch (Spark's Kafka option). A batch that fails
    is run again up to ``batch_attempts`` times, and while Kafka or Cassandra cannot be reached
    for up to ``outage_timeout`` seconds (:mod:`millstream.engine.outages`). Metrics of every
    batch are kept (:meth:`batches`, :meth:`metrics`) and passed to ``on_batch``, which runs on
    the driver thread of the computation's query. ``clock`` (default: the system clock)
    decides when wall-time timers are due on the driver.

    With ``metrics_port`` (``None`` or 0: off), :meth:`start` serves the topology's Prometheus
    metrics (:mod:`millstream.spark.prometheus`, in :attr:`prometheus`) at
    ``http://<metrics_address>:<metrics_port>/metrics`` until :meth:`stop`.
    """

    def __init__(
        self,
        topology: Topology,
        config: MillstreamConfig,
        *,
        trigger: Trigger,
        spark: SparkSession | None = None,
        keyspace: str = DEFAULT_KEYSPACE,
        table: str = DEFAULT_TABLE,
        checkpoint_root: Path | None = None,
        partitions: int = 2,
        topic_partitions: Mapping[str, int] | None = None,
        create_keyspace: bool = True,
        max_offsets_per_trigger: int | None = None,
        batch_attempts: int = 3,
        outage_timeout: float = DEFAULT_OUTAGE_TIMEOUT,
        on_batch: Callable[[BatchMetrics], None] | None = None,
        clock: Clock | None = None,
        metrics_port: int | None = None,
        metrics_address: str = DEFAULT_METRICS_ADDRESS,
    ) -> None:
        if batch_attempts < 1:
            raise ValueError(f"batch_attempts must be at least 1, got {batch_attempts}")
        if partitions < 1:
            raise ValueError(f"partitions must be at least 1, got {partitions}")
        topology.validate()
        if spark is None:
            from millstream.spark.session import spark_session

            spark = spark_session(config, app_name=f"millstream-{topology.name}")
        self.topology = topology
        self.config = config
        self.trigger = trigger
        self.spark = spark
        self.keyspace = keyspace
        self.table = table
        self.checkpoint_root = checkpoint_root or config.home / "checkpoints"
        self.partitions = partitions
        self.topic_partitions = dict(topic_partitions or {})
        self.max_offsets_per_trigger = max_offsets_per_trigger
        self.batch_attempts = batch_attempts
        self.outage_timeout = outage_timeout
        self.on_batch = on_batch
        self._lock = threading.Lock()
        self._batches: list[BatchMetrics] = []
        self._queries: dict[str, StreamingQuery] = {}
        # Per computation, for as long as it stays in this handle's topology: executors keep
        # their interval workers across the query's restarts (AvailableNow rounds) by it.
        self._run_tokens: dict[str, str] = {}
        self._create_keyspace = create_keyspace
        self._prepared = False
        # The driver's clock: wall-time timers due, alarms. Executors use their own.
        self.clock = clock or SystemClock()
        # Per computation, kept across its query's restarts like the run tokens.
        self._watermarks: dict[str, DriverWatermarks] = {}
        self._publisher: kafka_connector.KafkaWatermarkTopic | None = None
        self._authority: WatermarkAuthority | None = None
        # The driver's own Cassandra session, for interval layouts (made at first use).
        self._layout_store: tuple[Any, CassandraIntervalStore] | None = None
        self._layout_store_lock = threading.Lock()
        self.metrics_port = metrics_port
        self.metrics_address = metrics_address
        self.prometheus: TopologyMetrics | None = None
        self.metrics_server: MetricsServer | None = None
        if metrics_port:
            # prometheus_client is only imported by a driver that serves metrics.
            from millstream.spark.prometheus import TopologyMetrics

            self.prometheus = TopologyMetrics(
                topology.name, clock=self.clock, watermarks=self.watermark_snapshots
            )

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Create topics and the store table; start every query unless triggered AvailableNow."""
        if self.prometheus is not None:
            from millstream.connectors.prometheus import serve_metrics

            self.metrics_server = serve_metrics(
                self.prometheus.registry, self.metrics_port or 0, self.metrics_address
            )
            _log.info("serving Prometheus metrics at %s", self.metrics_server.url)
        try:
            with reaching(self.config):  # a service not running: say which, and what to do
                self._prepare_store()
                self._watermark_publisher()  # creates (or checks) the watermark topic
                self._create_topics(self.topology.computations.values())
        except BaseException:
            if self.metrics_server is not None:
                self.metrics_server.close()
                self.metrics_server = None
            raise
        self._prepared = True
        if isinstance(self.trigger, ProcessingTime):
            for spec in self._ordered():
                self._start_query(spec)

    def stop(self) -> None:
        """Stop every query (a batch in progress is interrupted and replayed on restart)."""
        with self._lock:
            queries, self._queries = dict(self._queries), {}
            watermarks, self._watermarks = dict(self._watermarks), {}
            publisher, self._publisher = self._publisher, None
            authority, self._authority = self._authority, None
            server, self.metrics_server = self.metrics_server, None
        for query in queries.values():
            query.stop()
        with self._layout_store_lock:
            layout_store, self._layout_store = self._layout_store, None
        if layout_store is not None:
            layout_store[0].shutdown()
        for tracker in watermarks.values():
            tracker.close()
        if authority is not None:
            authority.close()
        if publisher is not None:
            publisher.close()
        if server is not None:
            server.close()

    def process_available(self, timeout: float = 600.0, max_rounds: int = 100) -> int:
        """With :class:`AvailableNow`: run every computation over the input its topics hold,
        in rounds (producers first), until a round finds nothing new; returns the rounds.

        A computation's output produced during a round is consumed in the same round if its
        consumer comes later in the order, else in the next.
        """
        if not isinstance(self.trigger, AvailableNow):
            raise TopologyError("process_available needs the AvailableNow trigger; use await_idle")
        deadline = time.monotonic() + timeout
        for round_number in range(1, max_rounds + 1):
            before = self._input_count()
            for spec in self._ordered():
                query = self._start_query(spec)
                remaining = max(1.0, deadline - time.monotonic())
                finished = query.awaitTermination(math.ceil(remaining))
                with self._lock:
                    self._queries.pop(spec.name, None)
                if not finished:
                    query.stop()
                    raise TimeoutError(
                        f"computation {spec.name!r} had not processed its input after "
                        f"{timeout} s; raise the timeout or look at its batch metrics"
                    )
                failure = query.exception()
                if failure is not None:
                    raise failure
            if self._input_count() == before:
                return round_number
        raise TimeoutError(
            f"topology {self.topology.name!r} still had input after {max_rounds} rounds; "
            "does a cycle produce without end?"
        )

    def await_idle(self, timeout: float = 120.0, poll: float = 0.5) -> None:
        """With :class:`ProcessingTime`: wait until every query has processed everything its
        input topics hold (checked twice in a row, so in-flight productions are seen).

        Raises the error of a query that failed, or ``TimeoutError``.
        """
        if not isinstance(self.trigger, ProcessingTime):
            raise TopologyError("await_idle needs a ProcessingTime trigger; use process_available")
        deadline = time.monotonic() + timeout
        previous: dict[str, dict[str, dict[str, int]]] | None = None
        while time.monotonic() < deadline:
            self.raise_failure()
            current = self._caught_up()
            if current is not None and current == previous:
                return
            previous = current
            time.sleep(poll)
        raise TimeoutError(f"topology {self.topology.name!r} was not idle after {timeout} s")

    def raise_failure(self) -> None:
        """Raise the error of the first query that stopped with one, if any.

        A full or unwritable disk under the checkpoint becomes a
        :class:`~millstream.engine.errors.CheckpointStorageError` that says where and what
        to do, not pages of JVM stack.
        """
        with self._lock:
            queries = dict(self._queries)
        for name, query in queries.items():
            if not query.isActive:
                failure = query.exception()
                if failure is None:
                    continue
                text = str(failure)
                for cause in _STORAGE_FAILURES:
                    if cause in text:
                        raise CheckpointStorageError(
                            f"computation {name!r} stopped: could not write its checkpoint "
                            f"under {self.checkpoint(name)} ({cause}). Free space there (or "
                            "fix its permissions) and restart the topology; nothing is lost, "
                            "the batch runs again from the checkpoint"
                        ) from failure
                raise failure

    def await_termination(self, poll: float = 1.0) -> None:
        """Block until every query stopped; raises the error of a failed one."""
        while True:
            with self._lock:
                queries = list(self._queries.values())
            if not any(query.isActive for query in queries):
                self.raise_failure()
                return
            self.raise_failure()
            time.sleep(poll)

    # -- dynamic topology ------------------------------------------------------------------

    def add_computation(
        self,
        name: str,
        computation: Computation,
        *,
        inputs: Mapping[str, KeyExtractor | None] | Iterable[str],
        outputs: Iterable[str] = (),
        options: ComputationOptions | None = None,
    ) -> ComputationSpec:
        """Add a computation while the others keep running; its query starts at once
        (with a ProcessingTime trigger) from the earliest offsets, or its checkpoint."""
        spec = self.topology.add_computation(
            name, computation, inputs=inputs, outputs=outputs, options=options
        )
        try:
            self.topology.validate()
        except TopologyError:
            self.topology.remove_computation(name)
            raise
        self._create_topics([spec])
        if isinstance(self.trigger, ProcessingTime) and self._prepared:
            self._start_query(spec)
        return spec

    def remove_computation(self, name: str) -> ComputationSpec:
        """Stop a computation's query and take it out; its checkpoint and state are kept, so
        adding it again later resumes where it stopped."""
        spec = self.topology.remove_computation(name)
        with self._lock:
            query = self._queries.pop(name, None)
            self._run_tokens.pop(name, None)
            tracker = self._watermarks.pop(name, None)
        if query is not None:
            query.stop()
        if tracker is not None:
            tracker.close()
        return spec

    @property
    def queries(self) -> dict[str, StreamingQuery]:
        """The streaming query of each computation currently started, by computation name."""
        with self._lock:
            return dict(self._queries)

    @property
    def active_computations(self) -> list[str]:
        with self._lock:
            return sorted(name for name, query in self._queries.items() if query.isActive)

    # -- watermarks ------------------------------------------------------------------------

    def input_watermark(self, computation: str) -> int:
        """The input low watermark of a running computation (µs), as of its latest batch."""
        return self._tracker(computation).state.input.current

    def explain(self, computation: str) -> list[str]:
        """What holds a computation's watermarks: per input stream the lowest source (or why
        it has none), then what holds its own watermark (its input or an interval)."""
        state = self._tracker(computation).state
        lines = [str(hold) for hold in state.input.explain()]
        lines.append(f"{computation}: {state.watermark} held by {state.held_by}")
        return lines

    def layout(self, computation: str) -> IntervalLayout:
        """A computation's key intervals as the store holds them now (they split and merge
        with ``ComputationOptions.rebalance``); before its first batch, the ones it starts
        with. Only reads: the first batch writes the layout."""
        spec = self.topology.computations.get(computation)
        if spec is None:
            raise TopologyError(f"no computation {computation!r} in {self.topology.name!r}")
        stored = self._driver_store().read_layout(computation)
        return stored or IntervalLayout.initial(spec.options.key_intervals)

    def holds(self, computation: str) -> list[Hold]:
        return self._tracker(computation).state.input.explain()

    def watermark_snapshots(self) -> dict[str, WatermarkSnapshot]:
        """The watermarks of every computation that has run under this handle, as of their
        latest batches (from any thread)."""
        with self._lock:
            trackers = dict(self._watermarks)
        return {name: tracker.snapshot() for name, tracker in trackers.items()}

    def _tracker(self, computation: str) -> DriverWatermarks:
        with self._lock:
            tracker = self._watermarks.get(computation)
        if tracker is None:
            raise TopologyError(f"computation {computation!r} has not run under this handle")
        return tracker

    def _watermark_publisher(self) -> kafka_connector.KafkaWatermarkTopic:
        with self._lock:
            if self._publisher is None:
                self._publisher = kafka_connector.KafkaWatermarkTopic(self.config)
            return self._publisher

    def _watermarks_of(self, spec: ComputationSpec) -> DriverWatermarks:
        publisher = self._watermark_publisher()
        with self._lock:
            tracker = self._watermarks.get(spec.name)
            if tracker is None:
                if self._authority is None:
                    # One reader of the watermark topic for the whole run, not one per query.
                    self._authority = WatermarkAuthority(
                        kafka_connector.KafkaWatermarkTopic(self.config, create=False)
                    )
                tracker = DriverWatermarks(
                    self.config, self.topology, spec, publisher, self.clock, self._authority
                )
                self._watermarks[spec.name] = tracker
            return tracker

    def _driver_store(self) -> IntervalStore:
        """The driver's store for layouts: its own session, not an executor's resources.
        Its own lock: connecting may wait out an outage while batches record metrics."""
        with self._layout_store_lock:
            if self._layout_store is None:
                cluster, session = cassandra_connector.connect(self.config)
                try:
                    # Dedup expiry on the executors' clock: the copy of a split keeps
                    # exactly the IDs they still count as seen.
                    store = CassandraIntervalStore(
                        session, self.keyspace, SystemClock(), table=self.table
                    )
                except BaseException:
                    cluster.shutdown()
                    raise
                self._layout_store = (cluster, store)
            return self._layout_store[1]

    # -- metrics ---------------------------------------------------------------------------

    def batches(self, computation: str | None = None) -> list[BatchMetrics]:
        with self._lock:
            return [b for b in self._batches if computation in (None, b.computation)]

    def metrics(self) -> dict[str, ComputationMetrics]:
        """Totals per computation (every computation ever run by this handle)."""
        return totals(self.batches())

    # -- internals -------------------------------------------------------------------------

    def _prepare_store(self) -> None:
        cluster, session = cassandra_connector.connect(self.config)
        try:
            if self._create_keyspace:
                cassandra_connector.create_keyspace(
                    session, self.keyspace, self.config.cassandra_replication
                )
            create_schema(session, self.keyspace, self.table)
        finally:
            cluster.shutdown()

    def _create_topics(self, specs: Iterable[ComputationSpec]) -> None:
        streams: set[str] = set()
        for spec in specs:
            streams.update(i.stream for i in spec.inputs)
            streams.update(spec.produced_streams)
        by_count: dict[int, list[str]] = {}
        for stream in sorted(streams):
            count = self.topic_partitions.get(stream, self.partitions)
            by_count.setdefault(count, []).append(kafka_connector.stream_topic(stream))
        for count, topics in by_count.items():
            kafka_connector.create_topics(self.config, topics, partitions=count)

    def _ordered(self) -> list[ComputationSpec]:
        # Producers before consumers where the graph allows (cycles: in declaration order).
        specs = self.topology.computations
        order: list[ComputationSpec] = []
        visiting: set[str] = set()

        def visit(spec: ComputationSpec) -> None:
            if spec in order or spec.name in visiting:
                return
            visiting.add(spec.name)
            for input_stream in spec.inputs:
                for producer in self.topology.producers(input_stream.stream):
                    visit(producer)
            order.append(spec)

        for spec in specs.values():
            visit(spec)
        return order

    def checkpoint(self, computation: str) -> Path:
        """Where the query of ``computation`` keeps its Kafka offsets."""
        return self.checkpoint_root / self.topology.name / computation

    def _start_query(self, spec: ComputationSpec) -> StreamingQuery:
        from pyspark.sql import functions as F  # noqa: N812  (pyspark's convention)

        with self._lock:
            running = self._queries.get(spec.name)
            if running is not None and running.isActive:
                raise TopologyError(f"computation {spec.name!r} is already running")
        token = self._run_tokens.setdefault(spec.name, uuid.uuid4().hex)
        settings = TaskSettings(self.config, self.keyspace, self.table, token)
        options: dict[str, str] = {}
        if self.max_offsets_per_trigger is not None:
            options["maxOffsetsPerTrigger"] = str(self.max_offsets_per_trigger)
        topics = sorted({kafka_connector.stream_topic(i.stream) for i in spec.inputs})
        alarm = kafka_connector.alarm_topic(self.config, self.topology.name, spec.name)
        wakes = sorted({kafka_connector.wake_topic(self.config, i.stream) for i in spec.inputs})
        wakes.append(alarm)
        kafka_connector.create_wake_topics(self.config, wakes)
        starting_offsets = self._starting_offsets(topics, wakes)
        # Wake the query once it starts (after the starting offsets were taken), so that its
        # first batch runs every interval: a restarted computation learns its pending timers
        # and productions even when no input and no report comes.
        watermarks = self._watermarks_of(spec)
        watermarks.topic.wake([alarm], f"start/{self.topology.name}/{spec.name}")
        from millstream.spark.session import kafka_stream

        source = kafka_stream(
            self.spark,
            self.config,
            [*topics, *wakes],
            starting_offsets=starting_offsets,
            options=options,
        ).select(
            "value", "topic", "partition", "offset", F.unix_micros("timestamp").alias("kafka_ts")
        )
        writer = (
            source.writeStream.queryName(f"{self.topology.name}.{spec.name}.{uuid.uuid4().hex}")
            .foreachBatch(
                BatchHandler(
                    spec,
                    spark=self.spark,
                    settings=settings,
                    watermarks=watermarks,
                    checkpoint=self.checkpoint(spec.name),
                    attempts=self.batch_attempts,
                    outage_timeout=self.outage_timeout,
                    clock=self.clock,
                    record=self._record,
                    layout_store=self._driver_store,
                )
            )
            .option("checkpointLocation", str(self.checkpoint(spec.name)))
        )
        if isinstance(self.trigger, AvailableNow):
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime=f"{self.trigger.seconds} seconds")
        query = writer.start()
        with self._lock:
            self._queries[spec.name] = query
        return query

    def _starting_offsets(self, topics: list[str], wakes: list[str]) -> str:
        # Input from the beginning. Wake topics from their current end, as numbers (Spark
        # resolves "latest" only when the query starts): wake-ups written from now on start
        # batches, older ones are no batch's business.
        reader = offsets_consumer(self.config)
        try:
            ends = kafka_connector.end_offsets(reader, [*topics, *wakes])
        finally:
            reader.close()
        earliest = -2  # the Kafka source's code
        return json.dumps(
            {
                topic: {str(p): earliest if topic in topics else end for p, end in parts.items()}
                for topic, parts in ends.items()
            }
        )

    def _record(self, metrics: BatchMetrics) -> None:
        with self._lock:
            self._batches.append(metrics)
        _log.info("%s", describe(metrics))
        if self.prometheus is not None:
            self.prometheus.observe(metrics)
        if self.on_batch is not None:
            self.on_batch(metrics)

    def _input_count(self) -> int:
        with self._lock:
            return sum(batch.inputs for batch in self._batches)

    def _caught_up(self) -> dict[str, dict[str, dict[str, int]]] | None:
        """Each query's processed end offsets if all equal the topics' ends, else ``None``."""
        with self._lock:
            queries = dict(self._queries)
        ends: dict[str, dict[str, dict[str, int]]] = {}
        consumer = offsets_consumer(self.config)
        try:
            for name, query in queries.items():
                if query.status["isTriggerActive"]:
                    return None
                processed = _end_offsets(query)
                spec = self.topology.computations.get(name)
                if spec is None:
                    continue
                for stream in spec.inputs:
                    topic = kafka_connector.stream_topic(stream.stream)
                    high = kafka_connector.end_offsets(consumer, [topic])[topic]
                    done = processed.get(topic, {})
                    if any(done.get(str(p), 0) < end for p, end in high.items()):
                        return None
                ends[name] = processed
        finally:
            consumer.close()
        return ends


def _end_offsets(query: StreamingQuery) -> dict[str, dict[str, int]]:
    progress = query.lastProgress
    if not progress:
        return {}
    ends: dict[str, dict[str, int]] = {}
    for source in progress["sources"]:
        end = source["endOffset"]
        offsets = json.loads(end) if isinstance(end, str) else end
        for topic, partitions in (offsets or {}).items():
            ends.setdefault(topic, {}).update({str(p): int(o) for p, o in partitions.items()})
    return ends
