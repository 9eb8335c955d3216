"""bench/throughput.py's order of runs: rounds alternate direction, warm-ups are not counted."""

from __future__ import annotations

import argparse

from bench.throughput import SYSTEMS, run_order


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
