"""bench/view_cost.py: blocks alternate which of a pair goes first; the cost is a ratio of the
blocks with the view to those without, pair by pair."""

from __future__ import annotations

import argparse

import pytest

from bench.throughput import RunResult, view_cost
from bench.view_cost import block_order, parse_args


def test_pairs_alternate_which_block_goes_first() -> None:
    assert block_order(3) == [False, True, True, False, False, True]


def test_the_cost_is_the_viewed_blocks_against_the_plain_ones() -> None:
    args = argparse.Namespace(rates=[200.0])
    plain = [
        RunResult("view off", records_per_s=1000.0, latency={200.0: [100.0] * 50}),
        RunResult("view off", records_per_s=1200.0, latency={200.0: [110.0] * 50}),
    ]
    viewed = [
        RunResult("view on", records_per_s=900.0, latency={200.0: [120.0] * 50}),
        RunResult("view on", records_per_s=1080.0, latency={200.0: [132.0] * 50}),
    ]
    [row] = view_cost(args, "test", plain, viewed, system="view-cost")
    assert row["system"] == "view-cost"
    assert row["throughput_ratio_per_run"] == pytest.approx([0.9, 0.9])
    assert row["throughput_ratio"] == pytest.approx(990 / 1100)
    # Every pair's blocks are 20 % apart: so are any resample's.
    assert row["p50_ratio@200"] == pytest.approx(1.2)
    assert row["p50_ratio_interval@200"] == pytest.approx([1.2, 1.2])


def test_nothing_to_measure_is_refused() -> None:
    with pytest.raises(SystemExit):
        parse_args(["--rates", "", "--burst", "0"])
    assert parse_args(["--pairs", "3"]).pairs == 3
