"""The live view's web app without services: the page and its assets, the security headers,
the token gate, read-only routes, and the event stream's numbering and skipping."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from starlette.testclient import TestClient

from millstream.engine.config import MillstreamConfig
from millstream.engine.errors import ConfigError
from millstream.engine.watermarks import WatermarkReport
from millstream.ui import SnapshotHub, create_app, is_loopback, serve
from millstream.ui.app import TOKEN_COOKIE, _event_stream
from millstream.ui.snapshot import Observation

pytestmark = pytest.mark.unit

S = 1_000_000
NOW = 1_700_000_000 * S


def observation() -> Observation:
    report = WatermarkReport("computation/t/<b>count</b>", ("out",), NOW - S, 1)
    return Observation(NOW, {report.source: report}, {"out": {0: 4}})


def hub() -> SnapshotHub:
    return SnapshotHub(observation, period=0.05)


def test_the_page_its_assets_and_the_snapshot_are_served_with_security_headers() -> None:
    with TestClient(create_app(hub())) as client:
        page = client.get("/")
        assert page.status_code == 200
        assert "/assets/app.js" in page.text
        policy = page.headers["content-security-policy"]
        assert "script-src 'self'" in policy
        assert "unsafe-inline" not in policy
        assert page.headers["x-content-type-options"] == "nosniff"
        assert client.get("/assets/app.js").headers["content-type"].startswith("text/javascript")
        assert client.get("/assets/style.css").status_code == 200
        assert client.get("/assets/../app.py").status_code == 404
        assert client.get("/assets/index.htm").status_code == 404
        snapshot = _wait_for_snapshot(client)
        assert snapshot["nodes"][0]["name"] == "<b>count</b>"
        assert "&lt;b&gt;count&lt;/b&gt;" in snapshot["svg"]
        assert snapshot["seq"] >= 1


def test_it_is_read_only() -> None:
    with TestClient(create_app(hub())) as client:
        for method in ("POST", "PUT", "DELETE", "PATCH"):
            assert client.request(method, "/").status_code == 405
            assert client.request(method, "/api/snapshot").status_code == 405


def test_with_a_token_nothing_is_served_without_it() -> None:
    with TestClient(create_app(hub(), token="s3cret"), follow_redirects=False) as client:
        for path in ("/", "/api/snapshot", "/events", "/assets/app.js"):
            assert client.get(path).status_code == 401
        assert client.get("/", params={"token": "wrong"}).status_code == 401
        assert client.get("/", headers={"authorization": "Bearer wrong"}).status_code == 401
        assert client.get("/assets/app.js", headers={"authorization": "Bearer s3cret"}).is_success
        opened = client.get("/", params={"token": "s3cret"})
        assert opened.status_code == 303
        assert opened.headers["location"] == "/"
        cookie = opened.headers["set-cookie"]
        assert "httponly" in cookie.lower()
        assert "samesite=strict" in cookie.lower()
        client.cookies.set(TOKEN_COOKIE, "s3cret")
        assert client.get("/").status_code == 200
        _wait_for_snapshot(client)


def test_off_loopback_it_needs_a_token() -> None:
    assert all(is_loopback(host) for host in ("127.0.0.1", "::1", "localhost"))
    assert not any(is_loopback(host) for host in ("0.0.0.0", "example.org"))
    with pytest.raises(ConfigError, match="open to the network"):
        serve(MillstreamConfig(), host="0.0.0.0", token=None)
    with pytest.raises(ConfigError, match="must not be empty"):
        create_app(hub(), token="")


class _Browser:
    """A page's request as the event stream sees it: connected until told otherwise."""

    def __init__(self) -> None:
        self.gone = False

    async def is_disconnected(self) -> bool:
        return self.gone


def test_a_slow_page_gets_the_newest_snapshot_not_a_queue() -> None:
    async def scenario() -> list[str]:
        live = hub()
        browser = _Browser()
        stream = _event_stream(live, browser)  # type: ignore[arg-type]
        assert await anext(stream) == "retry: 2000\n\n"
        for _ in range(5):  # five snapshots while the page reads none
            await live.step()
        first = await anext(stream)
        await live.step()
        second = await anext(stream)
        browser.gone = True
        rest = [event async for event in stream]
        return [first, second, *rest]

    first, second = asyncio.run(scenario())
    assert first.startswith("id: 5\nevent: snapshot\ndata: {")
    assert second.startswith("id: 6\n")


def _wait_for_snapshot(client: TestClient, headers: dict[str, str] | None = None) -> dict[str, Any]:
    for _ in range(200):
        response = client.get("/api/snapshot", headers=headers)
        if response.status_code == 200:
            document: dict[str, Any] = response.json()
            return document
        assert response.status_code == 503
        asyncio.run(asyncio.sleep(0.01))
    raise AssertionError("no snapshot within 2 s")


def test_the_intervals_route_asks_for_a_computation_by_name() -> None:
    asked: list[str] = []

    def intervals(name: str, cancelled: object) -> dict[str, object]:
        asked.append(name)
        return {"computation": name, "intervals": []}

    with TestClient(create_app(hub(), intervals=intervals)) as client:
        assert client.get("/api/intervals").status_code == 400
        answer = client.get("/api/intervals", params={"computation": "<b>c</b>"})
        assert answer.json() == {"computation": "<b>c</b>", "intervals": []}
    assert asked == ["<b>c</b>"]
    with TestClient(create_app(hub())) as client:
        assert client.get("/api/intervals?computation=c").status_code == 404


def test_the_views_own_metrics_are_served_behind_the_same_token() -> None:
    live = hub()
    with TestClient(create_app(live, token="s3cret")) as client:
        assert client.get("/metrics").status_code == 401
        bearer = {"authorization": "Bearer s3cret"}
        _wait_for_snapshot(client, bearer)
        text = client.get("/metrics", headers=bearer).text
    assert "millstream_ui_snapshots_total" in text
    assert "millstream_ui_reading_seconds_count" in text
    snapshots = next(
        line for line in text.splitlines() if line.startswith("millstream_ui_snapshots_total ")
    )
    assert float(snapshots.split()[1]) >= 1.0


def test_an_open_page_counts_until_it_goes() -> None:
    async def scenario() -> list[float]:
        live = hub()
        await live.step()
        browser = _Browser()
        stream = _event_stream(live, browser)  # type: ignore[arg-type]

        def pages() -> float:
            value = live.metrics.registry.get_sample_value("millstream_ui_pages")
            assert value is not None
            return value

        counted = [pages()]
        await anext(stream)
        counted.append(pages())
        await stream.aclose()
        counted.append(pages())
        return counted

    assert asyncio.run(scenario()) == [0.0, 1.0, 0.0]


def test_pages_leaving_as_their_waits_time_out_never_wedge_the_hub() -> None:
    # Pages' streams cancelled (their browsers left) just as their waits for a newer snapshot
    # time out and a snapshot is published: with a lock around the waits, a cancelled wait
    # could be left taking the lock after its page had gone, and nothing got it back: every
    # later page, and the next snapshot, waited forever. On a loop of its own, in a thread,
    # so that a wedged loop fails the test instead of hanging it.
    async def scenario() -> list[str]:
        view = hub()
        await view.publish(view.tracker.update(observation()))
        loop = asyncio.get_running_loop()
        waits = [asyncio.ensure_future(view.newer_than(view.sequence, 0.05)) for _ in range(50)]
        await asyncio.sleep(0.049)
        snapshot = view.tracker.update(observation())
        loop.call_later(0.001, lambda: asyncio.ensure_future(view.publish(snapshot)))
        for leaving in waits[::2]:
            loop.call_later(0.001, leaving.cancel)
        outcomes = await asyncio.gather(*waits, return_exceptions=True)
        await asyncio.sleep(0.05)
        problems = [
            repr(outcome)
            for outcome in outcomes
            if isinstance(outcome, BaseException)
            and not isinstance(outcome, asyncio.CancelledError)
        ]
        stuck = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        problems += [f"a task left waiting: {task!r}" for task in stuck]
        if not stuck:
            seen = view.sequence
            loop.call_later(0.01, lambda: asyncio.ensure_future(view.publish(snapshot)))
            if await view.newer_than(seen, 1.0) is None:
                problems.append("the next snapshot never reached a page")
        return problems

    problems: list[str] = []
    runs: list[int] = []

    def rounds() -> None:
        for number in range(20):
            problems.extend(asyncio.run(scenario()))
            runs.append(number)
            if problems:
                return

    loop_thread = threading.Thread(target=rounds, daemon=True)
    loop_thread.start()
    loop_thread.join(30)
    assert not problems
    assert not loop_thread.is_alive(), f"wedged after {len(runs)} rounds"
    assert len(runs) == 20
