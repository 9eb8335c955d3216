"""Serving the live view: in the foreground (what ``millstream ui`` runs, :func:`serve`) or
from a child process beside a driver (:func:`start_view`: ``millstream run --ui-port``, the main
job)."""

from __future__ import annotations

import contextlib
import os
import pickle
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, NoReturn

import uvicorn

from millstream.connectors.cassandra import connect
from millstream.engine.clock import Clock, SystemClock
from millstream.engine.config import MillstreamConfig
from millstream.engine.errors import ConfigError, StoreError
from millstream.ui.app import DEFAULT_PERIOD, SnapshotHub, create_app, is_loopback
from millstream.ui.observer import KafkaObserver
from millstream.ui.records import ReaderPool, Scan, scan_stream
from millstream.ui.series import read_series
from millstream.ui.snapshot import Tracker
from millstream.ui.store_view import IntervalReads

__all__ = [
    "DEFAULT_PORT",
    "VIEW_NICENESS",
    "RunningView",
    "StoreReader",
    "address",
    "serve",
    "serve_child",
    "start_view",
]

DEFAULT_PORT = 8470
VIEW_NICENESS = 10
"""How far below its driver's CPU priority a view beside it runs (:func:`start_view`)."""
STORE_FRESH_SECONDS = 5.0
"""How long one read of a computation's key intervals serves every page (their refresh)."""


def serve(
    config: MillstreamConfig,
    *,
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    token: str | None = None,
    period: float = DEFAULT_PERIOD,
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
    server, readers = _server(config, host, port, token, period, topologies, keyspace, table, clock)
    if started is not None:
        started(address(host, port))
    try:
        server.run()
    finally:
        readers.close()


class StoreReader:
    """What the store holds about a computation's key intervals
    (:func:`~millstream.ui.store_view.interval_overview`),
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
        self._reads: IntervalReads | None = None  # prepared once per session
        self._answers: dict[str, dict[str, Any]] = {}  # by computation, the latest answer

    def intervals(self, computation: str, cancelled: Callable[[], bool]) -> dict[str, Any]:
        from cassandra import DriverException
        from cassandra.cluster import NoHostAvailable
        from cassandra.query import tuple_factory

        del cancelled  # one bounded read per interval, all in flight at once: nothing to stop
        with self._lock:
            now = self.clock.now()
            # Bounded: the answers of the computations asked about within ``fresh``.
            self._answers = {
                name: kept
                for name, kept in self._answers.items()
                if now - kept["read_at"] < self.fresh * 1_000_000
            }
            if computation in self._answers:
                return self._answers[computation]
            try:
                if self._session is None:
                    self._cluster, self._session = connect(self.config)
                    # Plain tuples: the driver's default makes a namedtuple class for every
                    # page of rows, and most of the rows read here are only counted.
                    self._session.row_factory = tuple_factory
                if self._reads is None:
                    self._reads = IntervalReads(self._session, self.keyspace, self.table)
                answer = self._reads.overview(computation)
            except (DriverException, NoHostAvailable) as exc:
                self._close()
                raise StoreError(
                    f"Cassandra at {','.join(self.config.cassandra_hosts)} did not answer "
                    f"({exc}); the key intervals show once it does"
                ) from exc
            answer["read_at"] = now
            self._answers[computation] = answer
            return answer

    def close(self) -> None:
        with self._lock:
            self._close()

    def _close(self) -> None:
        if self._cluster is not None:
            self._cluster.shutdown()
        self._cluster = self._session = self._reads = None


class RunningView:
    """The view served from a process of its own, a child of this one: it shares no
    interpreter lock with this process (a driver's), and ends when this process does (its
    standard input closes). :meth:`stop` it (or use it as a context manager); ``address`` is
    where a browser opens it."""

    def __init__(self, process: subprocess.Popen[bytes], address: str) -> None:
        self.address = address
        self._process = process

    @property
    def pid(self) -> int:
        """The view's process."""
        return self._process.pid

    def _await_listening(self, timeout: float) -> None:
        """Return once the child listens; raise :class:`ConfigError` if it cannot."""
        said: list[bytes] = []
        stdout = self._process.stdout
        assert stdout is not None
        reader = threading.Thread(target=lambda: said.append(stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout)
        if said and said[0].strip() == _LISTENING:
            return
        self.stop()
        if said:
            # uvicorn logs why (a port in use) on the child's standard error, then exits.
            raise ConfigError(
                f"the live view could not listen at {self.address} (is the port in use? "
                f"its process exited with {self._process.returncode!r})"
            )
        raise ConfigError(f"the live view did not start at {self.address} in {timeout} s")

    def stop(self) -> None:
        process = self._process
        if process.stdin is not None and not process.stdin.closed:
            with contextlib.suppress(BrokenPipeError):  # it may have exited already
                process.stdin.close()  # the child's signal to stop
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()  # by its own PID
            process.wait(timeout=10)
        if process.stdout is not None:
            process.stdout.close()

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
    period: float = DEFAULT_PERIOD,
    topologies: Sequence[str] = (),
    keyspace: str | None = None,
    table: str | None = None,
    timeout: float = 30.0,
    niceness: int = VIEW_NICENESS,
    idle: bool = True,
) -> RunningView:
    """The view served from a child process, listening once this returns (as :func:`serve`,
    which says what the arguments mean). Raises :class:`ConfigError` if it cannot listen
    there. A process of its own: the view's work never holds this process's interpreter
    lock (a driver's batches), and a page that freezes cannot reach it. It runs ``niceness``
    steps below this process's CPU priority (``nice``) and, where the system has it and
    ``idle`` is true, under Linux's ``SCHED_IDLE`` policy: it runs on a core no process of
    normal priority wants, and waking up it never takes a core from one (with ``nice``
    alone a view waking for its readings can still be given a core ahead of a batch's
    thread). On a busy machine the topology's work goes first, and the view takes what is
    left; the age of every value on its pages says when that was little."""
    if not is_loopback(host) and not token:
        _server_refusal(host)  # said here, at once, as serve says it
    arguments = {
        "niceness": niceness,
        "idle": idle,
        "config": config,
        "host": host,
        "port": port,
        "token": token,
        "period": period,
        "topologies": tuple(topologies),
        "keyspace": keyspace,
        "table": table,
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "millstream.ui.child"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert process.stdin is not None
    process.stdin.write(pickle.dumps(arguments))
    process.stdin.flush()
    view = RunningView(process, address(host, port))
    view._await_listening(timeout)
    return view


def serve_child() -> None:
    """The view in a child process of :func:`start_view` (``millstream.ui.child``): the
    arguments come pickled on standard input, which stays open until the parent stops the
    view (or dies)."""
    arguments = pickle.load(sys.stdin.buffer)
    os.nice(arguments.pop("niceness"))
    if arguments.pop("idle") and hasattr(os, "SCHED_IDLE"):
        _idle_policy()
    server, readers = _server(**arguments, clock=None)

    def announce() -> None:
        while not server.started and not server.should_exit:
            time.sleep(0.05)
        if server.started:
            sys.stdout.buffer.write(_LISTENING + b"\n")
            sys.stdout.flush()

    def parent_gone() -> None:
        sys.stdin.buffer.read()  # until the parent closes it, or ends
        server.should_exit = True

    threading.Thread(target=announce, daemon=True).start()
    threading.Thread(target=parent_gone, daemon=True).start()
    try:
        server.run()
    finally:
        readers.close()


def _idle_policy() -> None:
    """This process's threads under ``SCHED_IDLE``: those running now (an import may have
    started one) and, as threads inherit it, the Kafka and Cassandra clients' to come."""
    for thread in os.listdir("/proc/self/task"):
        try:
            os.sched_setscheduler(int(thread), os.SCHED_IDLE, os.sched_param(0))
        except ProcessLookupError:
            continue  # it ended since the listing: nothing of it left to run


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
        _server_refusal(host)
    if not 0 < port < 65536:
        raise ConfigError(f"the live view's port must be 1 to 65535, got {port}")
    clock = clock or SystemClock()
    observer = KafkaObserver(config, clock)
    store = StoreReader(config, keyspace or config.run.keyspace, table or config.run.table, clock)
    hub = SnapshotHub(observer.observe, period=period, tracker=Tracker(topologies=topologies))
    scans = ReaderPool(config)

    def browse(scan: Scan, cancelled: Callable[[], bool]) -> dict[str, Any]:
        return scan_stream(config, scan, cancelled, readers=scans)

    server = uvicorn.Server(
        uvicorn.Config(
            create_app(
                hub,
                token=token,
                browse=browse,
                chart=lambda stream, key, anomalies, points, cancelled: read_series(
                    config, stream, key, anomalies, points, cancelled, readers=scans
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
    return server, _Readers(observer, store, scans)


class _Readers:
    """What a view reads the services with, closed together when it stops."""

    def __init__(self, observer: KafkaObserver, store: StoreReader, scans: ReaderPool) -> None:
        self.observer = observer
        self.store = store
        self.scans = scans

    def close(self) -> None:
        self.observer.close()
        self.store.close()
        self.scans.close()


def _server_refusal(host: str) -> NoReturn:
    raise ConfigError(
        f"millstream ui on {host} would be open to the network: give it a token (--token, "
        "[ui] token or MILLSTREAM_UI_TOKEN), or bind it to 127.0.0.1 and reach it through "
        "a TLS proxy (docs/guides/live-view.md)"
    )


_LISTENING = b"millstream-ui listening"
