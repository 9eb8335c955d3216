"""The live view's web app (Starlette): the page, its assets, the latest snapshot as JSON, and
one Server-Sent Events stream per open page.

One server task (:class:`SnapshotHub`) observes the services every ``period`` seconds, builds
the snapshot and numbers it; every page's stream sends the newest snapshot it has not sent.
A slow or frozen browser therefore holds nothing but a reference to the one newest snapshot
(its stream skips those it had no time for) and never slows the observing, nor the engine,
which the view only reads from Kafka.

Read-only: every route is a GET. Bound to a loopback address the app is open to the machine's
users; on any other address it needs a token (:class:`TokenGate`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import json
import logging
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from datetime import UTC, datetime, timedelta
from importlib import resources
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_asgi_app
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import (
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Mount, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from millstream.engine.errors import ConfigError, MillstreamError
from millstream.ui.graph import draw_graph
from millstream.ui.records import Scan
from millstream.ui.snapshot import Observation, Tracker

__all__ = [
    "DEFAULT_PERIOD",
    "Browse",
    "Chart",
    "Intervals",
    "SnapshotHub",
    "TokenGate",
    "ViewMetrics",
    "create_app",
    "is_loopback",
]

_log = logging.getLogger(__name__)

DEFAULT_PERIOD = 2.0
"""Seconds between two readings of the services. Each reading is a metadata request, a read
of the watermark topic and an end-offset request to Kafka, and a snapshot built and sent to
every page: two seconds halves what one costs the topology, and a person watching still sees
the numbers move."""

# The page's own files, served from the package (no CDN: it works without internet).
_ASSETS = {
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}
_SECURITY_HEADERS = {
    # Scripts and styles from this server only; no inline script runs, whatever a name holds.
    "content-security-policy": "default-src 'self'; script-src 'self'; style-src 'self'; "
    "img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; "
    "form-action 'none'",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "x-frame-options": "DENY",
    "cache-control": "no-store",
}
TOKEN_COOKIE = "millstream_ui_token"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_KEEPALIVE = 15.0  # seconds between comments on an idle event stream (proxies close idle ones)


class ViewMetrics:
    """The view's own Prometheus metrics, served at its ``/metrics``: how its readings of the
    services go, how many pages are open, and the scans they ask for."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.snapshots = Counter(
            "millstream_ui_snapshots", "Snapshots built", registry=self.registry
        )
        self.partial = Counter(
            "millstream_ui_partial_snapshots",
            "Snapshots of a reading that a service did not fully answer",
            registry=self.registry,
        )
        self.reading_seconds = Histogram(
            "millstream_ui_reading_seconds",
            "Seconds one reading of the services took",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
            registry=self.registry,
        )
        self.pages = Gauge(
            "millstream_ui_pages", "Pages with their event stream open", registry=self.registry
        )
        self.scans = Counter(
            "millstream_ui_scans",
            "Record, chart and interval reads, by how they ended",
            ["outcome"],
            registry=self.registry,
        )


class SnapshotHub:
    """Builds a snapshot every ``period`` seconds from ``observe()`` (run in a thread: it
    blocks on Kafka) and hands the newest to whoever waits (:meth:`newer_than`)."""

    def __init__(
        self,
        observe: Callable[[], Observation],
        *,
        period: float = DEFAULT_PERIOD,
        tracker: Tracker | None = None,
        metrics: ViewMetrics | None = None,
    ) -> None:
        self.observe = observe
        self.period = period
        self.tracker = tracker or Tracker()
        self.sequence = 0
        self.latest: str | None = None  # the newest snapshot, as JSON
        self.metrics = metrics or ViewMetrics()
        self._published = asyncio.Event()  # set, and replaced, at each snapshot

    async def run(self) -> None:
        """Observe forever (until cancelled); an observation that fails is said in the next
        snapshot's ``error`` and the loop goes on."""
        while True:
            started = asyncio.get_running_loop().time()
            await self.step()
            elapsed = asyncio.get_running_loop().time() - started
            await asyncio.sleep(max(0.0, self.period - elapsed))

    async def step(self) -> None:
        """One observation, its snapshot published."""
        with self.metrics.reading_seconds.time():
            observation = await asyncio.to_thread(self.observe)
        self.metrics.snapshots.inc()
        if observation.error is not None:
            self.metrics.partial.inc()
        await self.publish(self.tracker.update(observation))

    async def publish(self, snapshot: Mapping[str, Any]) -> None:
        """Number ``snapshot``, add its graph drawing, and wake the waiting streams."""
        document = {
            **snapshot,
            "seq": self.sequence + 1,
            "svg": draw_graph(snapshot["nodes"], snapshot["edges"]),
        }
        self.latest = json.dumps(document, separators=(",", ":"))
        self.sequence += 1
        published, self._published = self._published, asyncio.Event()
        published.set()

    async def newer_than(self, seen: int, timeout: float) -> tuple[int, str] | None:
        """The newest snapshot once its number is above ``seen`` (``None`` after ``timeout``
        seconds without one)."""
        # One event loop reads and writes these, so no lock: an asyncio.Condition waited on
        # under wait_for could be left unacquired by a page leaving as the wait timed out
        # (Python 3.11), and its release then raised in the page's stream.
        try:
            async with asyncio.timeout(timeout):
                while not (self.sequence > seen and self.latest is not None):
                    await self._published.wait()
        except TimeoutError:
            return None
        assert self.latest is not None
        return self.sequence, self.latest


Browse = Callable[[Scan, Callable[[], bool]], dict[str, Any]]
"""Reads a :class:`~millstream.ui.records.Scan` (``scan_stream`` on a config), stopping
early once the callable it is given says the page gave up."""

Intervals = Callable[[str, Callable[[], bool]], dict[str, Any]]
"""Reads what the store holds about a computation's key intervals, by its name
(``interval_overview`` on a session)."""

Chart = Callable[[str, str | None, str | None, int, Callable[[], bool]], dict[str, Any]]
"""Reads a series chart: predictions stream, key (``None``: only the keys), anomalies
stream, points, and the callable saying the page gave up (``read_series`` on a config)."""

_SCANS_AT_ONCE = 2  # record scans running together; more are refused (429), not queued


def create_app(
    hub: SnapshotHub,
    *,
    token: str | None = None,
    run_hub: bool = True,
    browse: Browse | None = None,
    chart: Chart | None = None,
    intervals: Intervals | None = None,
) -> ASGIApp:
    """The ASGI app of the view around ``hub`` (started and stopped with the app unless
    ``run_hub`` is false); with ``token``, every request needs it (:class:`TokenGate`).
    ``browse`` serves the record browser (``/api/records``), ``chart`` the series charts
    (``/api/series``) and ``intervals`` a computation's key intervals (``/api/intervals``);
    without them, they answer 404. Both read in a thread, two at most at
    once, and stop when the page goes away."""
    scans = asyncio.Semaphore(_SCANS_AT_ONCE)

    async def page(request: Request) -> Response:
        return Response(_asset("index.html"), media_type="text/html; charset=utf-8")

    async def asset(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in _ASSETS:
            return PlainTextResponse("not found", status_code=404)
        return Response(_asset(name), media_type=_ASSETS[name])

    async def snapshot(request: Request) -> Response:
        if hub.latest is None:
            return JSONResponse({"error": "no snapshot yet"}, status_code=503)
        return Response(hub.latest, media_type="application/json")

    async def records(request: Request) -> Response:
        if browse is None:
            return JSONResponse({"error": "this view has no record browser"}, status_code=404)
        try:
            scan = _scan(request.query_params)
        except (ConfigError, ValueError) as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        return await bounded(request, lambda cancelled: browse(scan, cancelled))

    async def series(request: Request) -> Response:
        if chart is None:
            return JSONResponse({"error": "this view has no charts"}, status_code=404)
        query = request.query_params
        if not query.get("stream"):
            return JSONResponse({"error": "name a stream (?stream=NAME)"}, status_code=400)
        try:
            points = int(query.get("points", 500))
        except ValueError as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        return await bounded(
            request,
            lambda cancelled: chart(
                query["stream"],
                query.get("key") or None,
                query.get("anomalies") or None,
                points,
                cancelled,
            ),
        )

    async def computation_intervals(request: Request) -> Response:
        if intervals is None:
            return JSONResponse({"error": "this view does not read the store"}, status_code=404)
        name = request.query_params.get("computation")
        if not name:
            return JSONResponse({"error": "name a computation (?computation=NAME)"}, 400)
        return await bounded(request, lambda cancelled: intervals(name, cancelled))

    async def bounded(
        request: Request, read: Callable[[Callable[[], bool]], dict[str, Any]]
    ) -> Response:
        """``read`` in a thread, refused if two run already; it is told when the page left."""
        if scans.locked():
            hub.metrics.scans.labels("refused").inc()
            return JSONResponse(
                {"error": f"{_SCANS_AT_ONCE} scans are running; try again when one ends"},
                status_code=429,
            )
        async with scans:
            gave_up = threading.Event()
            reading = asyncio.ensure_future(asyncio.to_thread(read, gave_up.is_set))
            while not reading.done():
                await asyncio.wait({reading}, timeout=0.2)
                if not reading.done() and await request.is_disconnected():
                    gave_up.set()  # the page went away: the scan stops at its next check
            try:
                result = reading.result()
            except (MillstreamError, ValueError) as exc:
                hub.metrics.scans.labels("failed").inc()
                return JSONResponse({"error": str(exc)}, status_code=502)
        hub.metrics.scans.labels("cancelled" if gave_up.is_set() else "read").inc()
        return JSONResponse(result)

    async def events(request: Request) -> Response:
        return StreamingResponse(
            _event_stream(hub, request),
            media_type="text/event-stream",
            headers={"x-accel-buffering": "no"},
        )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        task = asyncio.get_running_loop().create_task(hub.run()) if run_hub else None
        try:
            yield
        finally:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    app: ASGIApp = Starlette(
        routes=[
            Route("/", page),
            # The page has no icon: an empty answer, not a 404 in every browser's console.
            Route("/favicon.ico", lambda request: Response(status_code=204)),
            Route("/assets/{name}", asset),
            Route("/api/snapshot", snapshot),
            Route("/api/records", records),
            Route("/api/series", series),
            Route("/api/intervals", computation_intervals),
            # The view's own metrics, behind the same token as the rest.
            Mount("/metrics", make_asgi_app(hub.metrics.registry)),
            Route("/events", events),
        ],
        lifespan=lifespan,
    )
    if token is not None:
        app = TokenGate(app, token)
    return _SecurityHeaders(app)


async def _event_stream(hub: SnapshotHub, request: Request) -> AsyncGenerator[str, None]:
    """The page's stream: each newer snapshot as an event whose id is its number; a comment
    when nothing new came for a while. A reconnecting browser sends Last-Event-ID and gets
    the newest snapshot at once."""
    hub.metrics.pages.inc()
    try:
        yield "retry: 2000\n\n"
        seen = 0
        while not await request.is_disconnected():
            newer = await hub.newer_than(seen, _KEEPALIVE)
            if newer is None:
                yield ": keep-alive\n\n"
                continue
            seen, document = newer
            yield f"id: {seen}\nevent: snapshot\ndata: {document}\n\n"
    finally:
        hub.metrics.pages.dec()


def _scan(query: Mapping[str, str]) -> Scan:
    """The record browser's query: ``stream``, and optionally ``key``, ``since`` and
    ``until`` (µs or ISO 8601; UTC unless it says), ``after`` (``PARTITION:OFFSET,...``),
    ``limit``, ``budget`` and ``format`` (json, text or hex)."""
    stream = query.get("stream", "")
    if not stream:
        raise ConfigError("name a stream (?stream=NAME)")
    after = None
    if query.get("after"):
        after = {}
        for part in query["after"].split(","):
            partition, _, offset = part.partition(":")
            after[int(partition)] = int(offset)
    value_format = query.get("format", "json")
    if value_format not in ("json", "text", "hex"):
        raise ConfigError(f"format is json, text or hex, not {value_format!r}")
    return Scan(
        stream,
        key=query.get("key") or None,
        since=_time(query.get("since")),
        until=_time(query.get("until")),
        after=after,
        limit=int(query.get("limit", 100)),
        budget=int(query.get("budget", 20_000)),
        value_format=value_format,  # type: ignore[arg-type]  # checked above
    )


def _time(text: str | None) -> int | None:
    """An event time given as µs since the epoch or as ISO 8601 (UTC unless it says)."""
    if not text:
        return None
    if text.lstrip("-").isdigit():
        return int(text)
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return (moment - _EPOCH) // timedelta(microseconds=1)


def _asset(name: str) -> bytes:
    return resources.files("millstream.ui").joinpath("assets", name).read_bytes()


class _SecurityHeaders:
    """Adds the security headers to every response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [
                    (k, v)
                    for k, v in message.get("headers", [])
                    if k.decode().lower() not in _SECURITY_HEADERS
                ]
                headers += [(k.encode(), v.encode()) for k, v in _SECURITY_HEADERS.items()]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, with_headers)


class TokenGate:
    """Lets a request in only with the token: as ``Authorization: Bearer TOKEN``, as the
    cookie the page gets once opened with ``?token=TOKEN`` (answered with a redirect to the
    same address without it, so the token leaves the address bar and the history), or as
    that query parameter itself (a browser's event stream cannot send headers)."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        if not token:
            raise ConfigError("the live view's token must not be empty")
        self.app = app
        self.token = token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        header = request.headers.get("authorization", "")
        offered = [
            request.query_params.get("token"),
            request.cookies.get(TOKEN_COOKIE),
            header[7:] if header.lower().startswith("bearer ") else None,
        ]
        if not any(o is not None and hmac.compare_digest(o.encode(), self.token) for o in offered):
            response: Response = PlainTextResponse(
                "millstream ui: this view needs its token; open it as "
                f"{request.url.path}?token=TOKEN",
                status_code=401,
            )
        elif "token" in request.query_params and request.url.path == "/":
            response = RedirectResponse("/", status_code=303)
            response.set_cookie(
                TOKEN_COOKIE,
                self.token.decode(),
                httponly=True,
                samesite="strict",
                secure=request.url.scheme == "https"
                or request.headers.get("x-forwarded-proto") == "https",
            )
        else:
            await self.app(scope, receive, send)
            return
        await response(scope, receive, send)


def is_loopback(host: str) -> bool:
    """Whether ``host`` is an address only this machine can reach."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
