"""Named places in the commit path where a fault harness can park a process.

The proving ground (:mod:`millstream.devtools.proving`) must kill a driver *between a commit
and the send of its productions*, stop one *while it holds a lease and has not committed*, and
so on: moments a timer could only hit by luck. The engine therefore names those moments, and a
harness that set ``MILLSTREAM_PAUSE_POINTS`` to a directory can ask the first process that
reaches one to wait there:

1. the harness *arms* point ``P`` by creating ``<dir>/arm.P``;
2. the first process to reach ``P`` claims it (removes the file; one process parks per arming),
   writes its pid to ``<dir>/at.P`` and waits until ``<dir>/release.P`` exists, at most
   :data:`MAX_PARK_SECONDS`;
3. meanwhile the harness acts on that pid (``kill -9``, ``SIGSTOP``), or releases it.

A point is ``<place>.<computation>`` (an injector's: ``<place>.<injector>``) with the places
in :data:`PLACES`. Unset (always, outside fault tests) a point costs one comparison. The
variable is read once, at import: the Spark Python workers inherit it from the driver's
environment in ``local`` mode.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Final

__all__ = ["ENVIRONMENT_VARIABLE", "MAX_PARK_SECONDS", "PLACES", "pause_point"]

ENVIRONMENT_VARIABLE: Final = "MILLSTREAM_PAUSE_POINTS"

PLACES: Final = {
    "driver.batch": "the driver, as a micro-batch starts its Spark job",
    "driver.report": "the driver, after a batch ran, before it publishes the watermark report",
    "executor.commit": "an interval task, leased and its user code run, before it commits",
    "executor.send": "an interval task, committed, before it sends the checkpointed productions",
    "executor.transaction": (
        "an interval task, its productions in an open Kafka transaction, before it commits it"
    ),
    "executor.delivered": (
        "an interval task, its Kafka transaction committed, before it deletes the pending rows"
    ),
    "rebalance.fence": "the driver, a split or merge journaled and its sources retired",
    "rebalance.export": "the driver, the sources' keys exported, before it copies them",
    "rebalance.copy": "the driver, the sources' keys copied into the new intervals",
    "rebalance.purge": "the driver, the sources' rows purged, before the layout is finished",
    "injector.send": "an injector process, a poll's records read, before it sends them",
}

MAX_PARK_SECONDS: Final = 300.0

_DIRECTORY: Final = os.environ.get(ENVIRONMENT_VARIABLE) or None


def pause_point(place: str, computation: str) -> None:
    """Park here if a harness armed ``<place>.<computation>``; see the module docstring."""
    if _DIRECTORY is not None:
        _park(Path(_DIRECTORY), f"{place}.{computation}")


def _park(directory: Path, point: str) -> None:
    try:
        (directory / f"arm.{point}").unlink()
    except FileNotFoundError:
        return
    written = directory / f"at.{point}.{os.getpid()}"
    written.write_text(f"{os.getpid()}\n")
    written.replace(directory / f"at.{point}")  # whole, for a harness polling for it
    release = directory / f"release.{point}"
    # Monotonic time of this process, not the engine's clock: how long to wait for a harness
    # is no part of the computation's time.
    deadline = time.monotonic() + MAX_PARK_SECONDS
    while not release.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
