"""bench/view_cost.py: blocks alternate which of a pair goes first; the cost is a ratio of the
blocks with the view to those without, pair by pair; a slice counts the records injected in it,
away from its ends."""

from __future__ import annotations

import argparse

import pytest

from bench.throughput import RunResult, view_cost
from bench.view_cost import block_order, parse_args, slice_latencies


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


def test_a_record_counts_for_the_slice_it_was_injected_in_away_from_its_ends() -> None:
    boundaries = [1_000, 2_000, 3_000]  # two slices, µs
    samples = [
        (500, 1.0),  # before the first slice
        (1_050, 2.0),  # in the first's guard
        (1_500, 3.0),
        (1_950, 4.0),  # in its guard at the end
        (2_050, 5.0),  # in the second's guard
        (2_200, 6.0),
        (2_900, 7.0),
        (3_000, 8.0),  # when the last ended: after it
        (3_500, 9.0),
    ]
    assert slice_latencies(samples, boundaries, guard=100) == [[3.0], [6.0, 7.0]]
    assert slice_latencies(samples, boundaries, guard=0) == [[2.0, 3.0, 4.0], [5.0, 6.0, 7.0]]


def test_a_slice_must_leave_something_between_its_guards() -> None:
    with pytest.raises(SystemExit):
        parse_args(["--slice", "3", "--guard", "1.5"])
    assert parse_args(["--slice", "10"]).guard == 1.5
