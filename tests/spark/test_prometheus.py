"""A topology's Prometheus metrics, fed batch metrics and watermark snapshots by hand."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from millstream.engine.clock import ManualClock
from millstream.engine.protocol import StepTime
from millstream.engine.watermarks import (
    InputWatermark,
    WatermarkReport,
    computation_source,
    injector_source,
    parse_injector_source,
)
from millstream.spark.driver_watermarks import WatermarkSnapshot
from millstream.spark.metrics import COUNTERS, BatchMetrics
from millstream.spark.prometheus import COUNTER_METRICS, TopologyMetrics
from tests.connectors.test_prometheus import Samples

pytestmark = pytest.mark.unit

SECOND = 1_000_000
NOW = 1_800_000_000 * SECOND


def batch(computation: str, batch_id: int, **values: Any) -> BatchMetrics:
    return BatchMetrics(computation=computation, batch_id=batch_id, **values)


def labels(computation: str, topology: str = "shop") -> dict[str, str]:
    return {"topology": topology, "computation": computation}


def test_every_counter_of_a_batch_has_a_prometheus_counter_and_pending_a_gauge() -> None:
    assert set(COUNTER_METRICS) == set(COUNTERS) - {"pending"}
    names = [name for name, _ in COUNTER_METRICS.values()]
    assert len(set(names)) == len(names)
    assert all(name.startswith("millstream_") and name.endswith("_total") for name in names)
    assert all(help_text.endswith(".") for _, help_text in COUNTER_METRICS.values())


def test_batches_add_up_per_computation() -> None:
    metrics = TopologyMetrics("shop")
    metrics.observe(
        batch(
            "orders",
            0,
            inputs=10,
            rejected=1,
            processed=7,
            duplicates=2,
            late=3,
            dead_letters=1,
            pending=4,
            intervals=4,
            rescans=4,
            seconds=0.3,
        )
    )
    metrics.observe(
        batch(
            "orders",
            1,
            inputs=5,
            processed=5,
            fired_timers=2,
            pending=1,
            intervals=4,
            cache_hits=3,
            rescans=1,
            seconds=2.0,
            failed_attempts=("FencedError: taken",),
            isolated=1,
            isolation_runs=9,
        )
    )
    metrics.observe(batch("totals", 0, inputs=7, processed=7, intervals=2, cache_hits=2))

    samples = Samples.of(metrics.registry)
    orders = labels("orders")
    assert samples["millstream_records_in_total", orders] == 15
    assert samples["millstream_records_rejected_total", orders] == 1
    assert samples["millstream_records_processed_total", orders] == 12
    assert samples["millstream_duplicates_total", orders] == 2
    assert samples["millstream_late_records_total", orders] == 3
    assert samples["millstream_dead_letters_total", orders] == 1
    assert samples["millstream_timers_fired_total", orders] == 2
    assert samples["millstream_interval_runs_total", orders] == 8
    assert samples["millstream_interval_rescans_total", orders] == 5
    assert samples["millstream_cache_hits_total", orders] == 3
    assert samples["millstream_batches_total", orders] == 2
    assert samples["millstream_batch_failed_attempts_total", orders] == 1
    assert samples["millstream_poison_records_total", orders] == 1
    assert samples["millstream_isolation_runs_total", orders] == 9
    # Levels are the latest batch's.
    assert samples["millstream_productions_pending", orders] == 1
    assert samples["millstream_cache_hit_ratio", orders] == 0.75
    assert samples["millstream_batch_seconds_count", orders] == 2
    assert samples["millstream_batch_seconds_sum", orders] == pytest.approx(2.3)
    assert samples["millstream_batch_seconds_bucket", {**orders, "le": "0.5"}] == 1
    assert samples["millstream_batch_seconds_bucket", {**orders, "le": "+Inf"}] == 2
    assert samples["millstream_records_in_total", labels("totals")] == 7
    assert samples["millstream_cache_hit_ratio", labels("totals")] == 1.0
    assert "Kafka messages" in samples.help["millstream_records_in"]


def test_the_steps_of_batches_add_up_per_computation_and_step() -> None:
    metrics = TopologyMetrics("shop")
    metrics.observe(batch("orders", 0, steps={"commit": StepTime(1.5, 0.25)}))
    metrics.observe(
        batch("orders", 1, steps={"commit": StepTime(0.5, 0.25), "routing": StepTime(2, 1.5)})
    )
    samples = Samples.of(metrics.registry)
    commit = {**labels("orders"), "step": "commit"}
    assert samples["millstream_step_seconds_total", commit] == 2.0
    assert samples["millstream_step_cpu_seconds_total", commit] == 0.5
    routing = {**labels("orders"), "step": "routing"}
    assert samples["millstream_step_seconds_total", routing] == 2.0
    assert samples["millstream_step_cpu_seconds_total", routing] == 1.5


def test_stalls_of_transactional_outputs_are_counted_and_their_levels_kept() -> None:
    metrics = TopologyMetrics("shop")
    metrics.observe(batch("orders", 0, stalls=2, stalled_partitions=2, stall_seconds=12.5))
    metrics.observe(
        batch("orders", 1, stalls=1, stalled_partitions=1, stall_seconds=31, unstable_messages=7)
    )
    samples = Samples.of(metrics.registry)
    orders = labels("orders")
    assert samples["millstream_transaction_stalls_total", orders] == 3
    assert samples["millstream_transaction_stalled_partitions", orders] == 1
    assert samples["millstream_transaction_stall_seconds", orders] == 31
    assert samples["millstream_transaction_unstable_messages", orders] == 7


def test_hanging_transactions_aborted_are_counted_per_topology() -> None:
    metrics = TopologyMetrics("shop")
    metrics.hanging_aborted(2)
    metrics.hanging_aborted()
    samples = Samples.of(metrics.registry)
    assert samples["millstream_hanging_transactions_aborted_total", {"topology": "shop"}] == 3


def test_a_batch_without_interval_runs_keeps_the_last_hit_ratio() -> None:
    metrics = TopologyMetrics("shop")
    metrics.observe(batch("orders", 0, intervals=2, cache_hits=1))
    metrics.observe(batch("orders", 1, failed_attempts=("boom",)))
    assert Samples.of(metrics.registry)["millstream_cache_hit_ratio", labels("orders")] == 0.5


def test_watermark_gauges_are_read_at_scrape_time_with_their_lag_behind_the_clock() -> None:
    clock = ManualClock(NOW)
    snapshots = {
        "orders": WatermarkSnapshot(
            input_watermark=NOW - 90 * SECOND,
            watermark=NOW - 120 * SECOND,
            sources={
                injector_source("web", "0"): NOW - 90 * SECOND,
                injector_source("web", "1"): NOW - 30 * SECOND,
                computation_source("shop", "cart"): NOW - 10 * SECOND,
            },
        ),
        "totals": WatermarkSnapshot(
            input_watermark=NOW - 120 * SECOND,
            watermark=NOW - 120 * SECOND,
            # Applied later here than in "orders": the gauge shows the furthest.
            sources={injector_source("web", "0"): NOW - 60 * SECOND},
        ),
    }
    metrics = TopologyMetrics("shop", clock=clock)
    assert "millstream_watermark_lag_seconds" not in Samples.of(metrics.registry).names()
    metrics.watch(lambda: snapshots)

    samples = Samples.of(metrics.registry)
    orders = labels("orders")
    assert samples["millstream_input_watermark_timestamp_seconds", orders] == NOW / 1e6 - 90
    assert samples["millstream_watermark_timestamp_seconds", orders] == NOW / 1e6 - 120
    assert samples["millstream_watermark_lag_seconds", orders] == 90
    assert samples["millstream_watermark_lag_seconds", labels("totals")] == 120
    web = {"topology": "shop", "injector": "web"}
    assert samples["millstream_injector_watermark_timestamp_seconds", {**web, "process": "0"}] == (
        NOW / 1e6 - 60
    )
    assert samples["millstream_injector_watermark_lag_seconds", {**web, "process": "0"}] == 60
    assert samples["millstream_injector_watermark_lag_seconds", {**web, "process": "1"}] == 30
    injector_series = [
        key for key in samples.values if key[0] == "millstream_injector_watermark_lag_seconds"
    ]
    assert len(injector_series) == 2  # the computation source is not an injector

    clock.advance(15 * SECOND)
    assert Samples.of(metrics.registry)["millstream_watermark_lag_seconds", orders] == 105


def test_two_topologies_in_one_process_keep_their_own_registries() -> None:
    first, second = TopologyMetrics("a"), TopologyMetrics("b")
    first.observe(batch("c", 0, inputs=1))
    second.observe(batch("c", 0, inputs=2))
    assert Samples.of(first.registry).get("millstream_records_in_total", topology="b") is None
    assert Samples.of(second.registry)["millstream_records_in_total", labels("c", "b")] == 2
    shared = CollectorRegistry()
    TopologyMetrics("a", registry=shared)
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        TopologyMetrics("b", registry=shared)


def test_applied_watermarks_are_per_source_once_a_report_is_reached() -> None:
    watermark = InputWatermark({"clicks": "clicks", "views": "views"})
    reached = WatermarkReport("injector/web/0", ("clicks", "views"), 50, 1, {"clicks": {0: 1}})
    waiting = WatermarkReport("injector/app/0", ("clicks",), 70, 1, {"clicks": {0: 9}})
    watermark.offer(reached)
    watermark.offer(waiting)
    assert watermark.applied() == {}
    watermark.advance({"clicks": {0: 1}})
    assert watermark.applied() == {"injector/web/0": 50}
    watermark.offer(WatermarkReport("injector/web/0", ("clicks", "views"), 60, 2))
    watermark.advance({"clicks": {0: 1}})
    assert watermark.applied() == {"injector/web/0": 60}


def test_injector_sources_are_told_from_others() -> None:
    assert parse_injector_source(injector_source("web", "3")) == ("web", "3")
    assert parse_injector_source(computation_source("shop", "orders")) is None
    assert parse_injector_source("injector/web") is None
    assert parse_injector_source("alarm/shop/orders") is None


def test_millstream_run_refuses_a_malformed_metrics_address_before_starting(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from millstream import cli

    assert cli.main(["run", "nowhere:topology", "--metrics-port", "web:port"]) == 2
    error = capsys.readouterr().err
    assert "millstream run: error:" in error
    assert "ADDRESS:PORT" in error
