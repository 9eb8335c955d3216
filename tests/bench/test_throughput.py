"""bench/throughput.py: the order of runs (rounds alternate direction, warm-ups are not counted)
and what a row reports."""

from __future__ import annotations

import argparse

import pytest

from bench.harness import cpu_seconds
from bench.throughput import SYSTEMS, RunResult, cpu_per_record, report, run_order


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
