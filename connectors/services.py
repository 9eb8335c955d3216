"""Which of the services a run needs does not answer, and what to do about it.

A driver or injector that cannot reach Kafka or Cassandra as it starts fails with whatever its
client says (a bare ``TimeoutError`` from Kafka's admin client, ``NoHostAvailable`` from
Cassandra's driver). :func:`reaching` turns such a failure into a
:class:`~millstream.engine.errors.ServiceOutageError` that names the service, the address
it was looked for at, and what to do, after trying to connect to each service
(:func:`unreachable`); a failure while every service answers is raised as it was.

A process starts through an outage as a running one works through it
(:func:`start_through_outage`): one restarted while Kafka or Cassandra restarts too (its
supervisor does not wait for the service) starts once the service is back instead of exiting,
and every wait says which service does not answer and what to do, so that someone who has not
started the stack learns it at once.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from millstream.engine.config import MillstreamConfig, setting_name
from millstream.engine.errors import ServiceOutageError
from millstream.engine.outages import Outage, first_line, is_outage

__all__ = ["reaching", "start_through_outage", "unreachable"]

_T = TypeVar("_T")

_WHAT_TO_DO = (
    "Is it running? `millstream status` shows the local stack and `millstream up` starts it"
)


def unreachable(config: MillstreamConfig, timeout: float = 2.0) -> list[str]:
    """The services that refuse or ignore a connection at every address ``config`` gives
    them, each as ``"Kafka at HOST:PORT (why)"``; empty if all answer."""
    kafka = [_address(server) for server in config.kafka_bootstrap.split(",") if server.strip()]
    cassandra = [(host, config.cassandra_port) for host in config.cassandra_hosts]
    down = []
    for name, addresses in (("Kafka", kafka), ("Cassandra", cassandra)):
        reasons = [_refusal(address, timeout) for address in addresses]
        if addresses and all(reasons):
            where = ", ".join(f"{host}:{port}" for host, port in addresses)
            down.append(f"{name} at {where} ({reasons[0]})")
    return down


@contextmanager
def reaching(config: MillstreamConfig) -> Iterator[None]:
    """Raise a :class:`ServiceOutageError` naming what to do for an outage the block fails
    on while a service does not answer (see the module docstring)."""
    try:
        yield
    except Exception as exc:
        if isinstance(exc, ServiceOutageError) or not is_outage(exc):
            raise
        down = unreachable(config)
        if not down:
            raise
        settings = []
        if any(service.startswith("Kafka") for service in down):
            settings.append(setting_name("kafka", "bootstrap"))
        if any(service.startswith("Cassandra") for service in down):
            settings.append(setting_name("cassandra", "hosts", "port"))
        raise ServiceOutageError(
            f"{' and '.join(down)} cannot be reached. {_WHAT_TO_DO}; services elsewhere are "
            f"set by {' and '.join(settings)}. (The error: {first_line(exc)})",
            down=tuple(down),
        ) from exc


def start_through_outage(
    config: MillstreamConfig,
    what: str,
    start: Callable[[], _T],
    timeout: float,
    *,
    sleep: Callable[[float], object] = time.sleep,
    monotonic: Callable[[], float] = time.monotonic,
) -> _T:
    """``start`` (a process's provisioning and connecting), tried until it succeeds while its
    failures are outages, for up to ``timeout`` seconds: the outage timeout the process keeps
    once it runs. Each wait is logged, naming the services that do not answer and where they
    were looked for (:func:`reaching`), the first one with what to do if they stopped; past
    the timeout, :class:`ServiceOutageError`. Any other failure is raised at once."""

    def attempt() -> _T:
        with reaching(config):
            return start()

    # The advice at the first wait: a process starting has no run of its own to go by.
    outage = Outage(what, timeout, sleep=sleep, monotonic=monotonic, advise_after=0.0)
    return outage.retry(attempt)


def _address(server: str) -> tuple[str, int]:
    server = server.strip().rpartition("://")[2]
    host, _, port = server.rpartition(":")
    return host.strip("[]") or "localhost", int(port or 9092)


def _refusal(address: tuple[str, int], timeout: float) -> str | None:
    """Why a connection to ``address`` failed, or None if it was accepted."""
    try:
        socket.create_connection(address, timeout=timeout).close()
    except ConnectionRefusedError:
        return "connection refused"
    except TimeoutError:
        return f"no answer within {timeout:g} s"
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    return None
