"""Run a :class:`~millstream.engine.topology.Topology` on Spark Structured Streaming.

One driver runs a topology. Each computation is one streaming query over the Kafka topics of
its input streams, checkpointed under ``<checkpoint root>/<topology>/<computation>``
(default root: ``config.home / "checkpoints"``), so computations start, stop and fail
independently, and one can be added or removed while the others run. With
``RunSettings.one_query`` the whole topology is one query instead, checkpointed under
``<checkpoint root>/<topology>/@topology``, each batch working every computation
(:class:`~millstream.spark.batch.TopologyBatch`): a pipeline's record then passes its
stages in the batch that read it, and the set of computations is fixed while it runs.
**Streams are Kafka topics of the same name**
(:func:`millstream.connectors.kafka.stream_topic`): stream ``searches`` is topic
``searches``, and a computation's dead letters go to ``<computation>.dead-letters`` unless
its options name another stream.

A micro-batch flows like this (``foreachBatch`` on the driver only plans and collects)::

    offset log ──► the batch's offset ranges   driver: from the query's checkpoint
                │
                ▼
    parallelize(range(cores), cores)           one task per core, one stage
      .mapPartitionsWithIndex(batch_task)      executors: each task reads the ranges from
                │                                       Kafka, decodes, size-checks, applies
                │                                       the key extractor of the message's
                │                                       stream (undecodable → rejected), and
                │                                       keeps the whole intervals it owns;
                │                                       each interval's IntervalWorker
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
exist in ``local`` mode); if it still fails, on something else than an outage or a fence,
the batch is bisected for poison pills, records that make the engine itself fail, which are
quarantined and dead-lettered (:mod:`millstream.spark.isolation`); if none can be pinned down,
the computation's query stops with the error, its checkpoint does not advance, and restarting
it replays the batch. The same holds after a driver crash: Structured Streaming replays the
uncommitted batch, and every record it repeats is dropped as a duplicate by its dedup ID
(computations with ``exactly_once=False`` run such records again, as they accept).

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

**Deployment.** Where the state lives, how topics are made, how batches are retried: one
:class:`~millstream.engine.config.RunSettings` (``config.run`` unless given: the ``[run]``
table of ``millstream.toml``, or ``MILLSTREAM_RUN_*``). Before anything starts, the keyspace,
the interval table, the watermark topic and every stream's topic are provisioned
(:func:`millstream.connectors.provision`). The code of the topology's computations is shipped
to the executors by value (:mod:`millstream.spark.user_code`).

**A job** runs its topology and its injectors under one lifecycle, waits for its input to be
complete, and stops::

    config = load_config()
    with run_topology(topology, config, RunSettings(keyspace="zeitgeist")) as running:
        running.add_injector("search-logs", LogFileSource(logs, parse, "searches", follow=False))
        running.await_input_complete(timeout=3600)
    print(running.metrics())

or ``millstream run MODULE:TOPOLOGY`` (see :mod:`millstream.cli`) for a topology alone.
"""

from __future__ import annotations

import importlib
import json
import logging
import math
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import ModuleType, TracebackType
from typing import TYPE_CHECKING, Any, Final

from millstream.connectors import cassandra as cassandra_connector
from millstream.connectors import kafka as kafka_connector
from millstream.connectors.kafka.hanging import (
    HangingTransactionSweeper,
    JavaTransactionAdmin,
    OpenTransaction,
    hanging_after,
)
from millstream.connectors.kafka.stalls import stable_offsets
from millstream.connectors.kafka.topics import when_ready
from millstream.connectors.provisioning import provision
from millstream.connectors.services import start_through_outage
from millstream.engine.clock import Clock, SystemClock
from millstream.engine.computation import Computation
from millstream.engine.config import DEFAULT_KEYSPACE, MillstreamConfig, RunSettings
from millstream.engine.errors import CheckpointStorageError, FencedError, TopologyError
from millstream.engine.layout import IntervalLayout
from millstream.engine.records import MAX_EVENT_TIME
from millstream.engine.stores.cassandra import CassandraIntervalStore
from millstream.engine.topology import (
    ComputationOptions,
    ComputationSpec,
    KeyExtractor,
    Topology,
)
from millstream.engine.watermarks import Hold
from millstream.injectors.process import InjectorOptions, InjectorProcess
from millstream.injectors.source import Source
from millstream.spark.batch import BatchHandler, TopologyBatch, short_error
from millstream.spark.checkpoint import (
    admit_members,
    batch_offsets,
    checkpoint_holder,
    claim_checkpoint,
    latest_batch,
    lost_checkpoint_race,
    query_members,
)
from millstream.spark.driver_watermarks import (
    TopologyWatermarks,
    WatermarkSnapshot,
    offsets_consumer,
)
from millstream.spark.executor import TaskSettings
from millstream.spark.hosted_injectors import HostedInjectors
from millstream.spark.metrics import (
    BatchMetrics,
    ComputationMetrics,
    MetricCounts,
    describe,
    totals,
)
from millstream.spark.user_code import ship_user_code

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

TOPOLOGY_QUERY: Final = "@topology"
"""The directory of a topology's one query (``RunSettings.one_query``), beside its
computations' own; no computation can be named so."""

# How often in a row a driver restarts a query that lost its checkpoint to a zombie.
_TAKE_BACKS: Final = 5

# How long a stop waits for a query's warm-up to end before cancelling its job group again.
_WARM_CANCEL_SECONDS: Final = 0.1

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
    settings: RunSettings | None = None,
    *,
    trigger: Trigger | None = None,
    spark: SparkSession | None = None,
    on_batch: Callable[[BatchMetrics], None] | None = None,
    clock: Clock | None = None,
    **deprecated: Any,
) -> RunningTopology:
    """Provision the topology's store and topics and start it; see :class:`RunningTopology`.

    ``settings`` defaults to ``config.run``. ``trigger`` defaults to ``ProcessingTime(1.0)``;
    with :class:`AvailableNow` nothing runs until :meth:`RunningTopology.process_available`.
    The result is a context manager that stops the topology (and its injectors) on exit.

    The keywords that :class:`~millstream.engine.config.RunSettings` now holds (``keyspace``,
    ``table``, ``checkpoint_root``, ``partitions``, ``topic_partitions``,
    ``create_keyspace``, ``max_offsets_per_trigger``, ``batch_attempts``,
    ``outage_timeout``, ``metrics_port``, ``metrics_address``) still work with a
    ``DeprecationWarning``; they go in 0.3.
    """
    settings = (settings or config.run).with_deprecated_keywords("run_topology", deprecated)
    running = RunningTopology(
        topology,
        config,
        settings,
        trigger=trigger or ProcessingTime(),
        spark=spark,
        on_batch=on_batch,
        clock=clock,
    )
    running.start()
    return running


class RunningTopology:
    """A topology running on Spark: one streaming query per computation (or one for all of
    them, ``settings.one_query``), and the injectors added to it (:meth:`add_injector`),
    stopped together by :meth:`stop` or at the end of a ``with`` block.

    ``settings`` (default ``config.run``) is the run's deployment
    (:class:`~millstream.engine.config.RunSettings`): :meth:`start` provisions its keyspace
    (with ``create_keyspace``), interval table and topics (``partitions`` each, or
    ``topic_partitions[stream]``); ``max_offsets_per_trigger`` caps a micro-batch (Spark's
    Kafka option); a batch that fails is run again up to ``batch_attempts`` times, and while
    Kafka or Cassandra cannot be reached for up to ``outage_timeout`` seconds
    (:mod:`millstream.engine.outages`). Metrics of every batch are kept (:meth:`batches`,
    :meth:`metrics`) and passed to ``on_batch``, which runs on the driver thread of the
    computation's query (with ``one_query``, on the thread of the computation's part of the
    batch: several at once). ``clock`` (default: the system clock) decides when wall-time timers
    are due on the driver.

    With ``settings.metrics_port`` (0: off), :meth:`start` serves the topology's Prometheus
    metrics (:mod:`millstream.spark.prometheus`, in :attr:`prometheus`) at
    ``http://<metrics_address>:<metrics_port>/metrics`` until :meth:`stop`.

    The keywords :class:`~millstream.engine.config.RunSettings` now holds are deprecated
    here as in :func:`run_topology`.
    """

    def __init__(
        self,
        topology: Topology,
        config: MillstreamConfig,
        settings: RunSettings | None = None,
        *,
        trigger: Trigger,
        spark: SparkSession | None = None,
        on_batch: Callable[[BatchMetrics], None] | None = None,
        clock: Clock | None = None,
        **deprecated: Any,
    ) -> None:
        settings = (settings or config.run).with_deprecated_keywords("RunningTopology", deprecated)
        topology.validate()
        ship_user_code(topology.computations.values())
        if spark is None:
            from millstream.spark.session import spark_session

            spark = spark_session(config, app_name=f"millstream-{topology.name}")
        self.topology = topology
        self.config = config
        self.settings = settings
        self.trigger = trigger
        self.spark = spark
        self.checkpoint_root = settings.checkpoints(config.home)
        self.on_batch = on_batch
        self._lock = threading.Lock()
        # Who this driver is to the checkpoints it claims (millstream.spark.checkpoint).
        self.driver_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"
        # Per computation: the restarts after races lost to a zombie since its last batch.
        self._take_backs: dict[str, int] = {}
        self._batches: list[BatchMetrics] = []
        self._queries: dict[str, StreamingQuery] = {}
        self._offsets_admin: Any = None  # made by the first _caught_up
        # Per query: set as this handle stops it, so that its batch in progress, whose job
        # Spark cancels, fails at once instead of being retried as a failed attempt.
        self._stopping: dict[str, threading.Event] = {}
        # Per query (under its first computation), the thread and Spark job group warming
        # its Python workers (_warm).
        self._warming: dict[str, tuple[threading.Thread, str]] = {}
        # Per computation, for as long as it stays in this handle's topology: executors keep
        # their interval workers across the query's restarts (AvailableNow rounds) by it.
        self._run_tokens: dict[str, str] = {}
        # Each computation's own Python workers in local mode (BatchHandler's worker_pool):
        # numbered from 0 within the topology, a removed computation's number reused; pool 0
        # is Spark's default set, which every other job keeps warm.
        self._worker_pools: dict[str, int] = {}
        self._prepared = False
        self._injectors = HostedInjectors(config, settings)
        # The driver's clock: wall-time timers due, alarms. Executors use their own.
        self.clock = clock or SystemClock()
        # Per computation, kept across its query's restarts like the run tokens.
        self._watermarks = TopologyWatermarks(config, topology, self.clock)
        # The driver's own Cassandra session, for interval layouts (made at first use).
        self._layout_store: tuple[Any, CassandraIntervalStore] | None = None
        self._layout_store_lock = threading.Lock()
        self.prometheus: TopologyMetrics | None = None
        self.metrics_server: MetricsServer | None = None
        # Transactional productions: the transactions left hanging on their streams and
        # markers are aborted (connectors.kafka.hanging), from start() to stop().
        self._sweeper: HangingTransactionSweeper | None = None
        if settings.metrics_port:
            # prometheus_client is only imported by a driver that serves metrics.
            from millstream.spark.prometheus import TopologyMetrics

            self.prometheus = TopologyMetrics(
                topology.name, clock=self.clock, watermarks=self.watermark_snapshots
            )

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Provision the store and the topics; start every query unless triggered
        AvailableNow."""
        if self.prometheus is not None:
            from millstream.connectors.prometheus import serve_metrics

            self.metrics_server = serve_metrics(
                self.prometheus.registry,
                self.settings.metrics_port,
                self.settings.metrics_address,
            )
            _log.info("serving Prometheus metrics at %s", self.metrics_server.url)
        try:
            # Restarted while Kafka or Cassandra restarts: it starts once they are back.
            start_through_outage(
                self.config,
                f"topology {self.topology.name!r} starting",
                lambda: provision(
                    self.config,
                    self.settings,
                    streams=_streams(self.topology.computations.values()),
                ),
                self.settings.outage_timeout,
            )
        except BaseException:
            if self.metrics_server is not None:
                self.metrics_server.close()
                self.metrics_server = None
            raise
        self._prepared = True
        self._sweeper = HangingTransactionSweeper(
            self._transaction_admin,
            self._transactional_topics,
            self.clock,
            older_than=hanging_after(self.config.kafka_transaction_timeout),
            on_abort=self._hanging_aborted,
        )
        if isinstance(self.trigger, ProcessingTime):
            # Sweeping while the queries run (process_available sweeps during its rounds).
            self._sweeper.start()
            try:
                for specs in self._query_groups():
                    self._start_query_through_outage(specs)
            except BaseException:
                self.stop()  # the sweeper, the metrics server and the queries already started
                raise

    def __enter__(self) -> RunningTopology:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop the injectors added to it, then every query (a batch in progress is
        interrupted and replayed on restart)."""
        self._injectors.stop()
        with self._lock:
            queries, self._queries = dict(self._queries), {}
            server, self.metrics_server = self.metrics_server, None
            sweeper, self._sweeper = self._sweeper, None
        if sweeper is not None:
            sweeper.stop()
        for name, query in _distinct(queries).items():
            self._stop_query(name, query)
        with self._layout_store_lock:
            layout_store, self._layout_store = self._layout_store, None
        if layout_store is not None:
            layout_store[0].shutdown()
        self._watermarks.close()
        if server is not None:
            server.close()

    def abort_hanging_transactions(self) -> list[OpenTransaction]:
        """Abort now the Kafka transactions hanging on the streams the transactional
        computations write and on their markers (a running topology does so every
        :data:`~millstream.connectors.kafka.hanging.SWEEP_SECONDS`): those aborted."""
        if self._sweeper is None:
            raise TopologyError("the topology is not started")
        return self._sweeper.sweep()

    def _hanging_aborted(self, transaction: OpenTransaction) -> None:
        if self.prometheus is not None:
            self.prometheus.hanging_aborted()

    def _transaction_admin(self) -> JavaTransactionAdmin:
        return JavaTransactionAdmin(
            self.spark.sparkContext._jvm, kafka_connector.java_client_settings(self.config)
        )

    def _transactional_topics(self) -> list[str]:
        """The topics of the streams the transactional computations write (none: nothing
        to sweep but the consumer offsets, where no marker is then either)."""
        return sorted(
            {
                kafka_connector.stream_topic(stream)
                for spec in self.topology.computations.values()
                if spec.options.transactional
                for stream in spec.produced_streams
            }
        )

    def process_available(self, timeout: float = 600.0, max_rounds: int = 100) -> int:
        """With :class:`AvailableNow`: run every computation over the input its topics hold,
        in rounds (producers first), until a round finds nothing new; returns the rounds.

        A computation's output produced during a round is consumed in the same round if its
        consumer comes later in the order, else in the next.
        """
        if not isinstance(self.trigger, AvailableNow):
            raise TopologyError("process_available needs the AvailableNow trigger; use await_idle")
        sweeper = self._sweeper
        if sweeper is not None:
            sweeper.start()
        try:
            return self._rounds(timeout, max_rounds)
        finally:
            if sweeper is not None:
                sweeper.stop()

    def _rounds(self, timeout: float, max_rounds: int) -> int:
        deadline = time.monotonic() + timeout
        for round_number in range(1, max_rounds + 1):
            before = self._input_count()
            for specs in self._query_groups():
                query = self._start_query_through_outage(specs)
                remaining = max(1.0, deadline - time.monotonic())
                finished = query.awaitTermination(math.ceil(remaining))
                with self._lock:
                    for spec in specs:
                        self._queries.pop(spec.name, None)
                if not finished:
                    self._stop_query(specs[0].name, query)
                    raise TimeoutError(
                        f"{_computations(specs)} had not processed the input after "
                        f"{timeout} s; raise the timeout or look at the batch metrics"
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

    def await_input_complete(
        self,
        timeout: float | None = None,
        *,
        poll: float = 0.5,
        progress: Callable[[RunningTopology], object] | None = None,
    ) -> None:
        """With :class:`ProcessingTime`: wait until the input of every computation is
        complete and processed, as a job with finite input (a replay, a backfill) ends.

        Input is complete once every computation's input low watermark reached the end of
        time (:data:`~millstream.engine.records.MAX_EVENT_TIME`): every source of its input
        streams said it will send nothing more, as an injector whose source is exhausted
        does, and every computation upstream finished its work. Then it waits until
        everything was processed (:meth:`await_idle`). ``progress`` is called with this
        handle every ``poll`` seconds meanwhile (to report, or raise to give up).

        Raises the error of a failed query or injector, or ``TimeoutError`` after
        ``timeout`` seconds (``None``: no limit).
        """
        if not isinstance(self.trigger, ProcessingTime):
            raise TopologyError(
                "await_input_complete needs a ProcessingTime trigger; use process_available"
            )
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self.raise_failure()
            if progress is not None:
                progress(self)
            if self.input_complete():
                break
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(
                    f"the input of topology {self.topology.name!r} was not complete after "
                    f"{timeout} s; `millstream watermarks` shows what holds it"
                )
            time.sleep(poll)
        remaining = 3600.0 if deadline is None else deadline - time.monotonic()
        self.await_idle(timeout=max(60.0, remaining), poll=poll)

    def input_complete(self) -> bool:
        """Whether every computation's input low watermark reached the end of time."""
        snapshots = self.watermark_snapshots()
        return all(
            name in snapshots and snapshots[name].input_watermark >= MAX_EVENT_TIME
            for name in self.topology.computations
        )

    def await_idle(self, timeout: float = 120.0, poll: float = 0.5) -> None:
        """With :class:`ProcessingTime`: wait until every query has processed everything its
        input topics hold (checked twice in a row, so in-flight productions are seen), and no
        transaction is open on them (what was committed behind it is not readable yet).

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
        """Raise the error of the first query or injector that stopped with one, if any.

        A query that lost its checkpoint to a zombie (another driver of it, stopped for long,
        wrote the next batch's log entry first) is restarted from the checkpoint instead, as
        long as this driver holds it (:mod:`millstream.spark.checkpoint`); the zombie's
        query stops at its next batch. A driver whose checkpoint another driver took over
        gets :class:`~millstream.engine.errors.FencedError`. The ``await_*`` methods call
        this as they wait, so they keep a topology running through such a race.

        A full or unwritable disk under the checkpoint becomes a
        :class:`~millstream.engine.errors.CheckpointStorageError` that says where and what
        to do, not pages of JVM stack.
        """
        failure = self._injectors.failure()
        if failure is not None:
            raise failure
        with self._lock:
            queries = _distinct(self._queries)
        for name, query in queries.items():
            if not query.isActive:
                failure = query.exception()
                if failure is None:
                    continue
                if lost_checkpoint_race(failure):
                    self._take_back(name, failure)
                    continue
                text = str(failure)
                for cause in _STORAGE_FAILURES:
                    if cause in text:
                        raise CheckpointStorageError(
                            f"{self._stopped_by(name)} stopped: could not write the query's "
                            f"checkpoint under {self.checkpoint(name)} ({cause}). Free space "
                            "there (or fix its permissions) and restart the topology; nothing "
                            "is lost, the batch runs again from the checkpoint"
                        ) from failure
                raise failure

    def _stopped_by(self, name: str) -> str:
        """Whom a failure of ``name``'s query stops: that computation, or every computation
        of a topology run as one query (a message naming one of them would mislead)."""
        if self.settings.one_query:
            return f"{_computations(self._ordered())} (the topology's one query)"
        return f"computation {name!r}"

    def _take_back(self, name: str, failure: BaseException) -> None:
        """After another driver wrote ``name``'s checkpoint first: restart its query if this
        driver holds the checkpoint (the other is a zombie, and stops at its next batch),
        else stop as the zombie this driver is (:mod:`millstream.spark.checkpoint`)."""
        checkpoint = self.checkpoint(name)
        holder = checkpoint_holder(checkpoint)
        if holder != self.driver_id:
            raise FencedError(
                f"{self._stopped_by(name)} stopped: driver {holder} took the query over (its "
                f"checkpoint {checkpoint}); this driver ({self.driver_id}) is a zombie, it was "
                "stopped or cut off for long, and leaves the work to the other"
            ) from failure
        with self._lock:
            taken = self._take_backs[name] = self._take_backs.get(name, 0) + 1
            spec = self.topology.computations.get(name)
            # The computations of the query: all of them if the topology runs as one.
            specs = self._ordered() if self.settings.one_query else [] if spec is None else [spec]
            for other in specs:
                self._queries.pop(other.name, None)
        if not specs:
            return  # removed meanwhile
        if taken > _TAKE_BACKS:
            raise FencedError(
                f"{self._stopped_by(name)} lost the query's checkpoint {checkpoint} to another "
                f"driver {taken} times in a row: is a second driver of topology "
                f"{self.topology.name!r} running with this checkpoint root?"
            ) from failure
        _log.warning(
            # The proving ground counts these lines by this phrase (checks._TAKEN_BACK).
            "%s: another driver wrote its checkpoint first (a zombie: this driver "
            "holds it); restarting its query from the checkpoint (%d/%d): %s",
            self._stopped_by(name),
            taken,
            _TAKE_BACKS,
            short_error(failure),
        )
        self._start_query_through_outage(specs)

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
        (with a ProcessingTime trigger) from the earliest offsets, or its checkpoint.

        With ``RunSettings.one_query`` the topology's query would have to restart: refused
        while it runs. Added while it does not, the computation joins the query when it starts
        next, if none of its input topics was read by the query before."""
        self._refuse_while_one_query_runs(f"add computation {name!r}")
        spec = self.topology.add_computation(
            name, computation, inputs=inputs, outputs=outputs, options=options
        )
        try:
            self.topology.validate()
        except TopologyError:
            self.topology.remove_computation(name)
            raise
        ship_user_code([spec])
        provision(
            self.config, self.settings, streams=_streams([spec]), store=False, watermark_topic=False
        )
        running = isinstance(self.trigger, ProcessingTime) and self._prepared
        if running and not self.settings.one_query:
            self._start_query_through_outage([spec])
        return spec

    def remove_computation(self, name: str) -> ComputationSpec:
        """Stop a computation's query and take it out; its checkpoint and state are kept, so
        adding it again later resumes where it stopped. With ``RunSettings.one_query``:
        refused while the topology's query runs, as :meth:`add_computation` is."""
        self._refuse_while_one_query_runs(f"remove computation {name!r}")
        spec = self.topology.remove_computation(name)
        with self._lock:
            query = self._queries.pop(name, None)
            self._run_tokens.pop(name, None)
            self._worker_pools.pop(name, None)
        tracker = self._watermarks.pop(name)
        if query is not None:
            self._stop_query(name, query)
        if tracker is not None:
            tracker.close()
        return spec

    def _refuse_while_one_query_runs(self, change: str) -> None:
        if self.settings.one_query and self.active_computations:
            raise TopologyError(
                f"cannot {change} while topology {self.topology.name!r} runs: its computations "
                "run in one query (one_query = true), which a change restarts. Stop it, change "
                "the topology and start it again"
            )

    def _stop_query(self, name: str, query: StreamingQuery) -> None:
        with self._lock:
            stopping = self._stopping.pop(name, None)
            warming = self._warming.pop(name, None)
        if stopping is not None:
            stopping.set()
        if warming is not None:
            thread, group = warming
            # Cancelled until its thread ends: a warm-up whose job was not submitted yet when
            # first cancelled would otherwise run it whole (its takes waiting out an outage).
            while True:
                self.spark.sparkContext.cancelJobGroup(group)
                thread.join(_WARM_CANCEL_SECONDS)
                if not thread.is_alive():
                    break
        query.stop()

    @property
    def queries(self) -> dict[str, StreamingQuery]:
        """The streaming query of each computation currently started, by computation name
        (with ``RunSettings.one_query``, the same query for all of them)."""
        with self._lock:
            return dict(self._queries)

    @property
    def active_computations(self) -> list[str]:
        with self._lock:
            return sorted(name for name, query in self._queries.items() if query.isActive)

    # -- injectors -------------------------------------------------------------------------

    def add_injector(
        self, name: str, source: Source, options: InjectorOptions | None = None
    ) -> InjectorProcess:
        """Run injector ``name`` (paper 5.2) over ``source`` under this topology's lifecycle.

        It is connected as ``connect_injector`` connects one (its checkpoint in this run's
        keyspace, its streams' topics provisioned; no metrics endpoint of its own) and runs on
        a thread of this driver until its source is exhausted or :meth:`stop`. Returns the
        process, for its ``stats`` and ``watermark``. Its failure is raised by
        :meth:`raise_failure` and the ``await_*`` methods, as a query's is; it stops the
        injector alone. A restarted job resumes each injector from its checkpoint.
        """
        return self._injectors.add(name, source, options)

    @property
    def injectors(self) -> dict[str, InjectorProcess]:
        """The injector processes added to this topology, by name (stopped ones too)."""
        return self._injectors.processes

    # -- watermarks ------------------------------------------------------------------------

    def input_watermark(self, computation: str) -> int:
        """The input low watermark of a running computation (µs), as of its latest batch."""
        return self._watermarks.get(computation).state.input.current

    def explain(self, computation: str) -> list[str]:
        """What holds a computation's watermarks: per input stream the lowest source (or why
        it has none), then what holds its own watermark (its input or an interval)."""
        state = self._watermarks.get(computation).state
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
        cores = self.spark.sparkContext.defaultParallelism
        return stored or IntervalLayout.initial(spec.options.starting_intervals(cores))

    def holds(self, computation: str) -> list[Hold]:
        return self._watermarks.get(computation).state.input.explain()

    def watermark_snapshots(self) -> dict[str, WatermarkSnapshot]:
        """The watermarks of every computation that has run under this handle, as of their
        latest batches (from any thread)."""
        return self._watermarks.snapshots()

    def _driver_store(self) -> CassandraIntervalStore:
        """The driver's store for layouts: its own session, not an executor's resources.
        Its own lock: connecting may wait out an outage while batches record metrics."""
        with self._layout_store_lock:
            if self._layout_store is None:
                cluster, session = cassandra_connector.connect(self.config)
                try:
                    # Dedup expiry on the executors' clock: the copy of a split keeps
                    # exactly the IDs they still count as seen.
                    store = CassandraIntervalStore(
                        session, self.settings.keyspace, SystemClock(), table=self.settings.table
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
        """Where the query of ``computation`` keeps its Kafka offsets: its own directory,
        ``<root>/<topology>/<computation>``, or with ``RunSettings.one_query`` the
        topology's query's, ``<root>/<topology>/@topology``."""
        if self.settings.one_query:
            return self.checkpoint_root / self.topology.name / TOPOLOGY_QUERY
        return self._files(computation)

    def _files(self, computation: str) -> Path:
        """The computation's own directory: its query's checkpoint, or with one query for
        the topology its quarantine and its tasks' claims alone."""
        return self.checkpoint_root / self.topology.name / computation

    def _query_groups(self) -> list[list[ComputationSpec]]:
        """The computations of each query to start, producers first: one query for all of
        them (``RunSettings.one_query``), or one each."""
        ordered = self._ordered()
        if self.settings.one_query:
            return [ordered] if ordered else []
        return [[spec] for spec in ordered]

    def _check_mode(self, specs: list[ComputationSpec]) -> None:
        """Refuse to start ``specs`` in a query of the other kind than the one that ran
        them: the new query would read every input again from the start."""
        shared = self.checkpoint_root / self.topology.name / TOPOLOGY_QUERY
        for spec in specs:
            own = self._files(spec.name)
            if self.settings.one_query and latest_batch(own) is not None:
                ran, kind = own, "a query of its own (one_query = false)"
            elif not self.settings.one_query and spec.name in query_members(shared):
                ran, kind = shared, "the topology's one query (one_query = true)"
            else:
                continue
            raise TopologyError(
                f"computation {spec.name!r} ran in {kind}, checkpointed in {ran}: a query of "
                "the other kind would start its input from the beginning. Run it as it ran, "
                "or give the topology a new checkpoint_root and keyspace to start over"
            )

    def _start_query_through_outage(self, specs: list[ComputationSpec]) -> StreamingQuery:
        """:meth:`_start_query`, waiting out Kafka or Cassandra not answering: a driver
        restarted as a broker or a node dies gets through provisioning and then meets the
        outage here (the wake topics, the end offsets, the layout store's session)."""
        return start_through_outage(
            self.config,
            f"{_computations(specs)} starting",
            lambda: self._start_query(specs),
            self.settings.outage_timeout,
        )

    def _start_query(self, specs: list[ComputationSpec]) -> StreamingQuery:
        """Start the query of ``specs``: one computation's, or the topology's one query."""
        with self._lock:
            for spec in specs:
                running = self._queries.get(spec.name)
                if running is not None and running.isActive:
                    raise TopologyError(f"computation {spec.name!r} is already running")
            # A topology's batch is one job (TopologyJob), in Spark's default Python workers,
            # where each computation's retries find the shares they worked.
            pools = [
                0 if self.settings.one_query else self._worker_pool(spec.name) for spec in specs
            ]
        self._check_mode(specs)
        checkpoint = self.checkpoint(specs[0].name)
        # Each computation's input topics, and the query's: all of theirs.
        inputs = {
            spec.name: sorted({kafka_connector.stream_topic(i.stream) for i in spec.inputs})
            for spec in specs
        }
        topics = sorted({topic for read in inputs.values() for topic in read})
        alarms = [
            kafka_connector.alarm_topic(self.config, self.topology.name, spec.name)
            for spec in specs
        ]
        wakes = sorted(
            {
                kafka_connector.wake_topic(self.config, i.stream)
                for spec in specs
                for i in spec.inputs
            }
        )
        wakes.extend(alarms)
        kafka_connector.create_wake_topics(self.config, wakes)
        if self.settings.one_query:
            admit_members(checkpoint, inputs)
        claim_checkpoint(checkpoint, self.driver_id)
        starting_offsets = self._starting_offsets(topics, wakes)
        stopping = threading.Event()
        handlers = [
            self._handler(spec, checkpoint, stopping, pool)
            for spec, pool in zip(specs, pools, strict=True)
        ]
        # The Python workers warm while the start goes on (the wakes below took about 0.6 s
        # of a benchmark's 20,000-record start): the first batch then seldom waits for them.
        warming = (
            self._warm(specs, handlers, stopping)
            if isinstance(self.trigger, ProcessingTime)
            else None
        )
        try:
            for handler, alarm in zip(handlers, alarms, strict=True):
                # Wake the query once it starts (after the starting offsets were taken), so
                # that its first batch runs every interval: a restarted computation learns
                # its pending timers and productions even when no input and no report comes.
                handler.watermarks.topic.wake(
                    [alarm], f"start/{self.topology.name}/{handler.spec.name}"
                )
            query = self._start_stream(specs, handlers, checkpoint, topics, wakes, starting_offsets)
        except BaseException:
            if warming is not None:
                self.spark.sparkContext.cancelJobGroup(warming[1])
            raise
        with self._lock:
            for spec in specs:
                self._queries[spec.name] = query
                self._stopping[spec.name] = stopping
            if warming is not None:
                self._warming[specs[0].name] = warming
        return query

    def _start_stream(
        self,
        specs: list[ComputationSpec],
        handlers: Sequence[BatchHandler],
        checkpoint: Path,
        topics: list[str],
        wakes: list[str],
        starting_offsets: str,
    ) -> StreamingQuery:
        """Start the streaming query of ``specs``, each batch to ``handlers``."""
        options: dict[str, str] = {}
        if self.settings.max_offsets_per_trigger is not None:
            options["maxOffsetsPerTrigger"] = str(self.settings.max_offsets_per_trigger)
        from millstream.spark.session import kafka_stream

        label = TOPOLOGY_QUERY if self.settings.one_query else specs[0].name
        source = kafka_stream(
            self.spark,
            self.config,
            [*topics, *wakes],
            starting_offsets=starting_offsets,
            options=options,
        )
        writer = (
            source.writeStream.queryName(f"{self.topology.name}.{label}.{uuid.uuid4().hex}")
            .foreachBatch(handlers[0] if not self.settings.one_query else TopologyBatch(handlers))
            .option("checkpointLocation", str(checkpoint))
        )
        if isinstance(self.trigger, AvailableNow):
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime=f"{self.trigger.seconds} seconds")
        return writer.start()

    def _warm(
        self,
        specs: Sequence[ComputationSpec],
        handlers: Sequence[BatchHandler],
        stopping: threading.Event,
    ) -> tuple[threading.Thread, str]:
        """Warm the Python workers of ``handlers`` (:meth:`BatchHandler.warm`) while their
        query starts, on a thread and in a Spark job group of their own (returned): their
        first batch then finds its connections made, as a long-running job's later batches
        do, and waits for it (:attr:`BatchHandler.warmed`). A failure is logged, not
        raised: that batch makes them itself, waiting out an outage as every batch does."""
        group = f"millstream-warm-{uuid.uuid4().hex}"
        context = self.spark.sparkContext
        what = _computations(specs)
        # The topics each computation of a query in one reads that another of it writes to.
        upstream = {
            spec.name: {
                kafka_connector.stream_topic(stream)
                for other in specs
                if other is not spec
                for stream in other.produced_streams
            }
            for spec in specs
        }

        def run() -> None:
            context.setJobGroup(group, f"millstream: warming the Python workers of {what}")
            try:
                for handler in handlers:
                    if stopping.is_set():
                        return  # stopped as it started: nothing more to warm
                    started = time.monotonic()
                    try:
                        workers = handler.warm(upstream[handler.spec.name])
                        _log.info(
                            "computation %r: Python workers %s warmed in %.2f s; "
                            "intervals taken: %s",
                            handler.spec.name,
                            ", ".join(workers),
                            time.monotonic() - started,
                            workers,
                        )
                    except Exception as exc:  # logged: the first batch connects them itself
                        if not stopping.is_set():
                            _log.warning(
                                "computation %r: warming its Python workers failed; its "
                                "first batch connects them itself: %s",
                                handler.spec.name,
                                short_error(exc),
                            )
                        return
                    finally:
                        handler.warmed.set()
            finally:
                for handler in handlers:
                    handler.warmed.set()  # those after a failure: nothing more to wait for

        for handler in handlers:
            handler.warmed.clear()  # set again by the thread, whatever happens to it

        thread = threading.Thread(target=run, name=f"millstream-warm-{specs[0].name}", daemon=True)
        thread.start()
        return thread, group

    def _worker_pool(self, name: str) -> int:
        """The number of ``name``'s own Python workers (under the lock): the lowest free."""
        pool = self._worker_pools.get(name)
        if pool is None:
            taken = set(self._worker_pools.values())
            pool = next(n for n in range(len(taken) + 1) if n not in taken)
            self._worker_pools[name] = pool
        return pool

    def _handler(
        self,
        spec: ComputationSpec,
        checkpoint: Path,
        stopping: threading.Event,
        pool: int,
    ) -> BatchHandler:
        """The batch handler of ``spec`` in a query checkpointed in ``checkpoint``."""
        token = self._run_tokens.setdefault(spec.name, uuid.uuid4().hex)
        keyspace, table = self.settings.keyspace, self.settings.table
        namespace = kafka_connector.store_namespace(keyspace, table, self._driver_store().table_id)
        watermarks = self._watermarks.of(spec)
        return BatchHandler(
            spec,
            spark=self.spark,
            # The run's settings as the executors see them (a batch's cap bounds its read-ahead).
            settings=TaskSettings(
                self.config.with_run(self.settings), keyspace, table, token, namespace
            ),
            watermarks=watermarks,
            checkpoint=checkpoint,
            files=self._files(spec.name),
            attempts=self.settings.batch_attempts,
            outage_timeout=self.settings.outage_timeout,
            clock=self.clock,
            record=self._record,
            layout_store=self._driver_store,
            driver=self.driver_id,
            stopping=stopping,
            # A query started again (another round of AvailableNow, a restart) goes on
            # counting from this driver's totals.
            totals=self.metrics().get(spec.name),
            worker_pool=pool,
        )

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
            self._take_backs.pop(metrics.computation, None)
        _log.info("%s", describe(metrics))
        if self.prometheus is not None:
            self.prometheus.observe(metrics)
        if self.on_batch is not None:
            self.on_batch(metrics)

    def _input_count(self) -> int:
        with self._lock:
            return sum(batch.inputs for batch in self._batches)

    def _caught_up(self) -> dict[str, dict[str, dict[str, int]]] | None:
        """Each query's processed end offsets if all equal the topics' ends, else ``None``.

        A partition with a transaction open on it is not caught up, whatever was processed:
        a read_committed reader stops at its last stable offset, and records committed after
        that transaction began (by other producers) are readable only once it ends. A
        producer that died mid-transaction leaves it open until the interval's next owner,
        the driver's sweep or the broker's transaction timeout aborts it.
        """
        with self._lock:
            queries = dict(self._queries)
        ends: dict[str, dict[str, dict[str, int]]] = {}
        if self._offsets_admin is None:
            self._offsets_admin = kafka_connector.admin_client(self.config)
        admin = self._offsets_admin
        for name, query in queries.items():
            if query.status["isTriggerActive"]:
                return None
            processed = _end_offsets(query)
            spec = self.topology.computations.get(name)
            if spec is None:
                continue
            for stream in spec.inputs:
                topic = kafka_connector.stream_topic(stream.stream)
                done = processed.get(topic, {})
                offsets = when_ready(partial(stable_offsets, admin, [topic]), 10.0)
                for (_, partition), (stable, high) in offsets.items():
                    if stable < high or done.get(str(partition), 0) < stable:
                        return None
            ends[name] = processed
        return ends


def _distinct(queries: Mapping[str, StreamingQuery]) -> dict[str, StreamingQuery]:
    """Each query once, under the first computation it runs (a topology's one query runs
    all of them)."""
    distinct: dict[str, StreamingQuery] = {}
    for name, query in queries.items():
        if not any(query is seen for seen in distinct.values()):
            distinct[name] = query
    return distinct


def _computations(specs: Sequence[ComputationSpec]) -> str:
    """``computation 'a'``, or ``computations 'a', 'b'`` (a topology's one query)."""
    names = ", ".join(repr(spec.name) for spec in specs)
    return f"computation {names}" if len(specs) == 1 else f"computations {names}"


def _streams(specs: Iterable[ComputationSpec]) -> set[str]:
    """Every stream the computations read or write."""
    streams: set[str] = set()
    for spec in specs:
        streams.update(i.stream for i in spec.inputs)
        streams.update(spec.produced_streams)
    return streams


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
