"""The ``foreachBatch`` function of a computation's query: one micro-batch, on the driver.

Per batch the handler reads the batch's end offsets from the query's offset log, applies the
watermark reports those offsets have caught up with (:class:`DriverWatermarks`), runs the
Spark job that routes the input and works each key interval (:mod:`.executor`), and records
the interval rows as the batch's :class:`~millstream.spark.metrics.BatchMetrics`. A
failed job is run again, up to ``attempts`` times, and for as long as an outage of Kafka or
Cassandra lasts (up to ``outage_timeout``): whatever a failed attempt committed is a duplicate
the next attempt drops. A batch still failing after its attempts, for another reason than an
outage or a fence, is searched for poison pills (:mod:`~millstream.spark.isolation`): the
messages found are quarantined (:mod:`~millstream.spark.quarantine`) and dead-lettered, and
the batch runs again without them.
"""

from __future__ import annotations

import contextlib
import logging
import re
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence, Set
from concurrent.futures import Future
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeVar

from millstream.connectors import kafka as kafka_connector
from millstream.connectors.kafka import (
    KafkaTransactionalSink,
    StableOffsetWatch,
    TransactionStalls,
)
from millstream.engine.clock import Clock
from millstream.engine.driver import BatchPlan, ComputationDriver, IntervalOutcome
from millstream.engine.errors import (
    FencedError,
    MillstreamError,
    PoisonIsolationError,
    TopologyError,
)
from millstream.engine.outages import DEFAULT_OUTAGE_TIMEOUT, Outage, is_outage
from millstream.engine.pause_points import pause_point
from millstream.engine.productions import CommitTag
from millstream.engine.store import IntervalStore
from millstream.engine.topology import ComputationSpec
from millstream.engine.watermarks import Offsets, WatermarkReport
from millstream.spark.checkpoint import (
    batch_offsets,
    fence_checkpoint,
    initial_offsets,
    lost_checkpoint_race,
)
from millstream.spark.driver_watermarks import DriverWatermarks, offsets_consumer
from millstream.spark.executor import (
    BatchInput,
    BatchTask,
    IntervalSlots,
    TaskSettings,
    WarmTask,
    batch_task,
)
from millstream.spark.isolation import (
    MAX_ISOLATED,
    OffsetRange,
    Position,
    batch_ranges,
    count,
    isolate,
)
from millstream.spark.metrics import (
    BatchMetrics,
    ComputationMetrics,
    ResultRow,
    summarize,
)
from millstream.spark.quarantine import Quarantine, QuarantinedRecord, python_traceback

if TYPE_CHECKING:
    from pyspark import RDD
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "WORKER_POOL_VARIABLE",
    "BatchHandler",
    "BatchStoppedError",
    "TopologyBatch",
    "TopologyJob",
    "TopologyPartError",
    "batch_offsets",
    "fence_checkpoint",
    "in_worker_pool",
    "short_error",
    "stopped_batch",
]

_log = logging.getLogger(__name__)

WORKER_POOL_VARIABLE: Final = "MILLSTREAM_WORKER_POOL"
"""The environment variable that gives a computation's tasks Python workers of their own
(:func:`in_worker_pool`)."""
_ENVIRONMENT_LOCK = threading.Lock()

_ERROR_LINE: Final = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Fault)\b.*")

# A sub-run of an isolation fails when it fails this many times in a row.
_SUB_RUN_TRIES: Final = 2
_FENCES: Final = (FencedError.__name__, "RetiredIntervalError")
_SUB_RUN: Final = "computation %r batch %d: sub-run on %s %s"
_OFFSETS_TIMEOUT: Final = 30.0
_T = TypeVar("_T")


def in_worker_pool(rdd: RDD[Any], pool: int) -> None:
    """Have ``rdd``'s tasks run in Python workers of pool ``pool`` (0: Spark's default set).

    Spark keeps one set of Python workers (one ``pyspark.daemon`` and its forks) for each
    distinct environment of the functions it runs (``SparkEnv.createPythonWorker`` keys its
    worker factories by executable, modules and environment variables), and hands a task
    the worker idle longest. With the queries of a pipeline sharing one set, a
    computation's two tasks often ran one after the other in the same worker while another
    query's task held the other one: that worker then took over the share the other worker
    had kept (:func:`.executor.claim_slot`), with its lease, its transactional producer and
    its cached state, and the next batch took it back (per batch of a three-stage pipeline
    at 200 events/s: 100 ms to resend, 100 ms to read; ``bench/throughput.py
    --only millstream-3-stages``). A set of its own per computation keeps each share in
    the worker that has it. The environment is read when the task's function is wrapped
    for the JVM, so it is set for that moment only, under a lock: the handlers of a
    topology's queries run on threads of their own. A function of pool 0 is wrapped under
    the lock too, without the variable: wrapped while another thread had set it, it ran in
    that thread's pool (found when the jobs warming the workers of a pipeline's queries
    started at once: the first computation's batch ran in the second's workers).

    The price: Spark stops a set's idle workers once the set had no task for a minute, so a
    computation that had no batch for that long starts its next one in fresh workers (their
    imports and connections, and a takeover of its intervals), where in the shared set it
    might have found them warm."""
    context = rdd.context
    with _ENVIRONMENT_LOCK:
        if pool:
            context.environment[WORKER_POOL_VARIABLE] = str(pool)
        try:
            rdd._jrdd  # noqa: B018  (the property wraps the function, with the environment)
        finally:
            context.environment.pop(WORKER_POOL_VARIABLE, None)


class BatchHandler:
    """The ``foreachBatch`` function of one computation's query (runs on the driver).

    ``checkpoint`` is the query's checkpoint directory (its offset log tells each batch's
    range) and ``driver`` the id this driver claimed it with (:mod:`.checkpoint`): a batch
    stops at once when another driver claimed it since. ``files`` is the computation's own
    directory, for its quarantine and its tasks' claims: the checkpoint, unless the query is
    a topology's (:class:`TopologyBatch`), whose checkpoint its computations share.
    ``record`` receives the metrics of every batch that ran anything. A batch whose attempt
    fails for another reason than an outage is tried ``attempts`` times; an outage of Kafka
    or Cassandra (:mod:`millstream.engine.outages`) is waited out, for up to
    ``outage_timeout`` seconds.
    ``layout_store`` gives the driver's own store (the runner's Cassandra session) for the
    layout: reading it, and splitting and merging intervals. ``stopping`` is set by whoever
    stops the query, before it does: the batch in progress then fails at once with the
    cancelled job's error, not retried (it runs again on restart, its committed part as
    duplicates).

    A batch that failed ``attempts`` times, neither on an outage nor on a fence, is looked
    through for poison pills (:mod:`~millstream.spark.isolation`): first a control, the batch
    without its records (its ticks only), which, failing too, fails the query as before; then
    sub-runs on halves of its offset ranges. The messages that fail alone are quarantined in
    the checkpoint (:mod:`~millstream.spark.quarantine`), and the whole batch runs again, in
    which the router rejects them as :class:`~millstream.engine.errors.PoisonRecordError`
    dead letters. Failing on more than :data:`~millstream.spark.isolation.MAX_ISOLATED`
    records alone, a batch fails the query with
    :class:`~millstream.engine.errors.PoisonIsolationError`.

    In local mode the computation's tasks run in Python workers of their own, pool
    ``worker_pool`` (:func:`in_worker_pool`; the runner numbers its computations' pools), or,
    for pool 0 (a topology's first computation, and every computation of a topology's one
    query), in Spark's default set.

    What happens between batches (watermarks, ticks, rebalancing) is the model's
    :class:`~millstream.engine.driver.ComputationDriver`; the handler adds what is Spark's:
    the offset log, running and retrying the job, fencing a zombie driver, publishing.
    """

    def __init__(
        self,
        spec: ComputationSpec,
        *,
        spark: SparkSession,
        settings: TaskSettings,
        watermarks: DriverWatermarks,
        checkpoint: Path,
        attempts: int,
        clock: Clock,
        record: Callable[[BatchMetrics], None],
        layout_store: Callable[[], IntervalStore],
        outage_timeout: float = DEFAULT_OUTAGE_TIMEOUT,
        driver: str | None = None,
        stopping: threading.Event | None = None,
        totals: ComputationMetrics | None = None,
        worker_pool: int | None = None,
        files: Path | None = None,
    ):
        self.spec = spec
        files = files or checkpoint
        self.worker_pool = worker_pool
        self.layout_store = layout_store
        self.spark = spark
        self.settings = settings
        self.watermarks = watermarks
        self.checkpoint = checkpoint
        self.driver_id = driver
        # The computation's totals since this driver started (``totals``: those of its
        # earlier queries), in its watermark reports: the live view reads them there.
        self._totals = totals or ComputationMetrics(computation=spec.name)
        # Set once the query is being stopped: Spark cancels the batch's job, whose failure
        # is then no reason to retry the batch or look in it for poison pills.
        self.stopping = stopping or threading.Event()
        self.attempts = attempts
        self.outage_timeout = outage_timeout
        self.clock = clock
        self.record = record
        self.data_topics = sorted({kafka_connector.stream_topic(i.stream) for i in spec.inputs})
        # One interval task per core, each running its share of the intervals in one Python
        # call: a wave of tasks, not one Python round trip per interval.
        cores = spark.sparkContext.defaultParallelism
        rebalanced = spec.options.rebalance is not None
        self.tasks = max(
            1, cores if rebalanced else min(spec.options.starting_intervals(cores), cores)
        )
        # The computation's key intervals are read from the store at the first batch.
        self._transactions: KafkaTransactionalSink | None = None
        # Transactional outputs: a producer that died mid-transaction stalls their readers.
        self._stalls = (
            StableOffsetWatch(settings.config, spec.produced_streams, clock)
            if spec.options.transactional
            else None
        )
        self.driver = ComputationDriver(
            spec,
            watermarks.state,
            watermarks.reader,
            layout_store=layout_store,
            clock=clock,
            tasks=self.tasks,
            cores=cores,
            delivered=self._delivered if spec.options.transactional else None,
        )
        self._slots = IntervalSlots(self.tasks)  # each interval's task
        # Local mode (one machine): a job's tasks claim their shares in a directory they all
        # see, each the one its process worked last (executor.claim_slot).
        self._claims = (
            files / "claims" if (spark.sparkContext.master or "").startswith("local") else None
        )
        self._slots_of: Mapping[int, int] | None = None  # the driver's spread they follow
        self._task_numbers: RDD[int] | None = None  # partition n: task n (see _run)
        self.quarantine = Quarantine(files)
        self.quarantine.load()
        # Cleared while a job warms the computation's Python workers as its query starts
        # (warm, run by the runner): the first batch waits for it, so that its tasks find
        # those workers idle and none starts a cold one beside them.
        self.warmed = threading.Event()
        self.warmed.set()
        # Set by the topology's query for one batch: the job that runs this computation's
        # first attempt beside the other computations' (TopologyBatch).
        self.shared_job: TopologyJob | None = None

    def _delivered(self, computation: str, interval: int) -> CommitTag | None:
        """The transaction marker of an interval a split or merge retires, its last owner's
        producer fenced (its sink made at the first rebalance: most runs have none)."""
        if self._transactions is None:
            settings = self.settings
            self._transactions = KafkaTransactionalSink(
                settings.config, settings.transaction_namespace
            )
        return self._transactions.open(computation, interval, self.spec.options.send_timeout)

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        try:
            self._handle(batch_id)
        except Exception as exc:
            if self.stopping.is_set():
                raise stopped_batch(self.spec.name, batch_id, exc) from None
            raise

    def _handle(self, batch_id: int) -> None:
        # The batch's DataFrame is never read: the offset log says what the batch holds, and
        # its tasks read that from Kafka themselves (see _run).
        started = time.monotonic()
        # A zombie stops before anything, a rebalance (which acquires intervals) included.
        fence_checkpoint(self.checkpoint, batch_id, self.spec.name, self.driver_id)
        consumed, previous, has_data = self._consumed(batch_id)
        # Kafka or Cassandra down (a restart, a network cut) is waited out, not a failure:
        # whatever a failed attempt committed is a duplicate for the next one.
        outage = Outage(
            f"computation {self.spec.name!r} batch {batch_id}",
            self.outage_timeout,
            reconnect=self.watermarks.reconnect,
        )
        plan = self.driver.begin(consumed, had_input=has_data, retry=outage.retry)
        bookkeeping = time.monotonic() - started
        batch_run = _BatchRun(batch_id, plan, has_data, outage, consumed, previous)
        try:
            rows, failures = self._attempt(batch_run)
        finally:
            self.leave_shared_job()  # the job need not wait for this batch's report
        self.driver.absorb(
            IntervalOutcome(
                row.interval,
                row.progress,
                records=row.counts.inputs,
                seconds=row.seconds,
                cpu_seconds=row.cpu_seconds,
                worker=row.worker,
            )
            for row in rows
        )
        reporting = time.monotonic()
        metrics: BatchMetrics | None = None
        if rows or failures:
            # Summed once: the report's totals take it now, the batch's metrics after it.
            metrics = replace(
                summarize(
                    self.spec.name,
                    batch_id,
                    (row.columns() for row in rows),
                    started,
                    failures,
                ),
                isolated=batch_run.isolated,
                isolation_runs=batch_run.sub_runs,
            )
            self._totals = self._totals.plus(metrics)
        # Nor publish a report for a batch the other driver has run past: stale, and on the
        # compacted topic it could outlive the newer report it follows.
        fence_checkpoint(self.checkpoint, batch_id, self.spec.name, self.driver_id)
        self._finish(batch_id, outage)
        bookkeeping += time.monotonic() - reporting
        if metrics is None:
            return  # nothing ran (only watermark reports came): no metrics
        self._record_metrics(batch_run, metrics, started, bookkeeping)

    def leave_shared_job(self) -> None:
        """Tell the topology's job, if any, that this computation has no part in it (if it
        submitted none)."""
        job, self.shared_job = self.shared_job, None
        if job is not None:
            job.leave(self.spec.name)

    def _consumed(
        self, batch_id: int
    ) -> tuple[dict[str, dict[int, int]], dict[str, dict[int, int]] | None, bool]:
        """The batch's end offsets from the query's offset log, the previous batch's (its
        start; ``None`` for the first), and whether it has input (the first batch of a run,
        or one whose data topics moved)."""
        checkpoint = self.checkpoint
        consumed = batch_offsets(checkpoint, batch_id)
        if consumed is None:
            raise TopologyError(
                f"the offset log of batch {batch_id} is missing from {checkpoint / 'offsets'}; "
                "was the checkpoint directory removed while the query ran?"
            )
        previous = batch_offsets(checkpoint, batch_id - 1) if batch_id > 0 else None
        has_data = previous is None or any(
            consumed.get(topic) != previous.get(topic) for topic in self.data_topics
        )
        return consumed, previous, has_data

    def _attempt(self, run: _BatchRun) -> tuple[list[ResultRow], list[str]]:
        """Run the batch (if it has input or ticks) until an attempt succeeds, isolating
        poison pills if it keeps failing: its interval rows, and what the failed attempts
        before it said."""
        self.warmed.wait()  # its tasks would otherwise queue behind the warming ones
        failures: list[str] = []
        try:
            return self._retried(run, failures), failures
        except Exception as exc:
            if not run.has_data or is_outage(exc) or _fenced(exc) or self.stopping.is_set():
                raise
            failure = exc
        self._isolate(run, failure)
        return self._retried(run, failures), failures

    def _retried(self, run: _BatchRun, failures: list[str]) -> list[ResultRow]:
        """The batch's rows once an attempt succeeded (``failures``: what those before it
        said); raises the last failure after ``attempts`` ones."""
        batch_id = run.batch_id
        failed = 0
        while run.has_data or run.plan.ticks:
            pause_point("driver.batch", self.spec.name)
            # A driver stopped for long (a zombie) must not take the intervals back from the
            # one that replaced it: retrying, it would acquire their sequencers anew.
            fence_checkpoint(self.checkpoint, batch_id, self.spec.name, self.driver_id)
            run.outage.attempting()
            try:
                return self._run(run, run.plan, self._quarantined(run))
            except Exception as exc:
                failures.append(short_error(exc))
                if self.stopping.is_set():
                    raise  # cancelled by the stop; the batch runs again on restart
                if is_outage(exc):
                    run.outage.wait(exc, failures[-1])
                    continue
                # A failed task (fenced, a crashed worker) left nothing half-applied for any
                # key; running the whole batch again is safe, its committed part being
                # duplicates now. Out of attempts, the query fails and its checkpoint stays
                # (or the caller looks for poison pills).
                failed += 1
                if failed >= self.attempts:
                    raise
                _log.warning(
                    "computation %r batch %d attempt %d/%d failed, retrying: %s",
                    self.spec.name,
                    batch_id,
                    failed,
                    self.attempts,
                    failures[-1],
                    exc_info=True,  # the traceback for the log file; the console shows a line
                )
                time.sleep(min(5.0, 0.5 * failed))
        return []

    def _quarantined(self, run: _BatchRun) -> dict[Position, str]:
        """The quarantined messages of the batch (by position), for its router."""
        if not self.quarantine.records:
            return {}
        # A partition the previous batch did not read is taken from offset 0: a superset.
        return self.quarantine.within(
            batch_ranges(run.consumed, run.previous or {}, self.data_topics)
        )

    def _ranges(self, run: _BatchRun) -> list[OffsetRange]:
        """The offset ranges of the batch's data topics: from where the previous batch ended;
        in the query's first batch, from where its Kafka source started it (its initial
        offsets in the checkpoint); for a partition no batch read before (one added since),
        from its earliest offset, where the Kafka source starts it."""
        if run.ranges is None:
            starts = run.previous
            if starts is None:
                starts = initial_offsets(self.checkpoint)
            unread = [
                (topic, partition)
                for topic in self.data_topics
                for partition in run.consumed.get(topic, {})
                if partition not in starts.get(topic, {})
            ]
            if unread:
                starts = self._earliest(starts, unread)
            run.ranges = batch_ranges(run.consumed, starts, self.data_topics)
        return run.ranges

    def _earliest(
        self, known: Mapping[str, Mapping[int, int]], unread: Sequence[tuple[str, int]]
    ) -> dict[str, dict[int, int]]:
        """``known`` starts, and the earliest offset Kafka keeps of each ``unread``
        partition."""
        starts = {topic: dict(partitions) for topic, partitions in known.items()}
        reader = offsets_consumer(self.settings.config)
        try:
            earliest = kafka_connector.start_offsets(
                reader, sorted({topic for topic, _ in unread}), _OFFSETS_TIMEOUT
            )
        finally:
            reader.close()
        for topic, partition in unread:
            starts.setdefault(topic, {})[partition] = earliest[topic][partition]
        return starts

    def _isolate(self, run: _BatchRun, failure: Exception) -> None:
        """Quarantine the messages that make the batch fail (see the class docstring), or
        raise: ``failure`` if the batch fails without its records, or no record fails
        alone; :class:`PoisonIsolationError` if too many do."""
        name, batch_id = self.spec.name, run.batch_id
        ranges = self._ranges(run)
        if not ranges:
            raise failure
        _log.warning(
            "computation %r batch %d failed %d times (%s); looking for the messages of its %d "
            "offsets that make it fail (poison pills), a control run first",
            name,
            batch_id,
            self.attempts,
            short_error(failure),
            count(ranges),
        )
        errors: list[tuple[tuple[OffsetRange, ...], Exception]] = []
        # Sub-runs fire no event-time timer the batch's input moves the watermark past: one
        # fired in a sub-run would miss the records of the halves run after it (a window
        # closed early, then fired again by its late records). The batch's final run fires
        # them after all of its records, as a batch always does.
        held = replace(run.plan, timer_watermark=run.plan.watermark)

        def fails(part: Sequence[OffsetRange] | None) -> bool:
            """Whether a sub-run of the batch on ``part`` (``None``: no records, ticks
            only) fails twice in a row; ``errors`` keeps what it said."""
            tries = 0
            while tries < _SUB_RUN_TRIES:
                fence_checkpoint(self.checkpoint, batch_id, name, self.driver_id)
                run.sub_runs += 1
                what = f"{count(part)} offsets" if part else "no records (the control)"
                try:
                    self._run(run, held, self._quarantined(run), records=part or [])
                except Exception as exc:
                    if _fenced(exc):
                        raise
                    if is_outage(exc):
                        run.outage.wait(exc, short_error(exc))
                        continue
                    errors.append((tuple(part or ()), exc))
                    tries += 1
                    _log.info(_SUB_RUN, name, batch_id, what, "failed")
                else:
                    _log.info(_SUB_RUN, name, batch_id, what, "ran through")
                    return False
            return True

        if fails(None):
            _log.warning(
                "computation %r batch %d fails without its records too: not a poison pill",
                name,
                batch_id,
            )
            raise failure
        found = isolate(ranges, fails)
        if found.too_many:
            raise PoisonIsolationError(
                f"computation {name!r} batch {batch_id} fails on more than {found.limit} of its "
                f"{count(ranges)} records alone (a batch isolates at most {MAX_ISOLATED}, and "
                "half of its records): taken for a bug or a broken worker rather than poison "
                f"pills, nothing was dead-lettered. Its error: {short_error(failure)}; fix the "
                "cause and restart (the batch runs again)"
            ) from failure
        if not found.poison:
            _log.warning(
                "computation %r batch %d: no message of it fails alone; not a poison pill",
                name,
                batch_id,
            )
            raise failure
        for position in found.poison:
            # What it said alone; if it never ran alone, what the batch said without the rest.
            alone = [exc for part, exc in errors if part == _alone(position)]
            self._quarantine(run, position, (alone or [errors[-1][1]])[-1])

    def _quarantine(self, run: _BatchRun, position: Position, error: Exception) -> None:
        record = QuarantinedRecord(
            topic=position.topic,
            partition=position.partition,
            offset=position.offset,
            computation=self.spec.name,
            batch_id=run.batch_id,
            quarantined_at=self.clock.now(),
            error=short_error(error),
            traceback=python_traceback(error),
        )
        self.quarantine.add(record)
        run.isolated += 1
        _log.warning(
            "computation %r: message %s/%d@%d made the engine fail in batch %d, isolated in "
            "%d sub-run(s); quarantined in %s, it becomes a PoisonRecordError dead letter: %s",
            self.spec.name,
            position.topic,
            position.partition,
            position.offset,
            run.batch_id,
            run.sub_runs,
            self.quarantine.directory,
            record.error,
        )

    def _finish(self, batch_id: int, outage: Outage) -> None:
        """Between batches: rebalance, then publish the computation's report."""
        if self.driver.finish(outage.retry) is not None:
            # The new intervals have run no batch yet: one without input finds their work.
            self.watermarks.wake_now()
        totals = self._totals
        stats = {
            **totals.counts(),
            "batches": totals.batches,
            "failed_attempts": totals.failed_attempts,
            "isolated": totals.isolated,
            "rebalances": self.driver.rebalances,
        }

        def report(sequence: int, offsets: Offsets) -> WatermarkReport | None:
            return self.driver.report(sequence, offsets, stats=stats, driver=self.driver_id or "")

        outage.retry(lambda: self.watermarks.after_batch(batch_id, report))

    def _record_metrics(
        self, run: _BatchRun, metrics: BatchMetrics, started: float, bookkeeping: float
    ) -> None:
        stalls = TransactionStalls()
        if self._stalls is not None:
            probed = self._stalls.probe()
            # Between probes the gauges keep the last one's levels; only a probe counts stalls.
            stalls = probed or replace(self._stalls.last, new=0)
        self.record(
            replace(
                metrics,
                # The batch's time includes publishing its report.
                seconds=time.monotonic() - started,
                stalls=stalls.new,
                stalled_partitions=stalls.stalled,
                stall_seconds=stalls.longest,
                unstable_messages=stalls.unstable,
                input_watermark=run.plan.timer_watermark,
                watermark=self.driver.watermarks.watermark,
                watermark_seconds=bookkeeping,
            )
        )

    def warm(self, upstream: Set[str] = frozenset()) -> dict[str, tuple[int, ...]]:
        """Read the watermark reports so far (:meth:`ComputationDriver.read_ahead
        <millstream.engine.driver.ComputationDriver.read_ahead>`) and make the connections of
        the Python workers that will run this computation's tasks, before its first batch
        needs them (:class:`.executor.WarmTask`): a job of its tasks, in its own workers
        (:func:`in_worker_pool`), which in local mode meet in a directory of their own so that
        each runs in a process of its own, and there take the intervals of the share each
        will work in the first batch (strong productions). ``upstream``: those of its input
        topics another computation of its query writes to, which its batches read ahead in.
        Returns the workers that ran it, as ``host:pid``, each with the intervals it took."""
        # The first batch then reads only the reports published since.
        self.driver.read_ahead()
        topics = tuple(self.data_topics)
        # Local mode: its tasks take the intervals of the first batch (WarmTask).
        layout = None if self._claims is None else self.driver.current_layout()
        with self._job_directory("warm-") as meet:
            task = WarmTask(
                self.spec,
                self.settings,
                topics,
                None if meet is None else str(meet),
                self.tasks,
                layout,
                self._task_slots(),
                tuple(sorted(upstream & set(topics))),
            )
            workers = self._job(task).collect()
        taken: dict[str, tuple[int, ...]] = {}
        for host, pid, intervals in workers:
            worker = f"{host}:{pid}"
            taken[worker] = tuple(sorted({*taken.get(worker, ()), *intervals}))
        return dict(sorted(taken.items()))

    @contextlib.contextmanager
    def _job_directory(self, prefix: str = "") -> Iterator[Path | None]:
        """A directory of one job's own in the computation's claims directory (local mode,
        else ``None``), where its tasks meet, removed once the job ended: a retry gets a
        fresh one."""
        directory = None if self._claims is None else self._claims / f"{prefix}{uuid.uuid4().hex}"
        try:
            yield directory
        finally:
            if directory is not None and directory.exists():
                shutil.rmtree(directory)

    def _job(self, task: Callable[[int, Iterable[object]], Iterator[_T]]) -> RDD[_T]:
        """The RDD of ``task`` on task numbers ``range(self.tasks)`` (partition ``n``: task
        ``n``), in this computation's Python workers."""
        if self._task_numbers is None:  # made once: each job adds its own step
            self._task_numbers = self.spark.sparkContext.parallelize(range(self.tasks), self.tasks)
        rdd = self._task_numbers.mapPartitionsWithIndex(task)
        if self._claims is not None:
            in_worker_pool(rdd, self.worker_pool or 0)
        return rdd

    def _task_slots(self) -> IntervalSlots:
        """Each interval's task, as the driver last spread them."""
        assignment = self.driver.assignment
        if assignment is not self._slots_of:
            self._slots = IntervalSlots(self.tasks, assignment)
            self._slots_of = assignment
        return self._slots

    def _run(
        self,
        run: _BatchRun,
        plan: BatchPlan,
        quarantine: Mapping[Position, str],
        records: Sequence[OffsetRange] | None = None,
    ) -> list[ResultRow]:
        """Run the batch, or a sub-run of it: only its ``records`` (if given), with its
        ticks only if it has no records (an isolation's control, or the whole batch).

        One Spark job of one stage: a task per core, each reading the batch's ranges from
        Kafka itself and working its share of the intervals (:func:`.executor.batch_task`),
        on an RDD of the task numbers. The batch's own DataFrame is never read: routing rows
        through Spark's shuffle cost a second stage, and each row two crossings between the
        JVM and Python. In a topology's query, a computation's first attempt at the whole
        batch is its part of the batch's one job (:class:`TopologyJob`); retries and sub-runs
        are jobs of its own."""
        ticks = tuple(plan.ticks) if not records else ()
        whole = records is None
        if records is None:
            records = self._ranges(run) if run.has_data else []
        with self._job_directory() as claims:
            batch = BatchInput(
                ranges=tuple(records),
                ticks=ticks,
                slots=self._task_slots(),
                quarantine=quarantine,
                claims=None if claims is None else str(claims),
                ends={
                    (topic, partition): end
                    for topic in self.data_topics
                    for partition, end in run.consumed.get(topic, {}).items()
                },
            )
            task = batch_task(
                self.spec, self.settings, plan.watermark, plan.timer_watermark, plan.layout, batch
            )
            if whole and self.shared_job is not None:
                job, self.shared_job = self.shared_job, None
                collected = job.submit(self.spec.name, self.tasks, task)
            else:
                collected = self._job(task).collect()
        return [ResultRow.of(row) for row in collected]


class TopologyBatch:
    """The ``foreachBatch`` function of a topology's one query (``RunSettings.one_query``):
    each computation's :class:`BatchHandler` on the batch, at once, a thread each, and
    their first attempts as one Spark job (:class:`TopologyJob`), run on the batch's thread.

    Each handler reads its own topics' ranges from the shared offset log, and the job runs
    the computations upstream first, each reading past its planned ranges what its upstream
    just committed in the same task (:func:`~millstream.spark.executor.topology_task`): a
    pipeline's record passes its stages in the batch that read it, where a query per
    computation has a record wait, at each stage, for the batch the next query is running
    and then for one of its own. The batch ends when every
    handler has; if any failed, the batch fails with the first error (in the computations'
    order) once the others are done, and the query stops, as a computation's own query
    does: a restart replays the batch, in which what the others committed is duplicates.
    The threads take the batch thread's Spark job properties
    (``inheritable_thread_target``), so stopping the query cancels their jobs too.
    """

    def __init__(self, handlers: Sequence[BatchHandler]) -> None:
        if not handlers:
            raise TopologyError("a topology's query needs at least one computation")
        self.handlers = tuple(handlers)
        self._numbers: dict[int, RDD[int]] = {}  # by width: each job adds its own step

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        if len(self.handlers) == 1:
            self.handlers[0](batch, batch_id)
            return
        from pyspark import inheritable_thread_target

        errors: list[BaseException | None] = [None] * len(self.handlers)
        inheriting = inheritable_thread_target(self.handlers[0].spark)
        job = TopologyJob([handler.spec.name for handler in self.handlers])
        for handler in self.handlers:
            handler.shared_job = job

        def run(n: int) -> None:
            handler = self.handlers[n]
            try:
                handler(batch, batch_id)
            except BaseException as exc:  # raised below, on the query's thread
                errors[n] = exc
            finally:
                handler.leave_shared_job()  # if it had not (it failed before its part)

        threads = [
            threading.Thread(
                target=inheriting(partial(run, n)),
                name=f"millstream-batch-{handler.spec.name}",
                daemon=True,
            )
            for n, handler in enumerate(self.handlers)
        ]
        for thread in threads:
            thread.start()
        try:
            job.run(self._task_numbers)
        except Exception as exc:
            if any(handler.stopping.is_set() for handler in self.handlers):
                raise stopped_batch("the topology", batch_id, exc) from None
            raise
        finally:
            for thread in threads:
                thread.join()
        failed = [(h, e) for h, e in zip(self.handlers, errors, strict=True) if e is not None]
        for handler, error in failed[1:]:
            _log.error(
                "computation %r batch %d failed too: %s",
                handler.spec.name,
                batch_id,
                short_error(error),
                exc_info=error,
            )
        if failed:
            raise failed[0][1]

    def _task_numbers(self, width: int) -> RDD[int]:
        """An RDD of ``range(width)`` in ``width`` partitions: partition ``n`` is task ``n``."""
        numbers = self._numbers.get(width)
        if numbers is None:
            spark = self.handlers[0].spark
            numbers = spark.sparkContext.parallelize(range(width), width)
            self._numbers[width] = numbers
        return numbers


class TopologyPartError(RuntimeError):
    """A computation's part of a topology's job (:class:`TopologyJob`) raised: the message
    holds the Python traceback from the executor, where the error was raised."""


class _Part:
    """A computation's part of a :class:`TopologyJob`: how many tasks it has, what each
    runs (a :class:`~millstream.spark.executor.BatchTask`) and where its rows go."""

    def __init__(
        self,
        computation: str,
        tasks: int,
        task: BatchTask,
    ) -> None:
        self.computation = computation
        self.tasks = tasks
        self.task = task
        self.rows: Future[list[dict[str, Any]]] = Future()


class TopologyJob:
    """A batch of a topology's query as one Spark job: each computation's first attempt at
    the batch is a part of it (:meth:`submit`), and task ``n`` works every computation's
    share ``n``, in one Python worker (:func:`~.executor.topology_task`).

    A job per computation made a three-stage pipeline's batch three jobs of two tasks each
    on two cores: three waves, each task paying its start in a Python worker, and a stage's
    latency waited for all of them. One job is one wave, its tasks as long as the parts'
    work.

    The job starts once every computation has submitted its part or left (:meth:`leave`:
    it has nothing to run, or failed before its part); the batch's thread runs it
    (:meth:`run`). A part that raises fails that computation's attempt alone: the error goes
    back to its handler as :class:`TopologyPartError`, Python traceback and all, and the
    handler retries in jobs of its own, as a computation's own query does; the other parts
    are done. A job that fails as a whole (a Python worker lost, the query stopped) fails
    every part with its error. ``computations``: the handlers that take part, by name.
    """

    def __init__(self, computations: Sequence[str]) -> None:
        self._ready = threading.Condition()
        self._waiting = set(computations)
        self._parts: list[_Part] = []

    def submit(
        self,
        computation: str,
        tasks: int,
        task: BatchTask,
    ) -> list[dict[str, Any]]:
        """Add ``computation``'s part (``tasks`` tasks, task ``n`` ``task.start(n)``) and wait
        for its rows; raises what the part or the job raised."""
        part = _Part(computation, tasks, task)
        with self._ready:
            if computation not in self._waiting:
                raise RuntimeError(f"computation {computation!r} is no party to this job")
            self._waiting.discard(computation)
            self._parts.append(part)
            self._ready.notify_all()
        return part.rows.result()

    def leave(self, computation: str) -> None:
        """``computation`` has no part in the job (nothing if it submitted one)."""
        with self._ready:
            self._waiting.discard(computation)
            self._ready.notify_all()

    def run(self, task_numbers: Callable[[int], RDD[int]]) -> None:
        """Once every computation submitted or left, run the parts as one job on
        ``task_numbers(width)`` and hand each part its rows or its error."""
        from millstream.spark.executor import topology_task

        with self._ready:
            self._ready.wait_for(lambda: not self._waiting)
            parts = tuple(self._parts)
        if not parts:
            return
        try:
            width = max(part.tasks for part in parts)
            function = topology_task(tuple((part.tasks, part.task) for part in parts))
            rdd = task_numbers(width).mapPartitionsWithIndex(function)
            in_worker_pool(rdd, 0)  # Spark's default set, whatever another thread sets
            collected = rdd.collect()
        except BaseException as exc:
            for part in parts:
                part.rows.set_exception(exc)
            if isinstance(exc, Exception):
                return  # each part's handler has it
            raise
        rows: list[list[dict[str, Any]]] = [[] for _ in parts]
        errors: list[str | None] = [None] * len(parts)
        for number, task, part_rows, error in collected:
            if part_rows is None:
                errors[number] = errors[number] or f"task {task}:\n{error}"
            else:
                rows[number].extend(part_rows)
        for part, found, error in zip(parts, rows, errors, strict=True):
            if error is None:
                part.rows.set_result(found)
            else:
                part.rows.set_exception(
                    TopologyPartError(
                        f"computation {part.computation!r}, its part of the topology's job, "
                        f"failed in {error}"
                    )
                )


class _BatchRun:
    """One micro-batch as the handler runs it: its data, plan and ranges, and what isolating
    poison pills in it took."""

    def __init__(
        self,
        batch_id: int,
        plan: BatchPlan,
        has_data: bool,
        outage: Outage,
        consumed: dict[str, dict[int, int]],
        previous: dict[str, dict[int, int]] | None,
    ) -> None:
        self.batch_id = batch_id
        self.plan = plan
        self.has_data = has_data
        self.outage = outage
        self.consumed = consumed
        self.previous = previous
        self.ranges: list[OffsetRange] | None = None  # read when needed
        self.isolated = 0
        self.sub_runs = 0


def _alone(position: Position) -> tuple[OffsetRange, ...]:
    """The ranges of a sub-run of ``position`` alone."""
    return (OffsetRange(position.topic, position.partition, position.offset, position.offset + 1),)


def _fenced(exc: BaseException) -> bool:
    """Whether a failure says another driver or task took over (a zombie's fence), which
    isolating poison pills must not second-guess."""
    text = f"{type(exc).__name__}: {exc}"
    return (
        isinstance(exc, FencedError)
        or lost_checkpoint_race(exc)
        or any(fence in text for fence in _FENCES)
    )


class BatchStoppedError(MillstreamError):
    """A batch cut short by the stop of its query (Spark cancelled its job); it runs again
    on restart, its committed part as duplicates."""


def stopped_batch(computation: str, batch_id: int, exc: BaseException) -> BatchStoppedError:
    """What a ``foreachBatch`` function raises to Spark for a batch its query's stop cut
    short, instead of ``exc`` (raise it ``from None``): ``exc`` without its stack, by which
    Spark knows its stop (a cancelled job of the query, or the Py4J error of an interrupted
    call).

    Spark tells a stop from a failure by the text of the error the function raised (through
    Py4J: the whole Python traceback, a Py4J error's pages of JVM stack included), with a
    regular expression (``StreamExecution.PROXY_ERROR``) that recurses once per character
    of it: on that text it overflowed the stack of the query's thread, which printed a
    ``StackOverflowError`` and left the query without taking the stop for one."""
    lines: list[str] = []
    for line in str(exc).splitlines():
        if line.lstrip().startswith("at "):
            break  # a JVM stack frame: the rest is stack
        lines.append(line)
    error = f"{type(exc).__module__}.{type(exc).__qualname__}: " + "\n".join(lines)
    return BatchStoppedError(
        f"batch {batch_id} of {computation!r} was cut short by the stop of its query: "
        f"{error[:_STOPPED_ERROR_CHARS]}"
    )


_STOPPED_ERROR_CHARS: Final = 500
"""The most of a stopped batch's error that :func:`stopped_batch` keeps: Spark's regular
expression recurses over it on the query thread's stack (1 MiB: some thousand characters)."""


def short_error(exc: BaseException) -> str:
    """The line of a failed attempt's error that says what went wrong.

    Py4J wraps a failed Python task in pages of JVM stack: the Python error is the last
    ``Name: message`` line of a Python traceback in it, else the first line naming an error
    that is not a stack frame.
    """
    text = str(exc)
    lines = text.splitlines()
    traceback = max((n for n, line in enumerate(lines) if "Traceback" in line), default=0)
    python = [line.strip() for line in lines[traceback:] if _ERROR_LINE.match(line.strip())]
    named = [
        line.strip()
        for line in lines
        if ("Error" in line or "Exception" in line) and not line.strip().startswith("at ")
    ]
    found = python[-1] if python else named[0] if named else text
    return f"{type(exc).__name__}: {found[:500]}"
