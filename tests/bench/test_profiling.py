"""``bench/profiling.py`` adds up py-spy's collapsed stacks by function."""

from __future__ import annotations

import pytest

from bench.profiling import ROOT, top_frames

pytestmark = pytest.mark.unit

RAW = [
    "<module> (pyspark/worker.py:10);main (pyspark/worker.py:80);"
    f"process_record ({ROOT}engine/protocol.py:120) 30",
    "<module> (pyspark/worker.py:10);main (pyspark/worker.py:80);"
    f"process_record ({ROOT}engine/protocol.py:131);"
    "execute (/x/site-packages/cassandra/cluster.py:2600) 50",
    "<module> (pyspark/worker.py:10);main (pyspark/worker.py:81) 20",
    "not a sample line",
]


def test_samples_add_up_by_function_self_and_total() -> None:
    samples, frames = top_frames(RAW, top=3)
    assert samples == 100
    assert frames == [
        ("execute (cassandra/cluster.py)", 50, 50),
        ("process_record (engine/protocol.py)", 30, 80),  # two lines of it, one function
        ("main (pyspark/worker.py)", 20, 100),
    ]


def test_a_recursive_function_counts_once_per_sample_in_its_total() -> None:
    samples, frames = top_frames(["f (a.py:1);f (a.py:2);f (a.py:3) 7"], top=5)
    assert (samples, frames) == (7, [("f (a.py)", 7, 7)])


def test_samples_of_a_named_function_are_left_out() -> None:
    lines = ["main (a.py:1);work (a.py:2) 5", "main (a.py:1);watch (b.py:3);sleep (b.py:4) 9"]
    samples, frames = top_frames(lines, top=5, without="watch")
    assert (samples, frames) == (5, [("work (a.py)", 5, 5)])
