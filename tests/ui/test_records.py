"""The record browser's scans on the real Kafka: decoded, filtered by key and event time,
the newest first, bounded by their budget, going on from where one ended (a live tail), and
stopped when the page gives up; then its query parsing and route without services."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import pytest
from starlette.testclient import TestClient

from millstream.connectors.streams import produce_lines
from millstream.engine.config import MillstreamConfig
from millstream.engine.errors import ConfigError
from millstream.ui import SnapshotHub, create_app
from millstream.ui.app import _scan
from millstream.ui.records import ReaderPool, Scan, _ranges, scan_stream
from millstream.ui.snapshot import Observation

S = 1_000_000
T0 = 1_700_000_000 * S


def lines(count: int, start: int = 0) -> list[str]:
    return [
        json.dumps({"key": f"k{i % 3}", "value": {"n": i}, "timestamp": T0 + i * S})
        for i in range(start, start + count)
    ]


@pytest.mark.integration
@pytest.mark.parametrize("pooled", [False, True], ids=["own-consumer", "pooled-consumer"])
def test_a_scan_reads_decodes_filters_and_tails_a_stream(
    services: MillstreamConfig, unique: Callable[[str], str], pooled: bool
) -> None:
    """The same scans with a consumer made for each, and with one consumer lent to each in
    turn (the view's pool): a lent consumer reads what a fresh one reads, even after a scan
    that stopped half-way."""
    stream = unique("ui_records")
    pool = ReaderPool(services, keep=1) if pooled else None

    def read(*args: Any) -> dict[str, Any]:
        return scan_stream(services, *args, readers=pool)

    try:
        produce_lines(services, stream, lines(30), partitions=2, source="ui-test")
        everything = read(Scan(stream, limit=500))
        assert everything["scanned"] == 30
        assert everything["truncated"] is False
        assert [r["value"]["n"] for r in everything["records"]] == list(range(29, -1, -1))
        assert everything["records"][0]["time"] == "2023-11-14T22:13:49.000000Z"
        assert sum(b - a for a, b in everything["ranges"].values()) == 30

        # Filters: one key, an event-time window [since, until).
        window = read(Scan(stream, key="k1", since=T0 + 10 * S, until=T0 + 20 * S))
        assert [r["value"]["n"] for r in window["records"]] == [19, 16, 13, 10]
        assert window["matched"] == 4
        assert window["scanned"] == 30

        # The budget: the newest 10 (a partition with fewer leaves its share to the others),
        # and it says older ones went unread.
        newest = read(Scan(stream, key="k1", budget=10, limit=3))
        assert newest["scanned"] == 10
        assert newest["truncated"] is True
        assert len(newest["records"]) == 3
        # Unfiltered, every message is wanted: the newest 3 are among each partition's 3.
        unfiltered = read(Scan(stream, budget=10, limit=3))
        assert unfiltered["scanned"] == 6
        assert [r["value"]["n"] for r in unfiltered["records"]] == [29, 28, 27]

        # A tail goes on from the positions the last scan reached: only what came after.
        produce_lines(services, stream, lines(4, start=30), source="ui-test")
        after = {int(p): o for p, o in everything["positions"].items()}
        tail = read(Scan(stream, after=after))
        assert sorted(r["value"]["n"] for r in tail["records"]) == [30, 31, 32, 33]
        assert tail["scanned"] == 4

        # A page that gives up stops the scan at its next check.
        produce_lines(services, stream, lines(600, start=34), source="ui-test")
        gave_up = threading.Event()
        gave_up.set()
        stopped = read(Scan(stream, key="k1", budget=1_000), gave_up.is_set)
        assert stopped["cancelled"] is True
        assert stopped["scanned"] == 256
        after_stop = read(Scan(stream, budget=10, limit=3))
        assert [r["value"]["n"] for r in after_stop["records"]] == [633, 632, 631]
    finally:
        if pool is not None:
            pool.close()
        from millstream.connectors.kafka import delete_topics

        delete_topics(services, [stream])


@pytest.mark.integration
def test_a_pool_lends_its_consumer_again_and_closes_one_whose_scan_failed(
    services: MillstreamConfig,
) -> None:
    pool = ReaderPool(services, keep=1)
    with pool.reader() as first:
        assert first.assignment() == []
    with pool.reader() as again, pool.reader() as second:
        assert again is first  # kept, unassigned, between scans
        assert second is not first  # lent out already: a new one
    # Both come back; one is kept (keep=1), the other closed.
    with pool.reader() as kept:
        assert kept in (first, second)
    closed = second if kept is first else first
    with pytest.raises(RuntimeError, match="closed"):
        closed.assignment()
    with pytest.raises(ValueError, match="a scan failed"), pool.reader() as failed:
        raise ValueError("a scan failed")
    with pytest.raises(RuntimeError, match="closed"):
        failed.assignment()  # not kept: its state is unknown
    with pool.reader() as fresh:
        assert fresh is not kept
    pool.close()
    with pytest.raises(RuntimeError, match="closed"):
        fresh.assignment()  # the waiting ones close with the pool


@pytest.mark.unit
def test_the_query_is_parsed_and_bad_ones_are_refused_saying_why() -> None:
    scan = _scan(
        {
            "stream": "s",
            "key": "k",
            "since": "2023-11-14T22:13:20Z",
            "until": str(T0 + S),
            "after": "0:4,1:7",
            "limit": "5",
            "format": "text",
        }
    )
    assert scan == Scan("s", "k", T0, T0 + S, {0: 4, 1: 7}, limit=5, value_format="text")
    assert _scan({"stream": "s", "since": "2023-11-14T22:13:20"}).since == T0  # UTC
    for query, says in [
        ({}, "name a stream"),
        ({"stream": "s", "limit": "501"}, "1 to 500"),
        ({"stream": "s", "budget": "0"}, "1 to 100,000"),
        ({"stream": "s", "format": "xml"}, "json, text or hex"),
    ]:
        with pytest.raises(ConfigError, match=says):
            _scan(query)


@pytest.mark.unit
def test_the_route_answers_bad_queries_with_400_and_a_busy_browser_with_429() -> None:
    release = threading.Event()
    started = threading.Semaphore(0)

    def browse(scan: Scan, cancelled: Callable[[], bool]) -> dict[str, Any]:
        started.release()
        release.wait(10)
        return {"stream": scan.stream, "records": []}

    hub = SnapshotHub(lambda: Observation(T0, {}, {}), period=0.05)
    with TestClient(create_app(hub, browse=browse)) as client:
        bad = client.get("/api/records", params={"stream": "s", "limit": "0"})
        assert bad.status_code == 400
        assert "1 to 500" in bad.json()["error"]
        results: list[int] = []
        busy = [
            threading.Thread(
                target=lambda: results.append(client.get("/api/records?stream=s").status_code)
            )
            for _ in range(2)
        ]
        for thread in busy:
            thread.start()
        assert started.acquire(timeout=10)
        assert started.acquire(timeout=10)
        assert client.get("/api/records?stream=s").status_code == 429
        release.set()
        for thread in busy:
            thread.join(10)
        assert results == [200, 200]
    without = TestClient(create_app(hub, browse=None, run_hub=False))
    assert without.get("/api/records?stream=s").status_code == 404


@pytest.mark.unit
def test_a_partition_with_less_than_its_share_leaves_the_rest_to_the_others() -> None:
    ends = {0: 3, 1: 100, 2: 100}
    ranges, truncated = _ranges("t", Scan("s", budget=50), {0: 0, 1: 0, 2: 0}, ends)
    assert [(r.partition, r.start, r.end) for r in ranges] == [
        (0, 0, 3),
        (1, 77, 100),
        (2, 76, 100),
    ]
    assert truncated is True
    tail, truncated = _ranges("t", Scan("s", after={0: 3, 1: 90, 2: 100}), {}, ends)
    assert [(r.start, r.end) for r in tail] == [(3, 3), (90, 100), (100, 100)]
    assert truncated is False
