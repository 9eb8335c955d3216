"""Where a benchmark row's time goes: py-spy on the driver and on every Spark Python worker.

:class:`Profiler` records, while a row drains, this process (the Spark driver's Python side:
the runner, the watermark authority, the benchmark's own threads) and each Spark Python
worker it starts (:func:`bench.harness.python_workers`, attached as they appear, since Spark
forks them when the first batch runs). py-spy samples the stacks from outside
(``--nonblocking``: the processes are never paused), but its own processes share the cores:
on 2 cores a profiled row drains at about half its speed. Each process's samples go to
``<directory>/<row>-<role>-<pid>.txt`` in py-spy's raw (collapsed stack) format, which
flame-graph tools read; :meth:`summary` prints the functions that hold the most samples, by
self and by total time, per role.

Without ``idle`` only threads running on a CPU are sampled: the shares are of CPU time.
With it, waiting threads are sampled too (a socket read, a lock): the shares are of wall
time, and say what a worker waits on.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType

from bench.harness import python_workers

__all__ = ["ROOT", "Profiler", "py_spy", "top_frames"]

ROOT = f"{Path(__file__).resolve().parents[1]}/"
"""The repository, whose files the summaries name relative to it."""


def py_spy() -> str:
    """The py-spy executable (``pip install -e '.[bench]'`` installs it beside Python)."""
    beside = Path(sys.executable).parent / "py-spy"
    found = str(beside) if beside.is_file() else shutil.which("py-spy")
    if found is None:
        raise RuntimeError(
            "py-spy is not installed: .venv/bin/python -m pip install -e '.[test,bench]'"
        )
    return found


def top_frames(
    lines: Iterable[str], top: int, *, without: str = ""
) -> tuple[int, list[tuple[str, int, int]]]:
    """From py-spy raw lines (``frame;frame;...;frame count``, outermost first): the samples,
    and the ``top`` functions by self samples, as ``(function, self, total)``. A function is
    ``name (file)``: its lines are added up (py-spy names files relative to ``sys.path``).
    Samples with a function named ``without`` (any file) in their stack are left out."""
    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
    samples = 0
    for line in lines:
        stack, _, count_text = line.rstrip("\n").rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        frames = [_function(frame) for frame in stack.split(";")]
        if without and any(frame.partition(" (")[0] == without for frame in frames):
            continue
        count = int(count_text)
        samples += count
        own[frames[-1]] += count
        for frame in set(frames):
            total[frame] += count
    return samples, [(name, n, total[name]) for name, n in own.most_common(top)]


def _function(frame: str) -> str:
    # "process_record (engine/protocol.py:120)" -> "process_record (engine/protocol.py)"
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    if path.startswith(ROOT):
        path = path[len(ROOT) :]  # millstream's own, relative to the repository
    elif "site-packages/" in path:
        path = path.split("site-packages/", 1)[1]
    return f"{name} ({path})" if path else name


_OWN_THREAD = "Profiler._attach_workers"


class Profiler:
    """py-spy records this process and the Spark Python workers while the ``with`` block runs.

    ``label`` names the row (and its files in ``directory``); ``rate`` is samples per second.
    """

    def __init__(self, directory: Path, label: str, *, idle: bool = False, rate: int = 100):
        self.directory = directory
        self.label = label
        self.idle = idle
        self.rate = rate
        self.recorders: dict[int, tuple[str, subprocess.Popen[bytes], Path]] = {}
        self._stop = threading.Event()
        self._watch = threading.Thread(target=self._attach_workers, daemon=True)

    def __enter__(self) -> Profiler:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._record(os.getpid(), "driver")
        self._watch.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._watch.join()
        for _, process, _ in self.recorders.values():
            if process.poll() is None:
                process.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
        for _, process, _ in self.recorders.values():
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def _attach_workers(self) -> None:
        while not self._stop.wait(1.0):
            for pid in python_workers():
                if pid not in self.recorders:
                    self._record(pid, "worker")

    def _record(self, pid: int, role: str) -> None:
        path = self.directory / f"{self.label}-{role}-{pid}.txt"
        command = [
            py_spy(), "record", "--pid", str(pid), "--format", "raw", "--output", str(path),
            "--rate", str(self.rate), "--nonblocking",
        ]  # fmt: skip
        if self.idle:
            command.append("--idle")
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.recorders[pid] = (role, process, path)

    def summary(self, top: int = 12) -> list[str]:
        """Per role (the driver; all workers together): samples, then the ``top`` functions
        by self samples with their share of the role's samples, self and total."""
        lines: list[str] = []
        for role in ("driver", "worker"):
            paths = [p for r, _, p in self.recorders.values() if r == role and p.is_file()]
            text: list[str] = []
            for path in paths:
                text += path.read_text(encoding="utf-8", errors="replace").splitlines()
            # The driver's samples of this profiler's own thread are not the row's.
            samples, frames = top_frames(text, top, without=_OWN_THREAD)
            what = "wall" if self.idle else "CPU"
            lines.append(
                f"  profile of the {role}{'s' if role == 'worker' and len(paths) != 1 else ''} "
                f"({len(paths)} process{'es' if len(paths) != 1 else ''}, {samples:,} samples "
                f"of {what} time at {self.rate}/s): self% total% function"
            )
            for name, own, total in frames:
                share = 100 / samples if samples else 0.0
                lines.append(f"    {own * share:5.1f} {total * share:6.1f}  {name}")
        return lines
