"""What the main job tells its operator while it runs, all in one place.

:class:`JobProgress` receives every event of a run of one input: the slice replayed, the
logs written, the job's state every ``every`` seconds while it runs (events injected, how far
every computation's input is complete), each anomaly as it is found, and the end. This one
prints lines to ``out``; a console (a log file, live progress bars) subclasses it or stands in
for it, and the job (:mod:`zeitgeist.job`, :mod:`zeitgeist.evaluation`) does not change.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from millstream.engine import MAX_EVENT_TIME
from millstream.spark import RunningTopology
from zeitgeist.series import format_time

__all__ = ["JobProgress"]


class JobProgress:
    """Reports the run of input ``name`` (``events`` search events, once known) to ``out``."""

    def __init__(self, name: str, out: TextIO = sys.stdout, *, every: float = 15.0) -> None:
        self.name = name
        self.out = out
        self.every = every
        self.events: int | None = None
        self.anomalies = 0
        self._started = time.monotonic()
        self._last_status = self._started

    def replaying(self, description: str) -> None:
        """The input's time range, before anything runs."""
        self._say(f"replaying {description}")

    def logs_written(self, queries: int, events: int, files: int, where: object) -> None:
        """The replay's log files are written: the job starts now."""
        self.events = events
        self._say(f"{queries} queries, {events:,} search events in {files} log files under {where}")
        self._started = self._last_status = time.monotonic()

    def watch(self, running: RunningTopology) -> None:
        """Called while the job runs (every half second): a status line every ``every`` s."""
        now = time.monotonic()
        if now - self._last_status < self.every:
            return
        self._last_status = now
        snapshots = running.watermark_snapshots()
        marks = [
            snapshots[c].input_watermark if c in snapshots else 0
            for c in running.topology.computations
        ]
        low = min(marks, default=0)
        shown = "end of input" if low >= MAX_EVENT_TIME else format_time(low) + " UTC"
        injected = sum(process.stats.emitted for process in running.injectors.values())
        of = f" of {self.events:,}" if self.events is not None else ""
        self._say(
            f"{now - self._started:6.0f} s: injected {injected:,}{of}; every computation's "
            f"input complete up to {shown}"
        )

    def anomaly(self, value: dict[str, Any]) -> None:
        """An anomaly of this run, as soon as it reached the anomalies stream."""
        self.anomalies += 1
        print(
            f"  anomaly: {value['query']:<10} {value['kind']:<5} "
            f"{value['bucket_time']} UTC  observed {value['observed']:>6}  "
            f"expected {value['expected']:>8.1f}  score {value['score']:>7.1f}",
            file=self.out,
            flush=True,
        )

    def finished(self) -> None:
        """The input is processed, scored and plotted."""
        self._say(f"{self.anomalies} anomalies printed as found")

    def _say(self, line: str) -> None:
        print(f"[{self.name}] {line}", file=self.out, flush=True)
