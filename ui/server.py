"""Serving the live view: in the foreground (what ``millstream ui`` runs, :func:`serve`) or
from a thread beside a driver (:func:`start_view`: ``millstream run --ui-port``, the main job)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any

import uvicorn

from millstream.connectors.cassandra import connect
from millstream.engine.clock import Clock, SystemClock
from millstream.engine.config import MillstreamConfig
from millstream.engine.errors import ConfigError, StoreError
from millstream.ui.app import SnapshotHub, create_app, is_loopback
from millstream.ui.observer import KafkaObserver
from millstream.ui.records import Scan, scan_stream
from millstream.ui.series import read_series
from millstream.ui.snapshot import Tracker
from millstream.ui.store_view import interval_overview

__all__ = ["DEFAULT_PORT", "RunningView", "StoreReader", "address", "serve", "start_view"]

DEFAULT_PORT = 8470
STORE_FRESH_SECONDS = 5.0
"""How long one read of a computation's key intervals serves every page (their refresh)."""


def serve(
    config: MillstreamConfig,
    *,
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    token: str | None = None,
    period: float = 1.0,
    topologies: Sequence[str] = (),
    keyspace: str | None = None,
    table: str | None = None,
    clock: Clock | None = None,
    started: Callable[[str], None] | None = None,
) -> None:
    """Serve the view of the topologies on ``config``'s services at ``host``:``port`` until
    interrupted; ``started`` is told the address first.

    A host other than a loopback address needs a ``token`` (:class:`~millstream.ui.TokenGate`):
    the view shows stream contents, which must not be open to a network. ``topologies``
    narrows the view (:class:`~millstream.ui.Tracker`). ``keyspace`` and ``table`` say
    where the computations' key intervals are (default: the ``[run]`` settings').
    """
    server, observer = _server(
        config, host, port, token, period, topologies, keyspace, table, clock
    )
    if started is not None:
        started(address(host, port))
    try:
        server.run()
    finally:
        observer.close()


class StoreReader:
    """What the store holds about a computation's key intervals (:func:`interval_overview`),
    through a Cassandra session made at the first question: the view works without
    Cassandra until a page asks. A session that failed is closed and made again next time.

    An answer serves every page that asks within ``fresh`` seconds (by ``clock``; a page with
    the panel open asks every 5 s): pages share one read of the store however many are open,
    and the answer says when it was read (``read_at``, µs)."""

    def __init__(
        self,
        config: MillstreamConfig,
        keyspace: str,
        table: str,
        clock: Clock,
        fresh: float = STORE_FRESH_SECONDS,
    ) -> None:
        self.config = config
        self.keyspace = keyspace
        self.table = table
        self.clock = clock
        self.fresh = fresh
        self._lock = threading.Lock()
        self._cluster: Any = None
        self._session: Any = None
        self._answers: dict[str, dict[str, Any]] = {}  # by computation, the latest answer

    def intervals(self, computation: str, cancelled: Callable[[], bool]) -> dict[str, Any]:
        from cassandra import DriverException
        from cassandra.cluster import NoHostAvailable

        del cancelled  # one bounded read per interval, all in flight at once: nothing to stop
        with self._lock:
            now = self.clock.now()
            kept = self._answers.get(computation)
            if kept is not None and now - kept["read_at"] < self.fresh * 1_000_000:
                return kept
            try:
                if self._session is None:
                    self._cluster, self._session = connect(self.config)
                answer = interval_overview(self._session, self.keyspace, self.table, computation)
            except (DriverException, NoHostAvailable) as exc:
                self._close()
                raise StoreError(
                    f"Cassandra at {','.join(self.config.cassandra_hosts)} did not answer "
                    f"({exc}); the key intervals show once it does"
                ) from exc
            answer["read_at"] = now
            # Bounded: the answers of the computations asked about within ``fresh``.
            self._answers = {
                name: kept
                for name, kept in self._answers.items()
                if now - kept["read_at"] < self.fresh * 1_000_000
            }
            self._answers[computation] = answer
            return answer

    def close(self) -> None:
        with self._lock:
            self._close()

    def _close(self) -> None:
        if self._cluster is not None:
            self._cluster.shutdown()
        self._cluster = self._session = None


class RunningView:
    """The view served from a thread of this process; :meth:`stop` it (or use it as a
    context manager). ``address`` is where a browser opens it."""

    def __init__(self, server: uvicorn.Server, observer: _Readers, address: str) -> None:
        self.address = address
        self._server = server
        self._observer = observer
        self._exit: int | str | None = None
        self._thread = threading.Thread(target=self._run, name="millstream-ui", daemon=True)

    def _run(self) -> None:
        try:
            self._server.run()
        except SystemExit as exc:
            # uvicorn exits when it cannot bind (having logged why): _start says so.
            self._exit = exc.code

    def _start(self, timeout: float) -> None:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive():
                # uvicorn logs why (a port in use) and ends its thread.
                self._observer.close()
                raise ConfigError(
                    f"the live view could not listen at {self.address} (is the port in use?"
                    f" uvicorn exited with {self._exit!r})"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise ConfigError(f"the live view did not start at {self.address} in {timeout} s")
            time.sleep(0.05)

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._observer.close()

    def __enter__(self) -> RunningView:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def start_view(
    config: MillstreamConfig,
    *,
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    token: str | None = None,
    period: float = 1.0,
    topologies: Sequence[str] = (),
    keyspace: str | None = None,
    table: str | None = None,
    clock: Clock | None = None,
    timeout: float = 30.0,
) -> RunningView:
    """The view served from a thread of this process, listening once this returns (as
    :func:`serve`, which says what the arguments mean). Raises :class:`ConfigError` if it
    cannot listen there."""
    server, observer = _server(
        config, host, port, token, period, topologies, keyspace, table, clock
    )
    view = RunningView(server, observer, address(host, port))
    view._start(timeout)
    return view


def address(host: str, port: int) -> str:
    """The view's address, as a browser opens it."""
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/"


def _server(
    config: MillstreamConfig,
    host: str,
    port: int,
    token: str | None,
    period: float,
    topologies: Sequence[str],
    keyspace: str | None,
    table: str | None,
    clock: Clock | None,
) -> tuple[uvicorn.Server, _Readers]:
    if not is_loopback(host) and not token:
        raise ConfigError(
            f"millstream ui on {host} would be open to the network: give it a token (--token, "
            "[ui] token or MILLSTREAM_UI_TOKEN), or bind it to 127.0.0.1 and reach it through "
            "a TLS proxy (docs/guides/live-view.md)"
        )
    if not 0 < port < 65536:
        raise ConfigError(f"the live view's port must be 1 to 65535, got {port}")
    clock = clock or SystemClock()
    observer = KafkaObserver(config, clock)
    store = StoreReader(config, keyspace or config.run.keyspace, table or config.run.table, clock)
    hub = SnapshotHub(observer.observe, period=period, tracker=Tracker(topologies=topologies))

    def browse(scan: Scan, cancelled: Callable[[], bool]) -> dict[str, Any]:
        return scan_stream(config, scan, cancelled)

    server = uvicorn.Server(
        uvicorn.Config(
            create_app(
                hub,
                token=token,
                browse=browse,
                chart=lambda stream, key, anomalies, points, cancelled: read_series(
                    config, stream, key, anomalies, points, cancelled
                ),
                intervals=store.intervals,
            ),
            host=host,
            port=port,
            log_level="warning",
            lifespan="on",
            # Open pages keep their event streams open: a stop waits for them this long only.
            timeout_graceful_shutdown=2,
        )
    )
    return server, _Readers(observer, store)


class _Readers:
    """What a view reads the services with, closed together when it stops."""

    def __init__(self, observer: KafkaObserver, store: StoreReader) -> None:
        self.observer = observer
        self.store = store

    def close(self) -> None:
        self.observer.close()
        self.store.close()
