"""Waiting out an outage of Kafka or Cassandra instead of failing (or crash-looping).

A broker or node that is restarting, or a network that drops for a minute, is not a reason
for a driver or an injector to die: everything millstream writes is idempotent or fenced, so
the work that failed can simply run again once the service is back. What is *not* an outage
(a fenced write, a bug in user code, a killed Python worker) still fails as before.

Errors cross process boundaries here as text (a Python worker's exception reaches the driver
inside a Py4J error), so an outage is told by the names of the errors the Cassandra and
Kafka clients raise when a service cannot be reached or does not answer in time
(:data:`OUTAGE_MARKERS`), looked for in the exception's type names and message.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Final, TypeVar

from millstream.engine.errors import ServiceOutageError

__all__ = [
    "DEFAULT_OUTAGE_TIMEOUT",
    "OUTAGE_MARKERS",
    "Outage",
    "ServiceOutageError",
    "first_line",
    "is_outage",
    "unreachable_service",
]

_log = logging.getLogger(__name__)
_T = TypeVar("_T")

DEFAULT_OUTAGE_TIMEOUT: Final = 900.0
"""Seconds a driver or injector waits for Kafka or Cassandra to come back before it fails."""

_CASSANDRA_MARKERS: Final = (
    # cassandra-driver: no node reachable, none answered in time, too few replicas alive.
    "NoHostAvailable",
    "OperationTimedOut",
    "Unavailable",
    "ReadTimeout",
    "WriteTimeout",
    "ConnectionShutdown",
    "ConnectionException",
    # millstream's store: writes whose outcome stayed unknown (resolved on the next attempt).
    "UnknownOutcomeError",
)

_KAFKA_MARKERS: Final = (
    # confluent-kafka and the JVM Kafka client: brokers unreachable, requests timed out.
    "_TRANSPORT",
    "_ALL_BROKERS_DOWN",
    "_MSG_TIMED_OUT",
    "_TIMED_OUT",
    "NOT_LEADER_FOR_PARTITION",
    "LEADER_NOT_AVAILABLE",
    # A partition between two leaders, for longer than a call's own retries.
    "OFFSET_NOT_AVAILABLE",
    "UNKNOWN_LEADER_EPOCH",
    "FENCED_LEADER_EPOCH",
    "REPLICA_NOT_AVAILABLE",
    "REQUEST_TIMED_OUT",
    # A broker dropped out of the metadata (killed): librdkafka destroyed its handle.
    "_DESTROY_BROKER",
    "NotLeaderOrFollowerException",
    "org.apache.kafka.common.errors.TimeoutException",
    "DisconnectException",
    # millstream's transactional productions: the transaction coordinator did not answer.
    "TransactionUnavailableError",
)

OUTAGE_MARKERS: Final = (
    *_CASSANDRA_MARKERS,
    *_KAFKA_MARKERS,
    "Connection refused",
    # millstream's own: a service was unreachable.
    "ServiceOutageError",
)

_LOCAL_STACK: Final = "`millstream status` shows the local stack, `millstream up` starts it"

# Never an outage, whatever else the text holds: retrying cannot help a fenced zombie.
_NOT_OUTAGES: Final = ("FencedError", "InjectorRetiredError")


def is_outage(exc: BaseException) -> bool:
    """Whether ``exc`` (or its text) says a service could not be reached or timed out."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    text = f"{' '.join(names)} {exc}"
    if any(marker in text for marker in _NOT_OUTAGES):
        return False
    return isinstance(exc, TimeoutError) or any(marker in text for marker in OUTAGE_MARKERS)


def unreachable_service(exc: BaseException) -> str:
    """Which service an outage error speaks of: ``"Kafka"``, ``"Cassandra"``, or
    ``"Kafka or Cassandra"`` when its text does not tell (``"Kafka and Cassandra"`` when
    both were found not answering)."""
    down = getattr(exc, "down", ())
    if down:  # a ServiceOutageError raised after looking (millstream.connectors.services)
        return " and ".join(service.partition(" at ")[0] for service in down)
    text = f"{' '.join(cls.__name__ for cls in type(exc).__mro__)} {exc}"
    kafka = any(marker in text for marker in _KAFKA_MARKERS)
    cassandra = any(marker in text for marker in _CASSANDRA_MARKERS)
    if kafka != cassandra:
        return "Kafka" if kafka else "Cassandra"
    return "Kafka or Cassandra"


class Outage:
    """Tracks one stretch of failures that are outages: how long to sleep before the next
    try (growing to ``max_delay``), and when ``timeout`` seconds have gone by. The first wait
    ``advise_after`` seconds into a stretch says what to do if the service stopped.

    ``reconnect``, if given, is called after every ``reconnect_every`` waits of a stretch, or
    at the first wait ``reconnect_after`` seconds or more after the stretch began or the last
    reconnect (attempts that each retry for long, such as a metadata request for its whole
    timeout, make few waits): a client can stay wedged after its service came back (a
    librdkafka consumer whose broker was frozen for a minute kept failing every metadata
    request for minutes after it resumed), and a new one is the cure. A stretch begins when
    its first failed attempt began (:meth:`attempting`), so an attempt that spent 30 s
    failing gets new clients at its first wait.
    """

    def __init__(
        self,
        what: str,
        timeout: float = DEFAULT_OUTAGE_TIMEOUT,
        *,
        max_delay: float = 5.0,
        sleep: Callable[[float], object] = time.sleep,
        monotonic: Callable[[], float] = time.monotonic,
        reconnect: Callable[[], None] | None = None,
        reconnect_every: int = 3,
        reconnect_after: float = 20.0,
        advise_after: float = 30.0,
    ) -> None:
        self.what = what
        self.reconnect = reconnect
        self.reconnect_every = reconnect_every
        self.reconnect_after = reconnect_after
        self._reconnected: float | None = None
        self.timeout = timeout
        self.max_delay = max_delay
        self._sleep = sleep
        self._monotonic = monotonic
        self._since: float | None = None
        self._attempt: float | None = None
        self._delay = 0.5
        self.waits = 0
        self.advise_after = advise_after
        self._advised = False

    def wait(self, exc: BaseException, description: str | None = None) -> None:
        """Sleep before the next try; raise :class:`ServiceOutageError` once past the timeout.

        ``description`` tells the error in the log and the message (default: the services
        a :class:`ServiceOutageError` found not answering, else its first line).
        """
        # An error raised after looking (ServiceOutageError.down) is told by where: the
        # services found not answering, in a line the console shows whole.
        told = description or "; ".join(getattr(exc, "down", ())) or first_line(exc)
        service = unreachable_service(exc)
        now = self._monotonic()
        if self._since is None:
            self._since = now if self._attempt is None else self._attempt
        elapsed = now - self._since
        if elapsed >= self.timeout:
            raise ServiceOutageError(
                f"{self.what}: {service} unreachable for {elapsed:.0f} s "
                f"(outage timeout {self.timeout:.0f} s); last error: {told}. "
                f"Bring {service} back ({_LOCAL_STACK}) and restart; nothing is lost (the "
                "work runs again)"
            ) from exc
        self.waits += 1
        # What to do, once: when the outage has lasted (a timeout or two is a busy service).
        advise = elapsed >= self.advise_after and not self._advised
        self._advised |= advise
        _log.warning(
            "%s: waiting for %s (%.0f s so far%s): %s",
            self.what,
            service,
            elapsed,
            f"; if it stopped, {_LOCAL_STACK}" if advise else "",
            told,
        )
        self._sleep(self._delay)
        self._delay = min(self.max_delay, self._delay * 2)
        if self.reconnect is None:
            return
        last = self._since if self._reconnected is None else self._reconnected
        if (
            self.waits % self.reconnect_every == 0
            or self._monotonic() - last >= self.reconnect_after
        ):
            _log.warning("%s: reconnecting to Kafka and Cassandra", self.what)
            self.reconnect()
            self._reconnected = self._monotonic()

    def attempting(self) -> None:
        """An attempt begins now: if it fails as an outage that begins a stretch, the
        stretch began here (the time it spent failing counts)."""
        self._attempt = self._monotonic()

    def over(self) -> None:
        """The service answered: the next failure starts a new stretch."""
        self._since = None
        self._attempt = None
        self._reconnected = None
        self._delay = 0.5
        self.waits = 0
        self._advised = False

    def retry(self, action: Callable[[], _T]) -> _T:
        """Run ``action`` until it succeeds, waiting out outages; other errors propagate."""
        while True:
            self.attempting()
            try:
                result = action()
            except Exception as exc:
                if not is_outage(exc):
                    raise
                self.wait(exc)
                continue
            self.over()
            return result


def first_line(exc: BaseException) -> str:
    """An error in one line for a log or a message: its type and the first line of its text
    (at most 300 characters; Py4J and driver errors run to pages)."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:300]}" if lines else type(exc).__name__
