"""Waiting in tests for what a real service, process or browser does in its own time.

One loop for every test that polls: a condition asked again until it holds or a timeout
passes, and a failure that says what was awaited. A condition that raises fails the test at
once, unless the test names the exceptions that mean "not yet" (a node that is restarting).
And one way to run a blocking call (an injector's loop, a topology's start) beside the test:
:class:`InBackground`, whose failure the test thread raises.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["InBackground", "wait_until"]

_T = TypeVar("_T")


def wait_until(
    what: str | Callable[[], str],
    condition: Callable[[], _T],
    timeout: float = 30.0,
    *,
    every: float = 0.1,
    meanwhile: Callable[[], object] | None = None,
    not_yet: tuple[type[Exception], ...] = (),
) -> _T:
    """``condition()``'s first truthy answer, asked every ``every`` seconds for at most
    ``timeout`` seconds (at least once); else an :class:`AssertionError` naming ``what``
    (called then if it is a function, so it can report the state at the time).

    ``meanwhile`` runs before each ask: a check that fails at once (an ended process, a
    failed driver) rather than waiting out the timeout. Exceptions of ``not_yet`` raised by
    ``condition`` count as "not yet"; the last one is in the failure."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while True:
        if meanwhile is not None:
            meanwhile()
        try:
            answer = condition()
        except not_yet as exc:
            last = exc
        else:
            if answer:
                return answer
        if time.monotonic() >= deadline:
            described = what() if callable(what) else what
            reason = f" (last: {last!r})" if last is not None else ""
            raise AssertionError(f"not within {timeout:g} s: {described}{reason}")
        time.sleep(every)


class InBackground:
    """``target()`` on a daemon thread of its own, started at once. What it raises is kept
    for the test thread, where :meth:`check` raises it (``what`` names the call), and is
    raised in the thread too, which pytest reports."""

    def __init__(self, what: str, target: Callable[[], object]) -> None:
        self.what = what
        self.failures: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, args=(target,), daemon=True)
        self.thread.start()

    def _run(self, target: Callable[[], object]) -> None:
        try:
            target()
        except BaseException as exc:
            self.failures.append(exc)
            raise

    def check(self) -> None:
        """Fail the test if the call failed."""
        assert not self.failures, f"{self.what} failed: {self.failures[0]!r}"

    def alive(self) -> bool:
        return self.thread.is_alive()

    def join(self, timeout: float) -> None:
        self.thread.join(timeout)
