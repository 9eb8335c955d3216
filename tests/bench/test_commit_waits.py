"""bench/commit_waits.py: a commit's waits on the commit log are read from its trace, and a
turn on the real node times every commit it makes and traces one in every few."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from bench.commit_waits import APPEND, CommitTrace, append_waits, run_turn, summary
from millstream.engine.stores.cassandra import create_schema


@pytest.mark.unit
def test_an_append_waits_until_the_requests_next_event() -> None:
    events = [
        ("Parsing a statement", 10),
        (APPEND, 1_000),
        ("Adding to paxos memtable", 3_500),
        (APPEND, 4_000),
        ("Adding to intervals memtable", 4_250),
        (APPEND, 9_000),  # the trace's last: its wait is unknown
    ]
    # Events come back from system_traces in any order: time orders them.
    assert append_waits(list(reversed(events))) == (2.5, 0.25)
    assert append_waits([("Parsing a statement", 10)]) == ()


@pytest.mark.unit
def test_a_turns_summary_is_of_its_commits_and_their_waits() -> None:
    traces = [CommitTrace(10.0, 8.0, (1.0, 3.0)), CommitTrace(20.0, 12.0, (2.0, 2.0))]
    result = summary(traces, [5.0, 6.0, 7.0])
    assert result["untraced_p50"] == 6.0
    assert result["commits"] == 2
    assert result["appends"] == 2
    assert result["waited_share"] == pytest.approx(8.0 / 20.0)
    assert result["node_p90"] >= result["node_p50"] >= 8.0


@pytest.mark.integration
def test_a_turn_times_every_commit_and_traces_one_in_every_few_on_the_node(
    cassandra: Any, cassandra_keyspace: Callable[[], str]
) -> None:
    keyspace = cassandra_keyspace()
    create_schema(cassandra, keyspace)
    traces, untraced = run_turn(
        cassandra, keyspace, intervals=2, keys=3, period=0.1, seconds=1.0, busy=0, trace_every=2
    )
    # Two intervals, ten commits a second each, for a second: one in two traced.
    assert len(traces) >= 8
    assert len(untraced) >= 8
    for trace in traces:
        assert trace.node_ms <= trace.client_ms
        assert trace.appends >= 1  # a conditional batch is written to the commit log
