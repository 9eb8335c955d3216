"""A one-computation topology whose interval task races a speculative copy of itself.

``tests/spark/test_speculation.py`` submits it with ``millstream run speculation_app:topology``
from this directory, naming it by ``SPECULATION_SUFFIX`` and the directory the attempts
signal each other through by ``SPECULATION_DIRECTORY`` (one machine: every executor sees it).

The computation has one key interval, so a batch's work is one Spark task, and the order is
fixed whatever the timing:

1. A later attempt (a speculative copy) waits, as its task unpickles the computation (before
   it acquires the interval's sequencer), until attempt 0 has reached user code, so attempt 0
   acquired first. Spark may launch the copy before attempt 0 got that far.
2. Each attempt that reaches user code writes ``attempt-<n>.json`` (Spark's attempt number,
   task ID, stage, executor log). Attempt 0 then waits until a later attempt has reached
   user code: that one acquired the sequencer after attempt 0 did, so attempt 0's lease is
   stale.
3. The later attempt waits until attempt 0's executor has logged the end of attempt 0's task
   (Spark logs a task's failure before it reports it to the driver), so attempt 0 tries its
   commit, and its failure reaches Spark, while the later one still runs.

Each sets its key's state to who it is and produces the same. Every wait gives up after
``WAIT_SECONDS``; the test then tells what went wrong.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from millstream.engine.codecs import JsonCodec
from millstream.engine.computation import Computation
from millstream.engine.context import Context
from millstream.engine.records import Record
from millstream.engine.topology import ComputationOptions, Topology

__all__ = ["SpeculationRace", "names", "outcome", "speculation_topology", "topology"]

JSON = JsonCodec()
WAIT_SECONDS = 90.0


def names(suffix: str) -> dict[str, str]:
    """The topology's stream and computation names for ``suffix``."""
    return {
        "topology": f"speculation_{suffix}",
        "events": f"events_{suffix}",
        "outcomes": f"outcomes_{suffix}",
        "race": f"race_{suffix}",
    }


def outcome(attempt: int) -> str:
    """What attempt number ``attempt`` commits as its key's state, and produces."""
    return {0: "original", 1: "speculative"}.get(attempt, f"attempt {attempt}")


class SpeculationRace(Computation):
    """Holds attempt 0 until a later attempt took the interval; see the module docstring."""

    def __init__(self, directory: str, output: str) -> None:
        self.directory = directory
        self.output = output

    def __setstate__(self, state: dict[str, Any]) -> None:
        # Unpickled in each task that runs the computation, before the task acquires anything.
        self.__dict__.update(state)
        from pyspark import TaskContext  # executors only: the driver never unpickles this

        task = TaskContext.get()
        if task is not None and task.attemptNumber() > 0:
            _wait((Path(self.directory) / "attempt-0.json").exists)

    def process_record(self, ctx: Context, record: Record) -> None:
        from pyspark import TaskContext  # executors only: the driver never runs this

        task = TaskContext.get()
        assert task is not None, "user code runs outside a Spark task"
        attempt = task.attemptNumber()
        here = Path(self.directory)
        mine = {
            "attempt": attempt,
            "task_id": task.taskAttemptId(),
            "stage": task.stageId(),
            "partition": task.partitionId(),
            # A Python worker runs in its executor's directory, beside the executor's log.
            "executor_log": str(Path.cwd() / "stderr"),
        }
        _write(here / f"attempt-{attempt}.json", json.dumps(mine))
        if attempt == 0:
            _wait(lambda: any(here.glob("attempt-[1-9]*.json")))
        else:
            _wait(lambda: _ended(here / "attempt-0.json"))
        ctx.state(JSON).set(outcome(attempt))
        ctx.produce(self.output, outcome(attempt).encode(), record.timestamp)


def speculation_topology(suffix: str, directory: str) -> Topology:
    """The topology named by ``suffix``, its attempts signalling through ``directory``."""
    name = names(suffix)
    built = Topology(name["topology"], streams=[name["events"]])
    built.add_computation(
        name["race"],
        SpeculationRace(directory, name["outcomes"]),
        inputs=[name["events"]],
        outputs=[name["outcomes"]],
        options=ComputationOptions(key_intervals=1),
    )
    return built


def topology() -> Topology:
    """What ``millstream run speculation_app:topology`` runs, named by the environment."""
    return speculation_topology(
        os.environ["SPECULATION_SUFFIX"], os.environ["SPECULATION_DIRECTORY"]
    )


def _write(path: Path, text: str) -> None:
    """Write ``path`` whole or not at all: other processes poll for it."""
    partial = path.with_suffix(".partial")
    partial.write_text(text)
    partial.rename(path)


def _wait(done: Callable[[], bool]) -> None:
    """Until ``done``, for WAIT_SECONDS at most (the test then reports what happened)."""
    deadline = time.monotonic() + WAIT_SECONDS
    while not done() and time.monotonic() < deadline:
        time.sleep(0.05)


def _ended(signal: Path) -> bool:
    """Whether the task of the attempt that wrote ``signal`` has ended, as its executor logs.

    An attempt that never reached user code wrote none: there is nothing to wait for.
    """
    if not signal.exists():
        return True
    attempt = json.loads(signal.read_text())
    try:
        log = Path(attempt["executor_log"]).read_text(errors="replace")
    except OSError:
        return False
    task = f"(TID {attempt['task_id']})"
    return any(
        task in line and ("Exception in task" in line or "Finished task" in line)
        for line in log.splitlines()
    )
