"""What the main job tells its operator while it runs, all in one place.

:class:`JobProgress` receives every event of a run of one input: the slice replayed, the
logs written, each batch a computation ends (:meth:`JobProgress.on_batch`), the job's state
every half second while it runs (:meth:`JobProgress.watch`: events injected, how far every
computation's input is complete), each anomaly as it is found, and the end. Alone it prints
lines to ``out``, a status line every ``every`` seconds. Given a
:class:`~millstream.spark.Console`, it feeds it instead: the injection's bar, each
computation's input watermark, records per second and batches, live on a terminal (plain
lines every 15 s otherwise), with the job's lines and the anomalies scrolling above; used as
a context manager, it shows the console while the block runs. The job
(:mod:`zeitgeist.job`, :mod:`zeitgeist.evaluation`) tells it, and does not change with it.
"""

from __future__ import annotations

import sys
import time
from types import TracebackType
from typing import Any, TextIO

from millstream.engine import MAX_EVENT_TIME
from millstream.spark import BatchMetrics, Console, RunningTopology
from zeitgeist.series import format_time

__all__ = ["JobProgress"]


class JobProgress:
    """Reports the run of input ``name`` (``events`` search events, once known) to ``out``
    (default: stdout), or through ``console`` (whose :attr:`~millstream.spark.Console.out`
    is then ``out``)."""

    def __init__(
        self,
        name: str,
        out: TextIO | None = None,
        *,
        every: float = 15.0,
        console: Console | None = None,
    ) -> None:
        self.name = name
        self.console = console
        self.out = console.out if console is not None else out or sys.stdout
        self.every = every
        self.events: int | None = None
        self.anomalies = 0
        self._started = time.monotonic()
        self._last_status = self._started
        self._injection_shown = False

    def __enter__(self) -> JobProgress:
        """Show the console (if any) until the block ends."""
        if self.console is not None:
            self.console.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self.console is not None:
            self.console.stop()

    def replaying(self, description: str) -> None:
        """The input's time range, before anything runs."""
        self._say(f"replaying {description}")

    def logs_written(self, queries: int, events: int, files: int, where: object) -> None:
        """The replay's log files are written: the job starts now."""
        self.events = events
        self._say(f"{queries} queries, {events:,} search events in {files} log files under {where}")
        self._started = self._last_status = time.monotonic()

    def on_batch(self, metrics: BatchMetrics) -> None:
        """A computation's batch ended (called on the queries' driver threads)."""
        if self.console is not None:
            self.console.on_batch(metrics)

    def watch(self, running: RunningTopology) -> None:
        """Called while the job runs (every half second): the console follows the topology
        and its injectors; without one, a status line every ``every`` s."""
        if self.console is not None:
            self.console.track_topology(running.topology)  # once: it changes nothing after
            if running.injectors and not self._injection_shown:
                self._injection_shown = True
                self.console.track_injection(
                    "injected", lambda: _injected(running), self.events, "searches"
                )
            return
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
        of = f" of {self.events:,}" if self.events is not None else ""
        self._say(
            f"{now - self._started:6.0f} s: injected {_injected(running):,}{of}; every "
            f"computation's input complete up to {shown}"
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


def _injected(running: RunningTopology) -> int:
    return sum(process.stats.emitted for process in running.injectors.values())
