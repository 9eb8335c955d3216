"""The ``foreachBatch`` function of a computation's query: one micro-batch, on the driver.

Per batch the handler reads the batch's end offsets from the query's offset log, applies the
watermark reports those offsets have caught up with (:class:`DriverWatermarks`), runs the
Spark job that routes the input and works each key interval (:mod:`.executor`), and records
the interval rows as the batch's :class:`~millstream.spark.metrics.BatchMetrics`. A
failed job is run again, up to ``attempts`` times, and for as long as an outage of Kafka or
Cassandra lasts (up to ``outage_timeout``): whatever a failed attempt committed is a duplicate
the next attempt drops.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Final

from millstream.connectors import kafka as kafka_connector
from millstream.engine.clock import Clock
from millstream.engine.driver import BatchPlan, ComputationDriver, IntervalOutcome
from millstream.engine.errors import TopologyError
from millstream.engine.outages import DEFAULT_OUTAGE_TIMEOUT, Outage, is_outage
from millstream.engine.pause_points import pause_point
from millstream.engine.store import IntervalStore
from millstream.engine.topology import ComputationSpec
from millstream.spark.checkpoint import batch_offsets, fence_checkpoint
from millstream.spark.driver_watermarks import DriverWatermarks
from millstream.spark.executor import (
    ROUTED_SCHEMA,
    IntervalSlots,
    TaskSettings,
    interval_task,
    router,
    tick_rows,
)
from millstream.spark.metrics import RESULT_SCHEMA, BatchMetrics, ResultRow, summarize

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "BatchHandler",
    "batch_offsets",
    "fence_checkpoint",
    "short_error",
]

_log = logging.getLogger(__name__)

_ERROR_LINE: Final = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b.*")


class BatchHandler:
    """The ``foreachBatch`` function of one computation's query (runs on the driver).

    ``checkpoint`` is the query's checkpoint directory (its offset log tells each batch's
    range) and ``driver`` the id this driver claimed it with (:mod:`.checkpoint`): a batch
    stops at once when another driver claimed it since. ``record`` receives the metrics of
    every batch that ran anything. A batch whose attempt fails for another reason than an
    outage is tried ``attempts`` times; an outage of Kafka or Cassandra
    (:mod:`millstream.engine.outages`) is waited out, for up to ``outage_timeout`` seconds.
    ``layout_store`` gives the driver's own store (the runner's Cassandra session) for the
    layout: reading it, and splitting and merging intervals.

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
    ):
        self.spec = spec
        self.layout_store = layout_store
        self.spark = spark
        self.settings = settings
        self.watermarks = watermarks
        self.checkpoint = checkpoint
        self.driver_id = driver
        self.attempts = attempts
        self.outage_timeout = outage_timeout
        self.clock = clock
        self.record = record
        self.data_topics = sorted({kafka_connector.stream_topic(i.stream) for i in spec.inputs})
        # One interval task per core, each running its share of the intervals in one Python
        # call: a wave of tasks, not one Python round trip per interval.
        cores = spark.sparkContext.defaultParallelism
        rebalanced = spec.options.rebalance is not None
        self.tasks = max(1, cores if rebalanced else min(spec.options.key_intervals, cores))
        # The computation's key intervals are read from the store at the first batch.
        self.driver = ComputationDriver(
            spec,
            watermarks.state,
            watermarks.reader,
            layout_store=layout_store,
            clock=clock,
            tasks=self.tasks,
        )
        self._slots = IntervalSlots(self.tasks)  # each interval's task
        self._slots_of: Mapping[int, int] | None = None  # the driver's spread they follow

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        # A zombie stops before anything, a rebalance (which acquires intervals) included.
        fence_checkpoint(self.checkpoint, batch_id, self.spec.name, self.driver_id)
        consumed, has_data = self._consumed(batch_id)
        # Kafka or Cassandra down (a restart, a network cut) is waited out, not a failure:
        # whatever a failed attempt committed is a duplicate for the next one.
        outage = Outage(
            f"computation {self.spec.name!r} batch {batch_id}",
            self.outage_timeout,
            reconnect=self.watermarks.reconnect,
        )
        plan = self.driver.begin(consumed, had_input=has_data, retry=outage.retry)
        bookkeeping = time.monotonic() - started
        rows, failures = self._attempt(batch, batch_id, plan, has_data, outage)
        self.driver.absorb(
            IntervalOutcome(
                row.interval,
                row.progress,
                records=row.counts.inputs,
                seconds=row.seconds,
                cpu_seconds=row.cpu_seconds,
            )
            for row in rows
        )
        reporting = time.monotonic()
        # Nor publish a report for a batch the other driver has run past: stale, and on the
        # compacted topic it could outlive the newer report it follows.
        fence_checkpoint(self.checkpoint, batch_id, self.spec.name, self.driver_id)
        self._finish(batch_id, outage)
        bookkeeping += time.monotonic() - reporting
        if not rows and not failures:
            return  # nothing ran (only watermark reports came): no metrics
        self._record_metrics(batch_id, rows, failures, plan, started, bookkeeping)

    def _consumed(self, batch_id: int) -> tuple[dict[str, dict[int, int]], bool]:
        """The batch's end offsets from the query's offset log, and whether it has input
        (the first batch of a run, or one whose data topics moved)."""
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
        return consumed, has_data

    def _attempt(
        self, batch: DataFrame, batch_id: int, plan: BatchPlan, has_data: bool, outage: Outage
    ) -> tuple[list[ResultRow], list[str]]:
        """Run the batch (if it has input or ticks) until an attempt succeeds: its interval
        rows, and what the failed attempts before it said."""
        failures: list[str] = []
        failed = 0
        while has_data or plan.ticks:
            pause_point("driver.batch", self.spec.name)
            # A driver stopped for long (a zombie) must not take the intervals back from the
            # one that replaced it: retrying, it would acquire their sequencers anew.
            fence_checkpoint(self.checkpoint, batch_id, self.spec.name, self.driver_id)
            try:
                return self._run(batch, plan), failures
            except Exception as exc:
                failures.append(short_error(exc))
                if is_outage(exc):
                    outage.wait(exc, failures[-1])
                    continue
                # A failed task (fenced, a crashed worker) left nothing half-applied for any
                # key; running the whole batch again is safe, its committed part being
                # duplicates now. Out of attempts, the query fails and its checkpoint stays.
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
        return [], failures

    def _finish(self, batch_id: int, outage: Outage) -> None:
        """Between batches: rebalance, then publish the computation's report."""
        if self.driver.finish(outage.retry) is not None:
            # The new intervals have run no batch yet: one without input finds their work.
            self.watermarks.wake_now()
        outage.retry(lambda: self.watermarks.after_batch(batch_id, self.driver.report))

    def _record_metrics(
        self,
        batch_id: int,
        rows: list[ResultRow],
        failures: list[str],
        plan: BatchPlan,
        started: float,
        bookkeeping: float,
    ) -> None:
        counts = (row.counts.counts() for row in rows)
        metrics = summarize(self.spec.name, batch_id, counts, started, failures)
        self.record(
            replace(
                metrics,
                input_watermark=plan.timer_watermark,
                watermark=self.driver.watermarks.watermark,
                watermark_seconds=bookkeeping,
            )
        )

    def _task_slots(self) -> IntervalSlots:
        """Each interval's task, as the driver last spread them."""
        assignment = self.driver.assignment
        if assignment is not self._slots_of:
            self._slots = IntervalSlots(self.tasks, assignment)
            self._slots_of = assignment
        return self._slots

    def _run(self, batch: DataFrame, plan: BatchPlan) -> list[ResultRow]:
        from pyspark.sql import functions as F  # noqa: N812  (pyspark's convention)

        slots = self._task_slots()
        # Wake-up messages only started the batch.
        routed = batch.where(F.col("topic").isin(self.data_topics))
        routed = routed.mapInArrow(router(self.spec, plan.layout, slots), ROUTED_SCHEMA)
        if plan.ticks:
            ticking = self.spark.createDataFrame(tick_rows(plan.ticks, slots), ROUTED_SCHEMA)
            routed = routed.unionByName(ticking)
        # An explicit partition count: adaptive execution would otherwise coalesce the few
        # small shuffle partitions of a micro-batch into one task and leave cores idle.
        task = interval_task(
            self.spec, self.settings, plan.watermark, plan.timer_watermark, plan.layout
        )
        collected = routed.repartition(self.tasks, "slot").mapInArrow(task, RESULT_SCHEMA).collect()
        return [ResultRow.of(row.asDict()) for row in collected]


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
