"""The two processes the proving ground starts, kills and restarts: the driver and the
injector of one run, each ``python -m millstream.devtools.proving.processes ROLE RUN_DIR``.

Both read the run's description (``run.json``: names and workload) from the run directory.
The driver appends one JSON line per micro-batch to ``batches.jsonl`` (its pid and every
counter: the checker reads re-sends, fenced attempts and unknown outcomes there) and exits 0
once every computation's input low watermark reached the end of time and everything was
processed. The injector exits 0 once its source is exhausted.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Final

from millstream.devtools.proving.workload import (
    ProvingNames,
    ProvingSource,
    Workload,
    proving_topology,
    rebalance_policy,
)
from millstream.engine.config import load_config
from millstream.engine.errors import MillstreamError

__all__ = [
    "BATCHES_FILE",
    "GATE_FILE",
    "HOLD_LAYOUT",
    "RUN_FILE",
    "RunDescription",
    "main",
    "read_batches",
    "run_driver",
    "run_injector",
]

RUN_FILE: Final = "run.json"
BATCHES_FILE: Final = "batches.jsonl"
GATE_FILE: Final = "gate"
HOLD_LAYOUT: Final = "MILLSTREAM_PROVING_HOLD_LAYOUT"
"""Set to ``1`` for a driver that finishes a split or merge it finds journaled but plans none
of its own: the ``split-zombie`` fault's second driver, so that the intervals its stopped
predecessor was copying into stay live until that one is continued."""


@dataclass(frozen=True, slots=True)
class RunDescription:
    """What both processes of a run need to know: its name, workload and intervals."""

    run: str
    workload: Workload
    key_intervals: int
    max_offsets_per_trigger: int
    rebalance: bool = False

    @property
    def names(self) -> ProvingNames:
        return ProvingNames(self.run)

    def write(self, directory: Path) -> None:
        document = {
            "run": self.run,
            "workload": self.workload.to_json(),
            "key_intervals": self.key_intervals,
            "max_offsets_per_trigger": self.max_offsets_per_trigger,
            "rebalance": self.rebalance,
        }
        (directory / RUN_FILE).write_text(json.dumps(document, indent=2))

    @classmethod
    def read(cls, directory: Path) -> RunDescription:
        document = json.loads((directory / RUN_FILE).read_text())
        return cls(
            run=document["run"],
            workload=Workload.from_json(document["workload"]),
            key_intervals=int(document["key_intervals"]),
            max_offsets_per_trigger=int(document["max_offsets_per_trigger"]),
            rebalance=bool(document.get("rebalance", False)),
        )


def read_batches(directory: Path) -> list[dict[str, Any]]:
    """The batch lines every driver of the run wrote so far (a torn last line left out)."""
    try:
        text = (directory / BATCHES_FILE).read_text()
    except FileNotFoundError:
        return []
    found = []
    for line in text.splitlines():
        try:
            found.append(json.loads(line))
        except ValueError:
            continue  # a driver killed while writing it
    return found


def run_driver(directory: Path) -> int:
    from millstream.spark.metrics import BatchMetrics
    from millstream.spark.runner import ProcessingTime, run_topology

    run = RunDescription.read(directory)
    names = run.names
    hold = os.environ.get(HOLD_LAYOUT) == "1"
    policy = rebalance_policy(run.workload) if run.rebalance and not hold else None
    topology = proving_topology(names, run.workload, run.key_intervals, policy)
    log = (directory / BATCHES_FILE).open("a", encoding="utf-8")
    pid = os.getpid()

    def on_batch(metrics: BatchMetrics) -> None:
        line: dict[str, Any] = {"pid": pid, "at": time.time(), **asdict(metrics)}
        log.write(json.dumps(line) + "\n")
        log.flush()

    config = load_config()
    settings = replace(
        config.run,
        keyspace=names.keyspace,
        checkpoint_root=directory / "checkpoints",
        max_offsets_per_trigger=run.max_offsets_per_trigger,
    )
    try:
        with run_topology(
            topology, config, settings, trigger=ProcessingTime(0.5), on_batch=on_batch
        ) as running:
            running.await_input_complete()
    finally:
        log.close()
    print("finished", flush=True)
    return 0


def run_injector(directory: Path) -> int:
    from millstream.injectors.connect import connect_injector
    from millstream.injectors.process import InjectorOptions

    run = RunDescription.read(directory)
    names = run.names
    source = ProvingSource(run.workload, names.events, gate=directory / GATE_FILE)
    options = InjectorOptions(dead_letter_stream=names.injector_dead_letters)
    config = load_config()
    settings = replace(config.run, keyspace=names.keyspace)
    with connect_injector(config, names.injector, source, options, settings) as injector:
        stats = injector.run(until_exhausted=True)
    print(f"finished: {stats.emitted} records", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="millstream.devtools.proving.processes")
    parser.add_argument("role", choices=("driver", "injector"))
    parser.add_argument("directory", type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr
    )
    logging.getLogger("py4j").setLevel(logging.WARNING)
    try:
        if args.role == "driver":
            return run_driver(args.directory)
        return run_injector(args.directory)
    except MillstreamError as exc:
        print(f"{args.role}: error: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
