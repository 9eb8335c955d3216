"""Named places where a fault harness can make the engine itself fail.

Poison-pill isolation (:mod:`millstream.spark.isolation`) exists for failures that are not
user code's (which is dead-lettered per record) nor an outage (which is waited out): a
decoder, a library or a worker crashing on one record. A test or the proving ground needs
such a failure on demand, on one chosen record, so the engine names where it can fail, and a
harness that set ``MILLSTREAM_FAULT_POINTS`` to a directory *arms* a fault there by creating
one file per fault, ``<dir>/fault.<place>.<computation>.<subject>`` (:func:`arm_fault`):

- ``executor.record``: an interval task, about to run its interval's input, raises
  :class:`InjectedFault` if a delivery's record ID, in hex, is an armed subject;
- ``executor.task``: an interval task, as it starts (with or without rows, ticks included),
  raises :class:`InjectedFault` if :data:`ALWAYS` is armed: a failure of every batch that no
  record causes.

A fault stays armed until its file is removed, across restarts. Unset (always, outside fault
tests) a place costs one comparison per task. The variable is read once, at import: the Spark
Python workers inherit it from the driver's environment in ``local`` mode; a test that runs
Spark in its own process sets it in ``spark.sparkContext.environment`` (Spark then starts
Python workers of their own for that environment).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

__all__ = [
    "ALWAYS",
    "ENVIRONMENT_VARIABLE",
    "PLACES",
    "InjectedFault",
    "arm_fault",
    "armed_faults",
    "fault_point",
]

ENVIRONMENT_VARIABLE: Final = "MILLSTREAM_FAULT_POINTS"

PLACES: Final = {
    "executor.record": "an interval task, before its input runs; subject: a record ID in hex",
    "executor.task": "an interval task as it starts, with or without rows; subject: always",
}

ALWAYS: Final = "always"

_DIRECTORY: Final = os.environ.get(ENVIRONMENT_VARIABLE) or None
_NONE: Final[frozenset[str]] = frozenset()


class InjectedFault(Exception):  # noqa: N818  (a fault, not an error of the engine's own)
    """Raised where a harness armed a fault: stands for a bug of the engine or a library.

    Deliberately outside :class:`~millstream.engine.errors.MillstreamError` and raised
    outside user code, so that nothing dead-letters it as a user-code failure.
    """


def arm_fault(directory: Path, place: str, computation: str, subject: str = ALWAYS) -> Path:
    """Arm a fault at ``place`` of ``computation`` for ``subject`` (the file, to remove to
    disarm it); the processes must run with ``MILLSTREAM_FAULT_POINTS=directory``."""
    if place not in PLACES:
        raise ValueError(f"unknown fault place {place!r}; the places are {sorted(PLACES)}")
    directory.mkdir(parents=True, exist_ok=True)
    armed = directory / f"fault.{place}.{computation}.{subject}"
    armed.touch()
    return armed


def armed_faults(place: str, computation: str) -> frozenset[str]:
    """The subjects armed at ``place`` of ``computation`` now (empty when unset)."""
    if _DIRECTORY is None:
        return _NONE
    prefix = f"fault.{place}.{computation}."
    try:
        names = os.listdir(_DIRECTORY)
    except FileNotFoundError:
        return _NONE
    return frozenset(name.removeprefix(prefix) for name in names if name.startswith(prefix))


def fault_point(
    place: str, computation: str, subject: str = ALWAYS, armed: frozenset[str] | None = None
) -> None:
    """Raise :class:`InjectedFault` if ``subject`` is armed at ``place`` of ``computation``
    (in ``armed``, if given: :func:`armed_faults` read once for many subjects)."""
    if _DIRECTORY is None:
        return
    if subject in (armed if armed is not None else armed_faults(place, computation)):
        raise InjectedFault(
            f"injected fault at {place} of computation {computation!r} for {subject} "
            f"(armed in {_DIRECTORY} by a fault harness)"
        )
