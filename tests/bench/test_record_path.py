"""bench/record_path.py: its steps do the same work, and it prints each step a record."""

from __future__ import annotations

import sys

import pytest

from bench import record_path

pytestmark = pytest.mark.unit


def test_the_protocol_commits_the_counts_the_floor_counts() -> None:
    batch = record_path.messages(300, 7)
    counts = record_path.floor(batch)
    assert sum(counts.values()) == 300
    assert len(counts) == 7
    assert record_path.protocol(record_path.routing(batch)) == counts


def test_it_prints_each_step_in_microseconds_a_record(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["record_path.py", "--records", "200", "--runs", "1"])
    tuned: list[int] = []
    monkeypatch.setattr(record_path, "tune_collector", tuned.append)  # not this process's
    record_path.main()
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines[1:]] == ["floor", "routing", "protocol", "millstream"]
    assert all(float(line.split()[1]) > 0 for line in lines[1:])
    assert tuned == [50_000]  # as a Spark Python worker's collector, by default
