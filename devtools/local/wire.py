"""Bytes off a socket, for the local stack's small protocol clients: the CQL readiness probe
(:mod:`~millstream.devtools.local.cassandra`) and the bare Kafka Produce request
(:mod:`~millstream.devtools.local.hanging_transactions`)."""

from __future__ import annotations

import socket

__all__ = ["read_exactly"]


def read_exactly(connection: socket.socket, size: int) -> bytes:
    """The next ``size`` bytes of ``connection``; :class:`ConnectionError` if it closes first."""
    data = bytearray()
    while len(data) < size:
        chunk = connection.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the connection closed mid-frame")
        data += chunk
    return bytes(data)
