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

import json
import logging
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from millstream.connectors import kafka as kafka_connector
from millstream.engine.clock import Clock
from millstream.engine.errors import FencedError, TopologyError
from millstream.engine.layout import IntervalLayout
from millstream.engine.outages import DEFAULT_OUTAGE_TIMEOUT, Outage, is_outage
from millstream.engine.pause_points import pause_point
from millstream.engine.rebalance import assign_slots, begin, finish_change, load_shares, plan
from millstream.engine.store import IntervalStore
from millstream.engine.topology import ComputationSpec
from millstream.engine.watermarks import IntervalProgress
from millstream.spark.driver_watermarks import DriverWatermarks
from millstream.spark.executor import (
    ROUTED_SCHEMA,
    IntervalSlots,
    TaskSettings,
    interval_task,
    router,
    tick_rows,
)
from millstream.spark.metrics import RESULT_SCHEMA, BatchMetrics, summarize

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
    range); ``record`` receives the metrics of every batch that ran anything. A batch whose
    attempt fails for another reason than an outage is tried ``attempts`` times; an outage
    of Kafka or Cassandra (:mod:`millstream.engine.outages`) is waited out, for up to
    ``outage_timeout`` seconds. ``layout_store`` gives the driver's own store (the runner's
    Cassandra session) for the layout: reading it, and splitting and merging intervals.
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
    ):
        self.spec = spec
        self.layout_store = layout_store
        self.spark = spark
        self.settings = settings
        self.watermarks = watermarks
        self.checkpoint = checkpoint
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
        self._slots = IntervalSlots(self.tasks)  # each interval's task
        # The computation's key intervals, read from the store at the first batch.
        self.layout: IntervalLayout | None = None
        self._assignment: dict[int, int] | None = None
        self.rebalances = 0

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
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
        # Kafka or Cassandra down (a restart, a network cut) is waited out, not a failure:
        # whatever a failed attempt committed is a duplicate for the next one.
        outage = Outage(
            f"computation {self.spec.name!r} batch {batch_id}",
            self.outage_timeout,
            reconnect=self.watermarks.reconnect,
        )
        state = self.watermarks.state
        if self.layout is None:
            self.layout = outage.retry(self._current_layout)
        outage.retry(lambda: state.read(self.watermarks.reader))
        watermark, timer_watermark = state.advance(consumed)
        ticks = state.intervals_to_run(timer_watermark, self.clock.now())
        bookkeeping = time.monotonic() - started
        failures: list[str] = []
        rows: list[Any] = []
        failed = 0
        while has_data or ticks:
            pause_point("driver.batch", self.spec.name)
            # A driver stopped for long (a zombie) must not take the intervals back from the
            # one that replaced it: retrying, it would acquire their sequencers anew.
            fence_checkpoint(checkpoint, batch_id, self.spec.name)
            try:
                rows = self._run(batch, ticks, watermark, timer_watermark)
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
                )
                time.sleep(min(5.0, 0.5 * failed))
                continue
            break
        for row in rows:
            state.record(
                int(row["interval"]),
                IntervalProgress(
                    oldest_work=row["oldest_work"],
                    next_event_timer=row["next_event_timer"],
                    next_wall_timer=row["next_wall_timer"],
                    pending=int(row["pending"]),
                ),
                # A batch of ticks alone says nothing of the intervals' load.
                records=int(row["inputs"]) if has_data else None,
                seconds=float(row["seconds"]),
                cpu_seconds=float(row["cpu_seconds"]),
            )
        if has_data and rows:
            state.intervals.idle_except(int(row["interval"]) for row in rows)
        reporting = time.monotonic()
        # Nor publish a report for a batch the other driver has run past: stale, and on the
        # compacted topic it could outlive the newer report it follows.
        fence_checkpoint(checkpoint, batch_id, self.spec.name)
        if self.spec.options.rebalance is not None and rows:
            self._rebalance(outage)
        outage.retry(lambda: self.watermarks.after_batch(batch_id))
        bookkeeping += time.monotonic() - reporting
        if not rows and not failures:
            return  # nothing ran (only watermark reports came): no metrics
        metrics = summarize(self.spec.name, batch_id, (r.asDict() for r in rows), started, failures)
        self.record(
            replace(
                metrics,
                input_watermark=timer_watermark,
                watermark=state.watermark,
                watermark_seconds=bookkeeping,
            )
        )

    def _current_layout(self) -> IntervalLayout:
        """The computation's layout, a change a killed driver left journaled finished."""
        store = self.layout_store()
        layout = store.layout(self.spec.name, self.spec.options.key_intervals)
        if layout.change is not None:
            _log.info("computation %r: finishing a %s", self.spec.name, layout.change.kind)
            layout = finish_change(
                store, self.spec.name, layout, dedup_ttl=self.spec.options.dedup_ttl
            )
        self.watermarks.state.intervals.track(layout.ids)
        return layout

    def _rebalance(self, outage: Outage) -> None:
        """Split or merge one interval if the latest loads ask for it (between batches: no
        task of this computation runs), and spread the intervals over the tasks by load."""
        policy = self.spec.options.rebalance
        layout = self.layout
        assert policy is not None
        assert layout is not None
        intervals = self.watermarks.state.intervals
        records = intervals.records()
        # One change per measurement: the next waits for a batch with input under this one.
        begun = (
            plan(layout, records, policy, intervals.cpu_seconds()) if intervals.measured else None
        )
        if begun is not None and begun.change is not None:
            change = begun.change
            store = self.layout_store()
            outage.retry(lambda: _journal(store, self.spec.name, layout, begun))
            self.layout = begun
            self.layout = outage.retry(
                lambda: finish_change(
                    store, self.spec.name, begun, dedup_ttl=self.spec.options.dedup_ttl
                )
            )
            targets = [target[0] for target in change.targets]
            intervals.replace(change.sources, targets, carry_load=True)
            self.rebalances += 1
            _log.info(
                "computation %r: %s of intervals %s into %s (records per batch: %s)",
                self.spec.name,
                change.kind,
                list(change.sources),
                targets,
                [records.get(s, 0) for s in change.sources],
            )
            # The new intervals have run no batch yet: one without input finds their work.
            self.watermarks.wake_now()
        assert self.layout is not None
        self._spread(
            load_shares(self.layout.ids, intervals.records(), policy, intervals.cpu_seconds())
        )

    def _spread(self, shares: Mapping[int, float]) -> None:
        layout = self.layout
        assert layout is not None
        current = self._assignment or {i: i % self.tasks for i in layout.ids}
        loads = [0.0] * self.tasks
        for interval in layout.ids:
            loads[current.get(interval, interval % self.tasks)] += shares.get(interval, 0.0)
        balanced = assign_slots(layout.ids, shares, self.tasks)
        best = [0.0] * self.tasks
        for interval, slot in balanced.items():
            best[slot] += shares.get(interval, 0.0)
        # Moving intervals costs their tasks' cached state: only for a clear gain.
        if set(current) != set(layout.ids) or max(best) < 0.8 * max(loads):
            self._assignment = balanced
            self._slots = IntervalSlots(self.tasks, balanced)

    def _run(
        self, batch: DataFrame, ticks: list[int], watermark: int, timer_watermark: int
    ) -> list[Any]:
        from pyspark.sql import functions as F  # noqa: N812  (pyspark's convention)

        # Wake-up messages only started the batch.
        routed = batch.where(F.col("topic").isin(self.data_topics))
        routed = routed.mapInArrow(router(self.spec, self.layout, self._slots), ROUTED_SCHEMA)
        if ticks:
            ticking = self.spark.createDataFrame(tick_rows(ticks, self._slots), ROUTED_SCHEMA)
            routed = routed.unionByName(ticking)
        # An explicit partition count: adaptive execution would otherwise coalesce the few
        # small shuffle partitions of a micro-batch into one task and leave cores idle.
        return (
            routed.repartition(self.tasks, "slot")
            .mapInArrow(
                interval_task(self.spec, self.settings, watermark, timer_watermark, self.layout),
                RESULT_SCHEMA,
            )
            .collect()
        )


def _journal(
    store: IntervalStore, computation: str, layout: IntervalLayout, begun: IntervalLayout
) -> None:
    """Journal ``begun``'s change; an earlier attempt whose outcome was unknown may have."""
    if not store.write_layout(computation, begun, layout) and (
        store.read_layout(computation) != begun
    ):
        begin(store, computation, layout, begun)  # raises: another driver changed it


def fence_checkpoint(checkpoint: Path, batch_id: int, computation: str) -> None:
    """Raise :class:`~millstream.engine.errors.FencedError` if another driver has taken the
    query's checkpoint past ``batch_id``: it logged the next batch's offsets or committed
    this one, which the driver running ``batch_id`` never does itself before it returns.

    Spark's own fence (two writers of one batch's log entry) acts only when a zombie writes
    its next entry, after its ``foreachBatch`` ran; this stops it before.
    """
    if (checkpoint / "offsets" / str(batch_id + 1)).exists() or (
        checkpoint / "commits" / str(batch_id)
    ).exists():
        raise FencedError(
            f"another driver runs computation {computation!r}: its checkpoint {checkpoint} "
            f"has moved past batch {batch_id}, which this driver was running; this driver is "
            "a zombie (it was stopped or cut off) and stops, leaving the work to the other"
        )


def batch_offsets(checkpoint: Path, batch_id: int) -> dict[str, dict[int, int]] | None:
    """The Kafka end offsets of a batch, from the query's offset log (``None``: no entry).

    The log is Spark's write-ahead record of each batch's range: a version line, a metadata
    line, then one JSON line per source (``{"topic": {"partition": offset}}``).
    """
    file = checkpoint / "offsets" / str(batch_id)
    try:
        lines = file.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return None
    if len(lines) < 3 or not lines[0].startswith("v"):
        raise TopologyError(
            f"cannot read Spark's offset log entry {file}: unexpected layout {lines[:1]!r}; "
            "this Spark version is not supported by millstream"
        )
    offsets: dict[str, dict[int, int]] = {}
    for line in lines[2:]:
        if line.strip() in ("", "-"):
            continue
        try:
            for topic, partitions in json.loads(line).items():
                offsets.setdefault(topic, {}).update(
                    {int(p): int(o) for p, o in partitions.items()}
                )
        except (ValueError, AttributeError) as exc:
            raise TopologyError(f"cannot read Spark's offset log entry {file}: {exc}") from exc
    return offsets


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
