"""Start, find, watch and stop one local server process, by pid file.

A service's pid file is trusted only while the pid is alive *and* its command
line still names the service's data directory, so a recycled pid is never
mistaken for ours (and never signalled).
"""

from __future__ import annotations

import contextlib
import ctypes
import enum
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from millstream.connectors.maven import Progress
from millstream.engine.errors import PortInUseError, ServiceStartError

__all__ = [
    "Progress",
    "ServiceProcess",
    "Stop",
    "alive",
    "check_ports_free",
    "fresh_scratch",
    "log_tail",
    "port_accepts",
    "thread_timer_slacks",
    "threads_alive",
    "timer_slack",
]

# prctl(2) options: the calling thread's timer slack, in nanoseconds.
_PR_SET_TIMERSLACK = 29
_PR_GET_TIMERSLACK = 30


@contextlib.contextmanager
def timer_slack(nanoseconds: int | None) -> Iterator[None]:
    """Within the block, the calling thread's timer slack is ``nanoseconds`` (Linux; elsewhere,
    or with None, nothing changes). A process forked meanwhile keeps it, and so do all the
    threads it makes: each starts with the slack of the thread that made it.

    The slack is how late the kernel may end a timed sleep, so that it can wake several
    sleepers at once (50 µs by default). A JVM whose idle workers poll for work in sleeps of a
    few microseconds, as Cassandra's do, then wakes far less often.
    """
    if nanoseconds is None or not sys.platform.startswith("linux"):
        yield
        return
    if nanoseconds < 1:
        raise ValueError(f"a timer slack is at least 1 ns, got {nanoseconds}")
    libc = ctypes.CDLL(None, use_errno=True)
    before = libc.prctl(_PR_GET_TIMERSLACK, 0, 0, 0, 0)
    if before < 0 or libc.prctl(_PR_SET_TIMERSLACK, nanoseconds, 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl(PR_SET_TIMERSLACK): {os.strerror(errno)}")
    try:
        yield
    finally:
        libc.prctl(_PR_SET_TIMERSLACK, before, 0, 0, 0)


def thread_timer_slacks(pid: int) -> dict[int, int]:
    """The timer slack (ns) of each live thread of process ``pid``, by thread id (Linux)."""
    slacks = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(FileNotFoundError):  # a thread that ended meanwhile
            slacks[int(tid)] = int(Path(f"/proc/{tid}/timerslack_ns").read_text())
    return slacks


def port_accepts(host: str, port: int, timeout: float = 0.5) -> bool:
    """Whether something accepts TCP connections on host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def check_ports_free(service: str, host: str, ports: Sequence[tuple[str, int]]) -> None:
    """Raise :class:`PortInUseError` naming the first port another process holds."""
    for role, port in ports:
        if port_accepts(host, port):
            raise PortInUseError(
                f"{service} cannot start: its {role} port {host}:{port} is already in use by "
                f"another process. Stop that process (see `ss -ltnp 'sport = :{port}'`) or "
                f"choose another port in millstream.toml / MILLSTREAM_* variables."
            )


def fresh_scratch(directory: Path) -> None:
    """Make ``directory`` empty, for the temporary files of processes about to start: what
    earlier ones killed -9 left there goes (a JVM deletes its own only as it exits). The
    caller knows none of the processes that used it still runs."""
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)


def log_tail(path: Path, lines: int = 40) -> str:
    """The last lines of a log file, for error messages."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 64 * 1024))
            text = handle.read().decode("utf-8", errors="replace")
    except OSError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:])


@dataclass(frozen=True)
class ServiceProcess:
    """The pid file, log file and identity marker of one service."""

    name: str
    pid_file: Path
    log_file: Path
    marker: str  # a string the service's command line must contain

    def running_pid(self) -> int | None:
        """The pid of our live process, or None (clearing a stale pid file)."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        if _cmdline_contains(pid, self.marker):
            return pid
        with contextlib.suppress(FileNotFoundError):
            self.pid_file.unlink()
        return None

    def start(
        self,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        *,
        slack_ns: int | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start argv detached from our session, output appended to the log file, with a
        timer slack of ``slack_ns`` if given (:func:`timer_slack`)."""
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        self.pid_file.parent.mkdir(parents=True, exist_ok=True)
        with self.log_file.open("ab") as log, timer_slack(slack_ns):
            proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=dict(env) if env is not None else None,
                cwd=cwd,
                start_new_session=True,  # survives the CLI and ignores its Ctrl-C
            )
        self.pid_file.write_text(f"{proc.pid}\n")
        # Until the child has exec'd, its command line is ours, without the marker, and
        # running_pid() would disown it (and delete the pid file): wait for the exec.
        deadline = time.monotonic() + 10.0
        while (
            not _cmdline_contains(proc.pid, self.marker)
            and proc.poll() is None
            and time.monotonic() < deadline
        ):
            time.sleep(0.01)
        return proc

    def wait_healthy(
        self,
        proc: subprocess.Popen[bytes] | None,
        healthy: Callable[[], bool],
        timeout: float,
        progress: Progress,
        interval: float = 0.25,
        *,
        retry: str = "run `millstream up` again",
        stop: str = "`millstream down` stops it",
    ) -> None:
        """Poll ``healthy`` until it holds; fail with the log tail on exit or timeout.

        ``retry`` and ``stop`` tell the user, in the error, how to start and stop it again.
        """
        deadline = time.monotonic() + timeout
        next_note = time.monotonic() + 10
        while True:
            if proc is not None and proc.poll() is not None:
                raise ServiceStartError(
                    f"{self.name} exited with code {proc.returncode} while starting. "
                    f"Last lines of {self.log_file}:\n{log_tail(self.log_file)}\n"
                    f"Fix the cause above, then {retry}."
                )
            if healthy():
                return
            now = time.monotonic()
            if now >= deadline:
                raise ServiceStartError(
                    f"{self.name} did not accept clients within {timeout:.0f}s. "
                    f"Last lines of {self.log_file}:\n{log_tail(self.log_file)}\n"
                    f"If the machine is just slow, {retry}; "
                    f"otherwise fix the cause above ({stop})."
                )
            if now >= next_note:
                progress(f"{self.name}: still starting ({now - deadline + timeout:.0f}s)")
                next_note = now + 10
            time.sleep(interval)

    def stop(self, timeout: float = 60.0) -> Stop:
        """SIGTERM our process, SIGKILL it after ``timeout``; false if it was not running."""
        pid = self.running_pid()
        if pid is None:
            return Stop.NOT_RUNNING
        _signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        outcome = Stop.STOPPED
        if alive(pid):
            _signal(pid, signal.SIGKILL)
            outcome = Stop.KILLED
            while alive(pid):
                time.sleep(0.1)
        with contextlib.suppress(FileNotFoundError):
            self.pid_file.unlink()
        return outcome


class Stop(enum.IntEnum):
    """How :meth:`ServiceProcess.stop` ended; false when there was nothing to stop."""

    NOT_RUNNING = 0
    STOPPED = 1  # it exited on SIGTERM
    KILLED = 2  # it did not exit within the timeout: SIGKILL


def _signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def alive(pid: int) -> bool:
    """Whether ``pid`` runs. A process is gone once every thread of it has exited: a killed
    multi-threaded one (a JVM) shows its leader as a zombie while its other threads still
    exit, and they hold its files, listening sockets included, meanwhile. Our own children
    are reaped on the way."""
    try:
        reaped, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass  # not our child (or reaped already): /proc says
    else:
        # Our child: it can be reaped only once its whole thread group has exited.
        return reaped != pid
    return threads_alive(Path("/proc") / str(pid))


def threads_alive(process: Path) -> bool:
    """Whether a thread of the process ``process`` (its ``/proc/<pid>`` directory) is not a
    zombie yet."""
    try:
        tasks = list((process / "task").iterdir())
    except OSError:
        return False
    for task in tasks:
        try:
            state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue  # the thread exited as we looked
        if state not in {"Z", "X"}:
            return True
    return False


def _cmdline_contains(pid: int, marker: str) -> bool:
    if not alive(pid):
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return False
    return marker.encode() in cmdline
