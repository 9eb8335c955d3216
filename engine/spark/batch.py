"""The ``foreachBatch`` function of a computation's query: one micro-batch, on the driver.

Per batch the handler reads the batch's end offsets from the query's offset log, applies the
watermark reports those offsets have caught up with (:class:`DriverWatermarks`), runs the
Spark job that routes the input and works each key interval (:mod:`.executor`), and records
the interval rows as the batch's :class:`~millstream.engine.spark.metrics.BatchMetrics`. A
failed job is run again, up to ``attempts`` times: whatever a failed attempt committed is a
duplicate the next attempt drops.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from millstream.connectors import kafka as kafka_connector
from millstream.engine.clock import Clock
from millstream.engine.errors import TopologyError
from millstream.engine.spark.driver_watermarks import DriverWatermarks
from millstream.engine.spark.executor import (
    ROUTED_SCHEMA,
    TaskSettings,
    interval_task,
    router,
    tick_rows,
)
from millstream.engine.spark.metrics import RESULT_SCHEMA, BatchMetrics, summarize
from millstream.engine.topology import ComputationSpec
from millstream.engine.watermarks import IntervalProgress

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["BatchHandler", "batch_offsets", "short_error"]

_log = logging.getLogger(__name__)


class BatchHandler:
    """The ``foreachBatch`` function of one computation's query (runs on the driver).

    ``checkpoint`` is the query's checkpoint directory (its offset log tells each batch's
    range); ``record`` receives the metrics of every batch that ran anything.
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
    ):
        self.spec = spec
        self.spark = spark
        self.settings = settings
        self.watermarks = watermarks
        self.checkpoint = checkpoint
        self.attempts = attempts
        self.clock = clock
        self.record = record
        self.data_topics = sorted({kafka_connector.stream_topic(i.stream) for i in spec.inputs})
        # One interval task per core, each running its share of the intervals in one Python
        # call: a wave of tasks, not one Python round trip per interval.
        cores = spark.sparkContext.defaultParallelism
        self.tasks = max(1, min(spec.options.key_intervals, cores))
        self._slots: Any = None  # the interval → shuffle partition column, made on first use

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
        state = self.watermarks.state
        state.read(self.watermarks.reader)
        watermark, timer_watermark = state.advance(consumed)
        ticks = state.intervals_to_run(timer_watermark, self.clock.now())
        bookkeeping = time.monotonic() - started
        failures: list[str] = []
        rows: list[Any] = []
        attempts = self.attempts
        for attempt in range(1, attempts + 1):
            if not has_data and not ticks:
                break
            try:
                rows = self._run(batch, ticks, watermark, timer_watermark)
            except Exception as exc:
                # A failed task (fenced, store or Kafka trouble) left nothing half-applied for
                # any key; running the whole batch again is safe, its committed part being
                # duplicates now. Out of attempts, the query fails and its checkpoint stays.
                if attempt == attempts:
                    raise
                failures.append(short_error(exc))
                _log.warning(
                    "computation %r batch %d attempt %d/%d failed, retrying: %s",
                    self.spec.name,
                    batch_id,
                    attempt,
                    attempts,
                    failures[-1],
                )
                time.sleep(min(5.0, 0.5 * attempt))
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
            )
        reporting = time.monotonic()
        self.watermarks.after_batch(batch_id)
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

    def _run(
        self, batch: DataFrame, ticks: list[int], watermark: int, timer_watermark: int
    ) -> list[Any]:
        from pyspark.sql import functions as F  # noqa: N812  (pyspark's convention)

        # Wake-up messages only started the batch.
        routed = batch.where(F.col("topic").isin(self.data_topics))
        routed = routed.mapInArrow(router(self.spec), ROUTED_SCHEMA)
        if ticks:
            routed = routed.unionByName(self.spark.createDataFrame(tick_rows(ticks), ROUTED_SCHEMA))
        # An explicit partition count: adaptive execution would otherwise coalesce the few
        # small shuffle partitions of a micro-batch into one task and leave cores idle.
        return (
            routed.repartition(self.tasks, self._slot_column())
            .mapInArrow(
                interval_task(self.spec, self.settings, watermark, timer_watermark),
                RESULT_SCHEMA,
            )
            .collect()
        )

    def _slot_column(self) -> Any:
        """A column that sends interval ``i`` to shuffle partition ``i mod tasks``.

        Hash partitioning by the interval itself spreads 16 intervals over 2 tasks as unevenly
        as 11 and 5; instead each interval maps to an integer that Spark's own partitioning
        hash (Murmur3, as ``F.hash``) sends to the intended partition, found once by asking
        Spark.
        """
        if self._slots is None:
            from pyspark.sql import functions as F  # noqa: N812  (pyspark's convention)

            value = F.col("id").cast("int")
            found: dict[int, int] = {}
            for row in (
                self.spark.range(0, 64 * self.tasks)
                .select(value.alias("v"), F.pmod(F.hash(value), F.lit(self.tasks)).alias("p"))
                .collect()
            ):
                found.setdefault(int(row["p"]), int(row["v"]))
            if len(found) < self.tasks:  # no representative for some partition: plain hashing
                self._slots = F.col("interval")
            else:
                pairs = [F.lit(x) for p in range(self.tasks) for x in (p, found[p])]
                self._slots = F.element_at(
                    F.create_map(*pairs), F.pmod(F.col("interval"), F.lit(self.tasks))
                )
        return self._slots


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
    # Py4J wraps a failed Python task in pages of JVM stack; the Python error's last line is
    # what tells a reader what went wrong.
    text = str(exc)
    lines = [line for line in text.splitlines() if "Error" in line or "Exception" in line]
    return f"{type(exc).__name__}: {(lines[-1] if lines else text)[:500]}"
