"""bench/throughput.py: the order of runs (rounds alternate direction, warm-ups are not counted),
what a row reports, and issue 24's goals as a run measured them."""

from __future__ import annotations

import argparse

import pytest

from bench.harness import cpu_seconds
from bench.throughput import (
    FLOOR_FUSED,
    FLOOR_STAGED,
    STAGED,
    STAGES,
    SYSTEMS,
    RunResult,
    computation_phases,
    cpu_per_record,
    goals_report,
    report,
    run_order,
    stage_latency,
)
from millstream.engine.protocol import StepTime
from millstream.spark.metrics import ROUTING, BatchMetrics


def _order(names: list[str], runs: int, warmup: int) -> list[tuple[int, str]]:
    systems = [s for s in SYSTEMS if s.name in names]
    args = argparse.Namespace(runs=runs, warmup=warmup)
    return [(number, system.name) for number, system in run_order(systems, args)]


def test_rounds_alternate_direction_so_no_row_always_goes_first() -> None:
    order = _order(["millstream-strong", "millstream-watched"], runs=4, warmup=0)
    assert order == [
        (1, "millstream-strong"),
        (1, "millstream-watched"),
        (2, "millstream-watched"),
        (2, "millstream-strong"),
        (3, "millstream-strong"),
        (3, "millstream-watched"),
        (4, "millstream-watched"),
        (4, "millstream-strong"),
    ]


def test_warm_up_runs_come_first_numbered_zero() -> None:
    order = _order(["spark-floor", "millstream-strong"], runs=1, warmup=2)
    assert order[:2] == [(0, "spark-floor"), (0, "spark-floor")]
    assert [number for number, _ in order[2:]] == [1, 1]


def test_cpu_seconds_add_every_processs_use_in_the_window() -> None:
    before = {("cassandra", 1): 1.0, ("Python workers", 2): 2.0, ("Python workers", 3): 5.0}
    # A peer started in the window; worker 3 ended in it (missed, never negative).
    after = {("cassandra", 1): 1.5, ("Python workers", 2): 4.0, ("others", 4): 0.25}
    assert cpu_seconds(before, after) == pytest.approx(2.75)


def test_a_row_reports_the_median_cpu_a_record_of_its_runs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    runs = [
        RunResult("millstream-strong", records_per_s=9.0, cpu_s=2.0),
        RunResult("millstream-strong", records_per_s=10.0, cpu_s=3.0),
        RunResult("millstream-strong", records_per_s=11.0, cpu_s=2.5),
        RunResult("millstream-strong", cpu_s=9.0, error="failed"),  # not counted
    ]
    assert cpu_per_record(runs, 100_000) == [20.0, 30.0, 25.0]
    args = argparse.Namespace(records=100_000, keys=10, runs=3, rates=[])
    (row,) = report(args, {"millstream-strong": runs}, None)
    assert row["cpu_us_per_record"] == 25.0
    assert row["runs_cpu_us_per_record"] == [20.0, 30.0, 25.0]
    table = capsys.readouterr().out
    assert "CPU µs/rec" in table
    assert "      25.0" in table


def _throughput(system: str, *rounds: float) -> dict[str, object]:
    return {
        "system": system,
        "records_per_s": sorted(rounds)[len(rounds) // 2],
        "runs_records_per_s": list(rounds),
    }


def _latency(system: str, rate: float, p50: float, p95: float) -> dict[str, object]:
    return {"system": f"latency/{system}@{rate:g}", "rate": rate, "p50_ms": p50, "p95_ms": p95}


def test_each_goal_is_a_ratio_against_its_bound_met_or_not(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rows = [
        _throughput("spark-floor", 100.0, 140.0, 150.0),
        _throughput("quix", 40.0, 38.0, 36.0),
        _throughput("millstream-strong", 44.0, 37.0, 37.0),
        _throughput("millstream-weak", 50.0, 55.0, 60.0),
        _latency("spark-floor", 200, 1000.0, 1200.0),
        _latency("millstream-strong", 200, 1300.0, 1900.0),
    ]
    (row,) = goals_report(rows)
    verdicts = {v["goal"]: v for v in row["goals"]}
    eo = verdicts["exactly-once at least as fast as Quix Streams' exactly-once"]
    assert eo["ratio"] == pytest.approx(37.0 / 38.0)
    assert not eo["met"]
    assert eo["rounds"] == pytest.approx([44 / 40, 37 / 38, 37 / 36])
    assert eo["rounds_met"] == 2
    weak = verdicts["weak productions within 1.2x of the bare Spark floor"]
    assert (weak["ratio"], weak["met"]) == (pytest.approx(55 / 140), False)
    p50 = verdicts["latency p50 at 200 events/s within 1.3x of the floor's"]
    assert (p50["ratio"], p50["met"]) == (pytest.approx(1.3), True)  # the bound itself is met
    p95 = verdicts["latency p95 at 200 events/s within 1.5x of the floor's"]
    assert (p95["ratio"], p95["met"]) == (pytest.approx(1900 / 1200), False)
    printed = capsys.readouterr().out
    assert "not met  exactly-once at least as fast as Quix Streams' exactly-once: x0.97" in printed
    assert "rounds: x1.10, x0.97, x1.03 (2 of 3 met)" in printed
    assert "met      latency p50 at 200 events/s" in printed


def test_a_further_stage_is_the_chains_latency_less_one_stages_against_the_floors() -> None:
    rows = [
        _latency("spark-floor", 200, 500.0, 700.0),
        _latency("millstream-strong", 200, 600.0, 900.0),
        _latency(STAGED, 200, 600.0 + (STAGES - 1) * 550.0, 900.0 + (STAGES - 1) * 400.0),
    ]
    stage = stage_latency(rows, 200)
    assert stage is not None
    assert (stage["p50_ms"], stage["p95_ms"]) == (pytest.approx(550.0), pytest.approx(400.0))
    assert stage_latency(rows, 2000) is None  # that rate was not measured
    (row,) = goals_report([*rows, stage])
    verdicts = {v["goal"].split(" (")[0]: v for v in row["goals"]}
    verdict = verdicts["a further stage adds at most one floor batch at 200 events/s"]
    assert (verdict["ratio"], verdict["met"]) == (pytest.approx(1.1), False)
    assert stage_latency(rows[:2], 200) is None  # no chain, no goal
    assert len(goals_report(rows[:2])[0]["goals"]) == 2


def test_a_further_floor_stage_is_the_floor_chains_latency_less_the_floors() -> None:
    rows = [
        _latency("spark-floor", 200, 500.0, 700.0),
        _latency(FLOOR_STAGED, 200, 500.0 + (STAGES - 1) * 300.0, 700.0 + (STAGES - 1) * 450.0),
        _latency("millstream-strong", 200, 600.0, 900.0),
    ]
    stage = stage_latency(rows, 200, FLOOR_STAGED)
    assert stage is not None
    assert stage["system"] == "latency/a-further-floor-stage@200"
    assert (stage["p50_ms"], stage["p95_ms"]) == (pytest.approx(300.0), pytest.approx(450.0))
    rows.append(_latency(FLOOR_FUSED, 200, 500.0 + (STAGES - 1) * 200.0, 900.0))
    fused = stage_latency(rows, 200, FLOOR_FUSED)
    assert fused is not None
    assert fused["system"] == "latency/a-further-fused-stage@200"
    assert (fused["p50_ms"], fused["p95_ms"]) == (pytest.approx(200.0), pytest.approx(100.0))
    assert stage_latency(rows, 200) is None  # millstream's chain did not run
    # The goals hold millstream's stage against the floor's p50, not the floor's stage.
    assert all("floor-stage" not in v["goal"] for v in goals_report(rows)[0]["goals"])


def test_each_stage_of_a_pipeline_says_its_batches_and_where_a_batch_went() -> None:
    def batch(computation: str, commit: float) -> BatchMetrics:
        steps = {ROUTING: StepTime(0.02, 0.01), "commit": StepTime(commit, 0.01)}
        return BatchMetrics(computation=computation, batch_id=0, steps=steps)

    batches = [batch("count", 0.1), batch("count_2", 0.2), batch("count", 0.3)]
    note = computation_phases(
        {"count_2": [900.0], "count": [500.0, 700.0, 600.0], "count_3": []}, batches
    )
    assert note == (
        "; per computation: "
        "count: 3 batches, median 600 ms, 2 ran a job (steps, ms a batch: routing 20, commit 200)"
        " | count_2: 1 batches, median 900 ms, 1 ran a job (steps, ms a batch: routing 20,"
        " commit 200)"
        " | count_3: 0 batches, none in Spark's progress, 0 ran a job"
    )
    assert computation_phases({}, batches) == ""
    # The floor's chain: Spark's batches alone.
    assert computation_phases({"stage 1": [300.0, 500.0]}, []) == (
        "; per computation: stage 1: 2 batches, median 400 ms"
    )


def test_a_stalled_batch_is_named_with_its_own_steps() -> None:
    def batch(batch_id: int, seconds: float, commit: float) -> BatchMetrics:
        steps = {ROUTING: StepTime(0.02, 0.01), "commit": StepTime(commit, 0.01)}
        return BatchMetrics(
            computation="count",
            batch_id=batch_id,
            seconds=seconds,
            steps=steps,
            watermark_seconds=0.004,
        )

    usual = [batch(n, 0.2, 0.05) for n in range(5)]
    note = computation_phases({"count": [200.0] * 6}, [*usual, batch(9, 3.2, 2.9)])
    assert note.endswith(
        ", slowest: batch 9, 3200 ms against a median 200 (steps, ms: commit 2900, routing 20;"
        " bookkeeping 4)"
    )
    # Slower than usual, but not a stall: under a second, or under four times the median.
    assert "slowest" not in computation_phases({"count": [200.0]}, [*usual, batch(9, 0.7, 0.5)])
    slow = [batch(n, 0.6, 0.05) for n in range(5)]
    assert "slowest" not in computation_phases({"count": [600.0]}, [*slow, batch(9, 2.0, 1.5)])


def test_the_large_state_goal_is_the_large_intervals_ratio() -> None:
    rows = [
        {"system": "large-state/1000-keys", "interval_keys": 1000, "batch_seconds": 0.25},
        {"system": "large-state/50000-keys", "interval_keys": 50000, "batch_seconds": 0.4},
    ]
    (row,) = goals_report(rows)
    (verdict,) = row["goals"]
    assert verdict["goal"] == "a 1,000-record batch on 50,000 keys within 1.5x of one on 1,000"
    assert (verdict["ratio"], verdict["met"]) == (pytest.approx(1.6), False)


def test_a_run_without_both_rows_of_a_goal_reports_none(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rows = [_throughput("millstream-strong", 10.0), _throughput("spark-floor", 20.0)]
    assert goals_report(rows) == []
    assert capsys.readouterr().out == ""
