"""Cassandra plumbing shared by the engine, examples and tests."""

from __future__ import annotations

import re
import socket

from cassandra.cluster import Cluster, Session
from cassandra.policies import ExponentialReconnectionPolicy

from millstream.engine.config import MillstreamConfig

__all__ = ["connect", "create_keyspace", "drop_keyspace"]

_IDENTIFIER = re.compile(r"^[a-z][a-z0-9_]{0,47}$")


def connect(config: MillstreamConfig, keyspace: str | None = None) -> tuple[Cluster, Session]:
    """A cluster handle and a session; the caller shuts the cluster down."""
    cluster = Cluster(
        contact_points=list(config.cassandra_hosts),
        port=config.cassandra_port,
        protocol_version=5,
        # The driver leaves Nagle on: a request of a few KB then waits ~40 ms for the
        # server's delayed ACK, which caps commits per second (bench/core_commits.py).
        sockopts=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)],
        # A node back from a restart is found within seconds (the default backs off to ten
        # minutes, far longer than a driver waits out an outage).
        reconnection_policy=ExponentialReconnectionPolicy(base_delay=0.5, max_delay=5.0),
    )
    return cluster, cluster.connect(keyspace)


def create_keyspace(session: Session, name: str, replication: int = 1) -> None:
    """Create a SimpleStrategy keyspace with ``replication`` replicas, unless it exists.

    Callers pass ``config.cassandra_replication``. An existing keyspace keeps its replication.
    """
    _check_identifier(name)
    session.execute(
        f"CREATE KEYSPACE IF NOT EXISTS {name} WITH replication = "
        f"{{'class': 'SimpleStrategy', 'replication_factor': {replication}}}"
    )


def drop_keyspace(session: Session, name: str) -> None:
    _check_identifier(name)
    session.execute(f"DROP KEYSPACE IF EXISTS {name}")


def _check_identifier(name: str) -> None:
    # Keyspace names cannot be bound as parameters; refuse anything but a plain identifier.
    if not _IDENTIFIER.match(name):
        raise ValueError(f"{name!r} is not a valid keyspace name (lowercase letters, digits, _)")
