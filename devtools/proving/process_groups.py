"""The process groups of a proving-ground run: each role (driver, injector) started in a
group of its own, signalled and killed by pid, never by name, and its stacks dumped when a
run stops making progress."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from millstream.devtools.local.process import alive
from millstream.engine.errors import MillstreamError

__all__ = ["Role", "dump_stacks", "wait_pid_gone"]


class Role:
    """One of the run's processes (driver or injector), restartable, in its own group."""

    def __init__(self, role: str, directory: Path, env: dict[str, str]) -> None:
        self.role = role
        self.directory = directory
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self.generation = 0
        self.finished = False
        self.held = False  # a fault stops it on purpose: no restart, no unplanned exit
        self.logs: list[Path] = []

    def start(self) -> None:
        self.generation += 1
        log = self.directory / f"{self.role}-{self.generation}.log"
        self.logs.append(log)
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "millstream.devtools.proving.processes",
                    self.role,
                    str(self.directory),
                ],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,  # its own process group: its JVM and workers with it
            )

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def exited(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def members(self) -> set[int]:
        """Every live process of the role: its process group, and the descendants that left
        it (Spark starts its Python worker daemons in sessions of their own)."""
        found = _descendants(self.pid) | _group(self.pid)
        return {pid for pid in found if alive(pid)}

    def signal_all(self, sig: signal.Signals) -> None:
        """``sig`` to every member, by pid: the whole machine's share of the role at once."""
        members = self.members()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, sig)
        for pid in members:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def kill_all(self, timeout: float = 60.0) -> None:
        """kill -9 every member and wait until none of them is left."""
        members = self.members()
        self.signal_all(signal.SIGKILL)
        assert self.proc is not None
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout)
        deadline = time.monotonic() + timeout
        while any(alive(pid) for pid in members):
            if time.monotonic() > deadline:
                raise MillstreamError(
                    f"{self.role} processes {sorted(p for p in members if alive(p))} still "
                    f"alive {timeout} s after kill -9"
                )
            time.sleep(0.1)

    def detach(self) -> Role:
        """A handle on the current process alone (a zombie-to-be), this one to start anew."""
        old = Role(self.role, self.directory, self.env)
        old.proc, old.generation, old.logs = self.proc, self.generation, [self.logs[-1]]
        self.proc = None
        return old


def dump_stacks(pids: set[int], path: Path) -> str:
    """Where each of ``pids`` is, for a run that stopped making progress: every Python
    process's threads by ``py-spy dump`` into ``path``, and every JVM's thread dump by
    ``SIGQUIT`` (the JVM prints it to its own output, the role's log). What was dumped, in a
    few words."""
    spy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    python, jvm = 0, 0
    with path.open("a") as out:
        for pid in sorted(pids):
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue  # gone meanwhile
            program = Path(argv[0].decode(errors="replace")).name
            if program == "java":
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGQUIT)
                jvm += 1
            elif program.startswith("python") and spy is not None:
                out.write(f"== pid {pid}: {b' '.join(argv).decode(errors='replace')}\n")
                out.flush()
                dumped = subprocess.run(
                    [spy, "dump", "--pid", str(pid)],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    timeout=60,
                    check=False,
                )
                python += dumped.returncode == 0
    spied = f"{python} Python stacks in {path}" if spy else "py-spy not installed"
    return f"{spied}; {jvm} JVM thread dumps in the driver's log"


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (state, ppid, pgrp, ...)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _processes() -> dict[int, list[str]]:
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat(int(entry.name))) is not None:
            found[int(entry.name)] = fields
    return found


def _descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, fields in _processes().items():
        children.setdefault(int(fields[1]), []).append(pid)
    found, todo = {root}, [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _group(pgid: int) -> set[int]:
    return {pid for pid, fields in _processes().items() if int(fields[2]) == pgid}


def wait_pid_gone(pid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
