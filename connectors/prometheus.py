"""Serving metrics to Prometheus: one HTTP endpoint per registry.

A driver (:mod:`millstream.spark.prometheus`) and an injector process
(:mod:`millstream.injectors.prometheus`) each fill a ``prometheus_client.CollectorRegistry``
of their own, never the library's global one, so several topologies or injectors in one
Python process (tests, notebooks) do not clash; :func:`serve_metrics` exposes one at
``http://ADDRESS:PORT/metrics``. The address defaults to the loopback interface: exposing
metrics to other hosts is a choice (``0.0.0.0:PORT``).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from millstream.engine.config import DEFAULT_METRICS_ADDRESS
from millstream.engine.errors import ConfigError

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from prometheus_client import CollectorRegistry

__all__ = ["DEFAULT_METRICS_ADDRESS", "MetricsServer", "listen_address", "serve_metrics"]


def listen_address(text: str) -> tuple[str, int]:
    """``PORT`` or ``ADDRESS:PORT`` (``[::1]:PORT`` for IPv6) as ``(address, port)``; the
    address defaults to :data:`DEFAULT_METRICS_ADDRESS`. Port 0 means off to the caller."""
    address, colon, port = text.strip().rpartition(":")
    address = address.strip("[]") if colon else DEFAULT_METRICS_ADDRESS
    try:
        number = int(port)
    except ValueError:
        number = -1
    if not 0 <= number <= 65535 or (colon and not address):
        raise ConfigError(
            f"{text!r} is not a metrics listen address; write PORT or ADDRESS:PORT, e.g. 9400 "
            "or 0.0.0.0:9400"
        )
    return address, number


class MetricsServer:
    """A running ``/metrics`` endpoint; :meth:`close` stops it and frees its port."""

    def __init__(self, server: WSGIServer, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread
        host, port = server.server_address[:2]
        self.address = host if isinstance(host, str) else host.decode()
        self.port = int(port)

    @property
    def url(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def serve_metrics(
    registry: CollectorRegistry, port: int, address: str = DEFAULT_METRICS_ADDRESS
) -> MetricsServer:
    """Serve ``registry`` at ``http://address:port/metrics`` from a daemon thread (port 0:
    any free port, see :attr:`MetricsServer.port`); raises :class:`ConfigError` if the
    address cannot be bound."""
    from prometheus_client import start_http_server

    try:
        server, thread = start_http_server(port, addr=address, registry=registry)
    except OSError as exc:
        raise ConfigError(
            f"cannot serve metrics on {address}:{port} ({exc}); pick another port"
        ) from exc
    return MetricsServer(server, thread)
