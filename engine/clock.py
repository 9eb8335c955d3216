"""Wall time behind an interface, so time-dependent behaviour is testable.

The engine never reads the system clock itself: a :class:`Clock` is injected where wall time
matters (wall-time timers, dedup ID expiry, weak-production straggler delays). Tests use a
:class:`ManualClock` and advance it by hand.
"""

from __future__ import annotations

import time
from typing import Protocol, runtime_checkable

__all__ = ["Clock", "ManualClock", "SystemClock"]


@runtime_checkable
class Clock(Protocol):
    """A source of wall time in integer microseconds since the Unix epoch, UTC."""

    def now(self) -> int:
        """The current wall time in µs since the epoch."""
        ...


class SystemClock:
    """The host's real-time clock."""

    def now(self) -> int:
        return time.time_ns() // 1_000

    def __repr__(self) -> str:
        return "SystemClock()"


class ManualClock:
    """A clock that moves only when told to, and never backwards."""

    def __init__(self, start: int = 0) -> None:
        self._now = start

    def now(self) -> int:
        return self._now

    def advance(self, micros: int) -> int:
        """Move forward by ``micros`` (non-negative); returns the new time."""
        if micros < 0:
            raise ValueError(f"a clock cannot move backwards (advance by {micros})")
        self._now += micros
        return self._now

    def set(self, now: int) -> None:
        """Jump to ``now``, which must not be earlier than the current time."""
        if now < self._now:
            raise ValueError(f"a clock cannot move backwards (from {self._now} to {now})")
        self._now = now

    def __repr__(self) -> str:
        return f"ManualClock(now={self._now})"
