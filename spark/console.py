"""What a person running a topology sees: how far its injectors and computations have got.

:class:`Console` is fed by :class:`~millstream.spark.runner.RunningTopology`'s per-batch
callback (:meth:`Console.on_batch`, which runs on the queries' driver threads) and by the
counts of injectors (:meth:`Console.track_injection`). On a terminal it keeps a live status
under the output (rich): a bar per injection, then per computation its input low watermark,
the records it read per second over the last ``window`` seconds, and its batches. Whatever
is printed meanwhile (:meth:`Console.print`, :attr:`Console.out`, ``print``, and the warnings
millstream logs, :mod:`millstream.connectors.logs`) scrolls above it. When stdout is not a
terminal (CI, a pipe, a file), or with ``live=False``, it prints the same status as a plain
line every ``interval`` seconds instead, and no escape code ever::

    routing = route_logs(config, "my-job")
    print(f"logs: {routing.path}")
    with Console(log_file=routing.path) as console:
        console.track_topology(topology)
        running = run_topology(topology, config, on_batch=console.on_batch)
        running.await_termination()
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, TextIO

from millstream.engine.records import MAX_EVENT_TIME, MIN_EVENT_TIME
from millstream.engine.topology import Topology
from millstream.spark.metrics import BatchMetrics

if TYPE_CHECKING:
    from rich.console import Console as RichConsole
    from rich.console import RenderableType
    from rich.live import Live
    from rich.progress import Progress, TaskID

__all__ = ["Console", "format_watermark"]


def format_watermark(micros: int | None) -> str:
    """An input low watermark for people: a UTC time, ``end of input`` or ``none yet``."""
    if micros is None or micros <= MIN_EVENT_TIME:
        return "none yet"
    if micros >= MAX_EVENT_TIME:
        return "end of input"
    moment = datetime.fromtimestamp(micros // 1_000_000, UTC)
    return f"{moment:%Y-%m-%d %H:%M:%S} UTC"


@dataclass
class _Computation:
    label: str
    batches: int = 0
    retried: int = 0
    inputs: int = 0
    input_watermark: int | None = None
    # (monotonic time, inputs read so far) at the end of each recent batch.
    samples: deque[tuple[float, int]] = field(default_factory=deque)

    def rate(self, now: float, window: float) -> float:
        """Records read per second over the last ``window`` seconds (to ``now``)."""
        # From the last batch that ended before the window, or before the latest batch when
        # batches take longer than the window (the first one: from its start).
        samples = self.samples
        while len(samples) > 2 and samples[1][0] <= now - window:
            samples.popleft()
        if not samples:
            return 0.0
        since, read = samples[0]
        return (self.inputs - read) / max(now - since, 1e-3)


@dataclass
class _Injection:
    label: str
    emitted: Callable[[], int]
    total: int | None
    unit: str
    task: TaskID | None = None


class Console:
    """The live status of a run on ``out`` (default: ``sys.stdout``); see the module
    docstring. ``live``: ``None`` decides by whether ``out`` is a terminal. ``log_file`` is
    shown under the live status. Use it as a context manager, or :meth:`start` and
    :meth:`stop`.
    """

    def __init__(
        self,
        out: TextIO | None = None,
        *,
        live: bool | None = None,
        interval: float = 15.0,
        window: float = 10.0,
        log_file: Path | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stream = out if out is not None else sys.stdout
        self.live = _is_terminal(self.stream) if live is None else live
        self.interval = interval
        self.window = window
        self.log_file = log_file
        self._clock = clock
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._out = _Lines(self.print)
        self._computations: dict[str, _Computation] = {}
        self._topology: str | None = None
        self._injections: list[_Injection] = []
        self._started = clock()
        self._stop = threading.Event()
        self._printer: threading.Thread | None = None
        self._printed: tuple[object, ...] = ((), ())
        self._rich: RichConsole | None = None
        self._live: Live | None = None
        self._progress: Progress | None = None

    # -- feeding it ------------------------------------------------------------------------

    def track_topology(self, topology: Topology) -> None:
        """Show ``topology``'s computations in its order, before their first batches too,
        without the topology's name where theirs start with it (``zeitgeist_r_model``:
        ``model``). Calling it again changes nothing."""
        with self._lock:
            if self._topology == topology.name:
                return
            self._topology = topology.name
            shown = {}
            for name in topology.computations:
                label = _label(name, topology.name)
                computation = self._computations.get(name) or _Computation(label)
                computation.label = label
                shown[name] = computation
            shown.update(self._computations)  # any other, after
            self._computations = shown

    def on_batch(self, metrics: BatchMetrics) -> None:
        """Take a computation's batch into the status (``RunningTopology``'s ``on_batch``)."""
        now = self._clock()
        with self._lock:
            shown = self._computations.get(metrics.computation)
            if shown is None:
                shown = self._computations[metrics.computation] = _Computation(metrics.computation)
            if not shown.samples:
                shown.samples.append((now - metrics.seconds, 0))
            shown.batches += 1
            shown.retried += bool(metrics.failed_attempts)
            shown.inputs += metrics.inputs
            shown.input_watermark = metrics.input_watermark
            shown.samples.append((now, shown.inputs))

    def track_injection(
        self, label: str, emitted: Callable[[], int], total: int | None = None, unit: str = ""
    ) -> None:
        """Show an injection's progress: ``emitted()`` (called from the display's thread) of
        ``total`` records (``None``: not known), ``unit`` naming them."""
        with self._lock:
            self._injections.append(_Injection(label, emitted, total, unit))

    def print(self, text: str) -> None:
        """Print a line (or lines) above the live status; plainly without one."""
        rich = self._rich
        if rich is not None:
            rich.print(text, markup=False, highlight=False, emoji=False, soft_wrap=True)
            return
        with self._write_lock:
            self.stream.write(text + "\n")
            self.stream.flush()

    @property
    def out(self) -> TextIO:
        """A file to print through: each whole line written goes to :meth:`print`."""
        return self._out  # type: ignore[return-value]

    # -- running ---------------------------------------------------------------------------

    def start(self) -> None:
        self._started = self._clock()
        if self.live:
            from rich.console import Console as RichConsole
            from rich.live import Live

            self._rich = RichConsole(file=self.stream, force_terminal=True)
            self._live = Live(
                console=self._rich,
                get_renderable=self._render,
                refresh_per_second=2,
                redirect_stdout=True,
                redirect_stderr=True,
            )
            self._live.start()
        else:
            self._stop.clear()
            self._printer = threading.Thread(target=self._plain, name="console", daemon=True)
            self._printer.start()

    def stop(self) -> None:
        """End the live status, leaving its last state on screen (or print a last line)."""
        if self._live is not None:
            self._live.stop()
            self._live = None
            self._rich = None
        if self._printer is not None:
            self._stop.set()
            self._printer.join(5)
            self._printer = None
            self._print_status()

    def __enter__(self) -> Console:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    # -- plain lines -----------------------------------------------------------------------

    def status_line(self) -> str:
        """The status as one plain line (what a run without a terminal prints)."""
        now = self._clock()
        parts = []
        with self._lock:
            injections = list(self._injections)
            computations = list(self._computations.values())
        for injection in injections:
            emitted = injection.emitted()
            unit = f" {injection.unit}" if injection.unit else ""
            if injection.total:
                share = min(1.0, emitted / injection.total)
                parts.append(
                    f"{injection.label} {emitted:,} of {injection.total:,}{unit} ({share:.0%})"
                )
            else:
                parts.append(f"{injection.label} {emitted:,}{unit}")
        for shown in computations:
            parts.append(
                f"{shown.label}: input watermark {format_watermark(shown.input_watermark)}, "
                f"{shown.rate(now, self.window):,.0f} records/s, {shown.batches} "
                + ("batch" if shown.batches == 1 else "batches")
                + (f" ({shown.retried} retried)" if shown.retried else "")
            )
        return "; ".join(parts)

    def _print_status(self) -> None:
        # A line when something moved: rates alone change as time passes.
        with self._lock:
            moved = (
                tuple(injection.emitted() for injection in self._injections),
                tuple((c.batches, c.input_watermark) for c in self._computations.values()),
            )
        if moved == self._printed:
            return
        self._printed = moved
        line = self.status_line()
        if line:
            self.print(f"[{_elapsed(self._clock() - self._started)}] {line}")

    def _plain(self) -> None:
        while not self._stop.wait(self.interval):
            self._print_status()

    # -- the live status -------------------------------------------------------------------

    def _render(self) -> RenderableType:
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        now = self._clock()
        parts: list[Any] = []
        progress = self._injection_progress()
        if progress is not None:
            parts.append(progress)
        with self._lock:
            computations = list(self._computations.values())
        if computations:
            table = Table(box=None, pad_edge=False, header_style="bold")
            table.add_column("computation")
            table.add_column("input watermark")
            table.add_column("records/s", justify="right")
            table.add_column("batches", justify="right")
            for shown in computations:
                batches = f"{shown.batches:,}"
                if shown.retried:
                    batches += f" ({shown.retried} retried)"
                table.add_row(
                    shown.label,
                    format_watermark(shown.input_watermark),
                    f"{shown.rate(now, self.window):,.0f}",
                    batches,
                )
            parts.append(table)
        if self.log_file is not None:
            parts.append(Text(f"logs: {self.log_file}", style="dim"))
        return Group(*parts)

    def _injection_progress(self) -> Progress | None:
        from rich.progress import (
            BarColumn,
            Progress,
            TaskProgressColumn,
            TextColumn,
            TimeElapsedColumn,
        )

        with self._lock:
            injections = list(self._injections)
        if not injections:
            return None
        if self._progress is None:
            self._progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                TaskProgressColumn(),
                TextColumn("{task.fields[count]}"),
                TimeElapsedColumn(),
                console=self._rich,
                auto_refresh=False,
            )
        for injection in injections:
            emitted = injection.emitted()
            count = f"{emitted:,}" + (f" of {injection.total:,}" if injection.total else "")
            if injection.unit:
                count += f" {injection.unit}"
            if injection.task is None:
                injection.task = self._progress.add_task(
                    injection.label, total=injection.total, count=count
                )
            self._progress.update(injection.task, completed=emitted, count=count)
        return self._progress


class _Lines:
    """A write-only text file that hands each whole line to ``sink``."""

    def __init__(self, sink: Callable[[str], None]) -> None:
        self._sink = sink
        self._pending = ""

    def write(self, text: str) -> int:
        self._pending += text
        while "\n" in self._pending:
            line, self._pending = self._pending.split("\n", 1)
            self._sink(line)
        return len(text)

    def flush(self) -> None:
        pass


def _label(computation: str, topology: str) -> str:
    for joint in "_.-":
        if computation.startswith(topology + joint) and len(computation) > len(topology) + 1:
            return computation[len(topology) + 1 :]
    return computation


def _is_terminal(stream: TextIO) -> bool:
    try:
        terminal = stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or closed
        return False
    return terminal and os.environ.get("TERM", "") != "dumb"


def _elapsed(seconds: float) -> str:
    minutes, seconds = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes}:{seconds:02d}"
