"""Cassandra plumbing shared by the engine, examples and tests."""

from __future__ import annotations

import re
import socket
import ssl

from cassandra import AuthenticationFailed
from cassandra.auth import PlainTextAuthProvider
from cassandra.cluster import Cluster, NoHostAvailable, Session
from cassandra.policies import ExponentialReconnectionPolicy

from millstream.engine.config import MillstreamConfig, setting_name
from millstream.engine.errors import ConfigError
from millstream.engine.stores.cassandra import execute_schema_change

__all__ = ["connect", "create_keyspace", "drop_keyspace", "refusal"]

_IDENTIFIER = re.compile(r"^[a-z][a-z0-9_]{0,47}$")


def connect(config: MillstreamConfig, keyspace: str | None = None) -> tuple[Cluster, Session]:
    """A cluster handle and a session; the caller shuts the cluster down.

    With ``config.cassandra_username`` the session logs in (PasswordAuthenticator); with
    ``config.cassandra_tls`` it encrypts, verifying each node's certificate, for the node's
    address, against ``config.cassandra_ca_file`` (the system's CAs without one). Refused
    credentials and failed TLS raise :class:`ConfigError` naming the settings to fix.
    """
    auth = None
    if config.cassandra_username is not None and config.cassandra_password is not None:
        auth = PlainTextAuthProvider(config.cassandra_username, config.cassandra_password.reveal())
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
        auth_provider=auth,
        ssl_context=_tls_context(config) if config.cassandra_tls else None,
    )
    try:
        return cluster, cluster.connect(keyspace)
    except BaseException as exc:
        cluster.shutdown()  # its threads: a starting process tries again (services.py)
        refused = refusal(config, exc) if isinstance(exc, NoHostAvailable) else None
        if refused is None:
            raise
        raise refused from None  # the driver's errors would repeat for every contact point


def refusal(config: MillstreamConfig, error: NoHostAvailable) -> ConfigError | None:
    """The :class:`ConfigError` for a connection failure caused by the security settings
    (credentials refused or missing, TLS failed), or None for any other. It names the
    settings to fix and never shows the password."""
    reasons = list(error.errors.values())
    where = f"Cassandra at {', '.join(config.cassandra_hosts)}:{config.cassandra_port}"
    for reason in reasons:
        if isinstance(reason, AuthenticationFailed):
            who = (
                f"the credentials of user {config.cassandra_username!r}"
                if config.cassandra_username is not None
                else "the connection: it requires credentials, and none are set"
            )
            return ConfigError(
                f"{where} refused {who} ({reason}); set "
                f"{setting_name('cassandra', 'username', 'password')}"
            )
    for reason in reasons:
        # The driver reports a failed handshake as an OSError quoting the SSL error.
        if isinstance(reason, ssl.SSLError) or "[SSL" in str(reason):
            return ConfigError(
                f"TLS to {where} failed ({reason}); check {setting_name('cassandra', 'ca_file')}"
                f" (the CA that signed the nodes' certificates) and "
                f"{setting_name('cassandra', 'tls')}"
            )
    return None


def _tls_context(config: MillstreamConfig) -> ssl.SSLContext:
    # Verifies the chain and that the certificate names the address we connect to.
    context = ssl.create_default_context(
        ssl.Purpose.SERVER_AUTH,
        cafile=str(config.cassandra_ca_file) if config.cassandra_ca_file else None,
    )
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def create_keyspace(session: Session, name: str, replication: int = 1) -> None:
    """Create a SimpleStrategy keyspace with ``replication`` replicas, unless it exists.

    Callers pass ``config.cassandra_replication``. An existing keyspace keeps its replication.
    """
    _check_identifier(name)
    execute_schema_change(
        session,
        f"CREATE KEYSPACE IF NOT EXISTS {name} WITH replication = "
        f"{{'class': 'SimpleStrategy', 'replication_factor': {replication}}}",
    )


def drop_keyspace(session: Session, name: str) -> None:
    _check_identifier(name)
    execute_schema_change(session, f"DROP KEYSPACE IF EXISTS {name}")


def _check_identifier(name: str) -> None:
    # Keyspace names cannot be bound as parameters; refuse anything but a plain identifier.
    if not _IDENTIFIER.match(name):
        raise ValueError(f"{name!r} is not a valid keyspace name (lowercase letters, digits, _)")
