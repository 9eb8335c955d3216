"""Serving the live view: what ``millstream ui`` runs."""

from __future__ import annotations

from collections.abc import Callable

import uvicorn

from millstream.engine.clock import Clock, SystemClock
from millstream.engine.config import MillstreamConfig
from millstream.engine.errors import ConfigError
from millstream.ui.app import SnapshotHub, create_app, is_loopback
from millstream.ui.observer import KafkaObserver

__all__ = ["DEFAULT_PORT", "serve"]

DEFAULT_PORT = 8470


def serve(
    config: MillstreamConfig,
    *,
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    token: str | None = None,
    period: float = 1.0,
    clock: Clock | None = None,
    started: Callable[[str], None] | None = None,
) -> None:
    """Serve the view of the topologies on ``config``'s services at ``host``:``port`` until
    interrupted; ``started`` is told the address first.

    A host other than a loopback address needs a ``token`` (:class:`~millstream.ui.TokenGate`):
    the view shows stream contents, which must not be open to a network.
    """
    if not is_loopback(host) and not token:
        raise ConfigError(
            f"millstream ui on {host} would be open to the network: give it a token (--token "
            "or MILLSTREAM_UI_TOKEN), or bind it to 127.0.0.1 and reach it through a TLS proxy "
            "(docs/guides/live-view.md)"
        )
    if not 0 < port < 65536:
        raise ConfigError(f"the live view's port must be 1 to 65535, got {port}")
    observer = KafkaObserver(config, clock or SystemClock())
    hub = SnapshotHub(observer.observe, period=period)
    app = create_app(hub, token=token)
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level="warning",
            lifespan="on",
            # Open pages keep their event streams open: a stop waits for them this long only.
            timeout_graceful_shutdown=2,
        )
    )
    if started is not None:
        shown = f"[{host}]" if ":" in host else host
        started(f"http://{shown}:{port}/")
    try:
        server.run()
    finally:
        observer.close()
