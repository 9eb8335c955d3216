"""A service that answers late: a TCP port on 127.0.0.1 that refuses connections until the
test opens it, then forwards each one to a real service (Cassandra, say).

A process pointed at the port starts while its service is, to it, down, and must wait until
the port opens, without a service of the test's own or stopping the shared one.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable
from types import TracebackType

__all__ = ["LateService"]


class LateService:
    """Connections to :attr:`port` are refused until :meth:`open`; then each is forwarded
    to ``target``, byte for byte both ways, until :meth:`close`."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        # Bound, not listening: the port is the test's alone and refuses connections.
        self._server: socket.socket | None = socket.socket()
        self._server.bind(("127.0.0.1", 0))
        self.port: int = self._server.getsockname()[1]
        self._sockets: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self.accepted = 0

    def open(self) -> None:
        assert self._server is not None, "closed"
        self._server.listen()
        self._spawn(self._accept, self._server)

    def close(self) -> None:
        with self._lock:
            sockets, self._sockets = self._sockets, []
            server, self._server = self._server, None
        for sock in [*sockets, *([server] if server else [])]:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(10)

    def __enter__(self) -> LateService:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def _spawn(self, target: Callable[..., object], *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        with self._lock:
            self._threads.append(thread)
        thread.start()

    def _accept(self, server: socket.socket) -> None:
        while True:
            try:
                client, _ = server.accept()
            except OSError:
                return  # closed
            upstream = socket.create_connection(self.target)
            with self._lock:
                if self._server is None:
                    client.close()
                    upstream.close()
                    return
                self._sockets += [client, upstream]
                self.accepted += 1
            self._spawn(self._pump, client, upstream)
            self._spawn(self._pump, upstream, client)

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)
