"""Batch metrics: one list of counters, from the interval rows to a computation's totals."""

from __future__ import annotations

import time

import pytest

from millstream.engine.protocol import BatchResult, StepTime
from millstream.engine.sequencer import Lease
from millstream.spark.metrics import (
    COUNTERS,
    RESULT_SCHEMA,
    ROUTING,
    BatchMetrics,
    MetricCounts,
    describe,
    interval_counts,
    summarize,
    totals,
)

pytestmark = pytest.mark.unit

LEASE = Lease("count", 0, token=1, cache_valid=False)


def test_the_result_schema_has_a_column_per_counter_in_order() -> None:
    columns = [part.split()[0] for part in RESULT_SCHEMA.split(", ")]
    assert columns[2 : 2 + len(COUNTERS)] == list(COUNTERS)
    assert "intervals" in COUNTERS
    assert "cache_hits" in COUNTERS


def test_interval_counts_say_rescan_or_cache_hit() -> None:
    rescanned = BatchResult(lease=LEASE, rescanned=True)
    rescanned.processed = 3
    counts = interval_counts(5, 2, rescanned, cached=True)
    assert (counts.inputs, counts.rejected, counts.processed) == (5, 2, 3)
    assert (counts.intervals, counts.rescans, counts.cache_hits) == (1, 1, 0)
    valid = BatchResult(lease=LEASE, rescanned=False)
    assert interval_counts(0, 0, valid, cached=True).cache_hits == 1
    assert interval_counts(0, 0, valid, cached=False).cache_hits == 0


def row(interval: int = 0, **counts: int) -> dict[str, int]:
    return dict.fromkeys(COUNTERS, 0) | {"interval": interval, "intervals": 1} | counts


def test_a_batch_sums_its_interval_rows() -> None:
    rows = [row(5, inputs=3, processed=2), row(2, inputs=4, pending=1), row(1, processed=1)]
    metrics = summarize("count", 7, rows, time.monotonic())
    assert (metrics.computation, metrics.batch_id) == ("count", 7)
    assert (metrics.inputs, metrics.processed, metrics.pending, metrics.intervals) == (7, 3, 1, 3)
    assert metrics.processed_intervals == (1, 5)  # in order; interval 2 processed nothing
    assert "inputs=7" in describe(metrics)
    assert "rescans" not in describe(metrics)
    assert "poison" not in describe(metrics)
    isolating = BatchMetrics(computation="a", batch_id=4, inputs=9, isolated=1, isolation_runs=9)
    assert describe(isolating).endswith(", 1 poison record(s) isolated in 9 sub-run(s)")
    stalled = BatchMetrics(computation="a", batch_id=5, stalled_partitions=2, stall_seconds=14.2)
    assert describe(stalled).endswith(
        ", 2 output partition(s) stalled by an open transaction for up to 14s"
    )
    assert "stalled" not in describe(metrics)


def test_a_batch_sums_the_step_times_of_its_interval_rows() -> None:
    first = row() | {"steps": {"commit": [2.0, 0.5], ROUTING: [1.0, 0.75]}}
    second = row() | {"steps": {"commit": [3.0, 0.25]}}
    metrics = summarize("count", 1, [first, second, row()], time.monotonic())
    assert metrics.steps == {"commit": StepTime(5.0, 0.75), ROUTING: StepTime(1.0, 0.75)}


def test_totals_sum_batches_but_keep_the_latest_pending() -> None:
    batches = [
        BatchMetrics(computation="a", batch_id=0, inputs=5, pending=3, failed_attempts=("x",)),
        BatchMetrics(computation="b", batch_id=0, inputs=1),
        BatchMetrics(computation="a", batch_id=1, inputs=2, pending=0, cache_hits=1, intervals=2),
        BatchMetrics(computation="a", batch_id=2, isolated=1, isolation_runs=9, stalls=2),
    ]
    found = totals(batches)
    a = found["a"]
    assert (a.batches, a.inputs, a.pending, a.failed_attempts) == (3, 7, 0, 1)
    assert (a.isolated, a.isolation_runs, a.stalls) == (1, 9, 2)
    assert a.cache_hit_rate == 0.5
    assert found["b"].inputs == 1
    assert MetricCounts(inputs=1) + MetricCounts(inputs=2) == MetricCounts(inputs=3)


def test_a_result_row_is_written_and_read_by_column_name() -> None:
    from millstream.engine.watermarks import IntervalProgress
    from millstream.spark.metrics import RESULT_COLUMNS, ResultRow

    row = ResultRow(
        computation="count",
        interval=3,
        counts=MetricCounts(inputs=4, pending=2, intervals=1),
        host="node-1",
        pid=99,
        seconds=0.5,
        cpu_seconds=0.25,
        progress=IntervalProgress(oldest_work=7, next_event_timer=9, pending=2),
        steps={"reads": StepTime(0.125, 0.0625), ROUTING: StepTime(0.5, 0.375)},
    )
    columns = row.columns()
    assert list(columns) == [name for name, _ in RESULT_COLUMNS]
    assert ResultRow.of(dict(reversed(columns.items()))) == row
    assert row.worker == "node-1:99"
