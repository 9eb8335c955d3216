"""Timers: per-key hooks that fire at an event time or a wall time (paper 4.6).

A key holds at most one timer per tag: setting a tag again replaces its timer, deleting an
unset tag does nothing. Timers live in the interval's store partition and are deleted in the
same commit as the effects of their firing, so each setting fires exactly once.

Firing rule, with ``W`` the computation's input low watermark and ``now`` the injected clock:

* an ``EVENT_TIME`` timer at ``t`` is due when ``t < W``. ``W`` bounds the timestamps of all
  future input (every later record has timestamp ``>= W``), so once ``t < W`` no record at or
  before ``t`` can still arrive. A timer at the last microsecond of a window fires as soon as the
  watermark moves past that window.
* a ``WALL_TIME`` timer at ``t`` is due when ``t <= now``.

Due timers of a key fire one at a time in increasing ``(timestamp, domain, tag)`` order; the
tie-breakers only make the order deterministic. A firing may set new timers; those that are
already due fire in the same pass, in order among what is left.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from millstream.engine.records import timer_identity

__all__ = [
    "RESERVED_TAG_PREFIX",
    "STATE_TTL_TAG",
    "TimeDomain",
    "Timer",
    "due_bound",
    "due_timers",
    "firing_order",
    "is_due_at",
]

RESERVED_TAG_PREFIX = "millstream."
"""Timer tags the engine keeps for itself; user code cannot set or delete them."""

STATE_TTL_TAG = RESERVED_TAG_PREFIX + "state-ttl"
"""The event-time timer that expires a key's state (``ComputationOptions.state_ttl``)."""


class TimeDomain(enum.Enum):
    """Which clock a timer waits for."""

    EVENT_TIME = "event_time"
    WALL_TIME = "wall_time"


_DOMAIN_ORDER = {TimeDomain.EVENT_TIME: 0, TimeDomain.WALL_TIME: 1}


@dataclass(frozen=True, slots=True)
class Timer:
    """A timer of ``key`` named ``tag``, due at ``timestamp`` (µs) in ``domain``.

    ``set_by`` is the cause ID (input record ID or timer identity) of the call that set it; it
    makes :attr:`identity` unique per setting (see ``records.timer_identity``).
    """

    key: str
    tag: str
    timestamp: int
    domain: TimeDomain = TimeDomain.EVENT_TIME
    set_by: bytes = b""

    def __post_init__(self) -> None:
        if not isinstance(self.tag, str):
            raise TypeError(f"timer tag must be str, got {type(self.tag).__name__}")
        if not isinstance(self.timestamp, int) or isinstance(self.timestamp, bool):
            raise TypeError(
                f"timer timestamp must be int microseconds, got {type(self.timestamp).__name__}"
            )
        if not isinstance(self.domain, TimeDomain):
            raise TypeError(f"timer domain must be a TimeDomain, got {self.domain!r}")

    @property
    def identity(self) -> bytes:
        """16 bytes naming this setting of the timer; the cause of its firing's productions."""
        return timer_identity(self.key, self.tag, self.timestamp, self.set_by)

    def is_due(self, input_low_watermark: int, now: int) -> bool:
        """Whether the timer fires, by the rule in the module docstring."""
        return is_due_at(self.domain, self.timestamp, input_low_watermark, now)


def due_bound(domain: TimeDomain, input_low_watermark: int, now: int) -> int:
    """The first timestamp of ``domain`` not yet due: by the rule in the module docstring, a
    timer fires exactly when its timestamp is below it (event time below the watermark, wall
    time at or below now). A store reads an interval's due timers as the range up to it."""
    return input_low_watermark if domain is TimeDomain.EVENT_TIME else now + 1


def is_due_at(domain: TimeDomain, timestamp: int, input_low_watermark: int, now: int) -> bool:
    """Whether a timer of ``domain`` at ``timestamp`` fires, by the rule in the module
    docstring (also for timestamps known without their timer: an interval's earliest)."""
    return timestamp < due_bound(domain, input_low_watermark, now)


def firing_order(timer: Timer) -> tuple[int, int, str]:
    """Sort key of the order in which a key's due timers fire."""
    return timer.timestamp, _DOMAIN_ORDER[timer.domain], timer.tag


def due_timers(timers: Iterable[Timer], input_low_watermark: int, now: int) -> list[Timer]:
    """The due timers among ``timers``, in firing order."""
    return sorted((t for t in timers if t.is_due(input_low_watermark, now)), key=firing_order)
