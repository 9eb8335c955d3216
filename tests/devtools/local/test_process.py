from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from millstream.devtools.local.process import (
    ServiceProcess,
    Stop,
    alive,
    check_ports_free,
    log_tail,
    port_accepts,
    threads_alive,
    timer_slack,
)
from millstream.engine.errors import PortInUseError, ServiceStartError

pytestmark = pytest.mark.unit


@pytest.fixture
def listener() -> Iterator[int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    try:
        yield sock.getsockname()[1]
    finally:
        sock.close()


def test_a_taken_port_is_reported_with_what_to_do(listener: int) -> None:
    assert port_accepts("127.0.0.1", listener)
    with pytest.raises(
        PortInUseError, match=rf"broker port 127.0.0.1:{listener} is already in use"
    ):
        check_ports_free("kafka", "127.0.0.1", [("broker", listener)])


def test_free_ports_pass() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    check_ports_free("kafka", "127.0.0.1", [("broker", port)])


def _service(tmp_path: Path) -> ServiceProcess:
    return ServiceProcess(
        name="sleeper",
        pid_file=tmp_path / "sleeper.pid",
        log_file=tmp_path / "logs" / "sleeper.out",
        marker=f"--marker={tmp_path}",
    )


def test_a_process_that_ignores_sigterm_is_killed_and_says_so(tmp_path: Path) -> None:
    service = _service(tmp_path)
    script = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ignoring', flush=True); time.sleep(600)"
    )
    proc = service.start([sys.executable, "-c", script, service.marker])
    service.wait_healthy(proc, lambda: "ignoring" in log_tail(service.log_file), 20, print, 0.05)
    assert service.stop(timeout=0.5) is Stop.KILLED
    assert service.running_pid() is None
    assert service.stop(timeout=0.5) is Stop.NOT_RUNNING
    assert not Stop.NOT_RUNNING


def test_start_find_and_stop_by_pid(tmp_path: Path) -> None:
    service = _service(tmp_path)
    script = "import sys, time; print('hello', flush=True); time.sleep(600)"
    proc = service.start([sys.executable, "-c", script, service.marker])
    try:
        assert service.running_pid() == proc.pid
        service.wait_healthy(proc, lambda: "hello" in log_tail(service.log_file), 20, print, 0.05)
    finally:
        assert service.stop(timeout=10) is Stop.STOPPED
    assert proc.wait(5) is not None
    assert service.running_pid() is None
    assert not service.pid_file.exists()
    assert not service.stop()


def _own_slack() -> int:
    return int(Path(f"/proc/{threading.get_native_id()}/timerslack_ns").read_text())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="timer slack is Linux's")
def test_a_service_started_with_a_timer_slack_has_it_in_every_thread(tmp_path: Path) -> None:
    service = _service(tmp_path)
    # The child reports its main thread's slack and that of a thread it starts afterwards
    # (a JVM starts its threads after the exec).
    script = (
        "import threading, time\n"
        "def slack(): return open(f'/proc/{threading.get_native_id()}/timerslack_ns').read()\n"
        "seen = []\n"
        "thread = threading.Thread(target=lambda: seen.append(slack()))\n"
        "thread.start(); thread.join()\n"
        "print('slack', int(slack()), int(seen[0]), flush=True)\n"
        "time.sleep(600)\n"
    )
    ours = _own_slack()
    proc = service.start([sys.executable, "-c", script, service.marker], slack_ns=1_234_000)
    try:
        service.wait_healthy(proc, lambda: "slack" in log_tail(service.log_file), 20, print, 0.05)
        assert "slack 1234000 1234000" in log_tail(service.log_file)
    finally:
        assert service.stop(timeout=10) is Stop.STOPPED
    assert _own_slack() == ours  # the caller's thread has its own back


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="timer slack is Linux's")
def test_a_timer_slack_is_refused_below_a_nanosecond_and_none_changes_nothing() -> None:
    ours = _own_slack()
    with pytest.raises(ValueError, match="at least 1 ns"), timer_slack(0):
        pass
    with timer_slack(None):
        assert _own_slack() == ours
    with timer_slack(ours + 1000):
        assert _own_slack() == ours + 1000
    assert _own_slack() == ours


def test_a_recycled_pid_is_not_taken_for_ours(tmp_path: Path) -> None:
    service = _service(tmp_path)
    tmp_path.mkdir(exist_ok=True)
    # pid 1 is alive, but its command line lacks the marker: not ours.
    service.pid_file.write_text("1\n")
    assert service.running_pid() is None
    assert not service.pid_file.exists()


def test_a_service_that_exits_while_starting_shows_its_log(tmp_path: Path) -> None:
    service = _service(tmp_path)
    script = "import sys; print('bad config: port is banana'); sys.exit(3)"
    proc = service.start([sys.executable, "-c", script, service.marker])
    with pytest.raises(ServiceStartError, match=r"(?s)exited with code 3.*port is banana"):
        service.wait_healthy(proc, lambda: False, 20, print, 0.05)


def test_a_service_that_never_gets_healthy_times_out_with_its_log(tmp_path: Path) -> None:
    service = _service(tmp_path)
    script = "import time; print('still warming up', flush=True); time.sleep(600)"
    proc = service.start([sys.executable, "-c", script, service.marker])
    try:
        with pytest.raises(ServiceStartError, match=r"(?s)within 1s.*still warming up"):
            service.wait_healthy(proc, lambda: False, 1, print, 0.05)
    finally:
        service.stop(timeout=10)


def _task(process: Path, tid: int, state: str) -> None:
    (process / "task" / str(tid)).mkdir(parents=True)
    (process / "task" / str(tid) / "stat").write_text(f"{tid} (java) {state} 1 2 3\n")


def test_a_process_whose_leader_is_a_zombie_lives_while_a_thread_does(tmp_path: Path) -> None:
    """A killed JVM: its leader is a zombie at once, its other threads exit after, holding
    its listening sockets meanwhile. It is gone only when they are."""
    process = tmp_path / "4242"
    _task(process, 4242, "Z")
    _task(process, 4243, "R")
    assert threads_alive(process)
    (process / "task" / "4243" / "stat").write_text("4243 (java) Z 1 2 3\n")
    assert not threads_alive(process)
    assert not threads_alive(tmp_path / "gone")


def test_our_child_is_alive_until_it_has_exited_and_is_reaped() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert alive(child.pid)
        assert threads_alive(Path("/proc") / str(child.pid))
    finally:
        child.kill()
    deadline = time.monotonic() + 10
    while alive(child.pid):
        assert time.monotonic() < deadline, "a killed child still alive after 10 s"
        time.sleep(0.01)
    assert not Path(f"/proc/{child.pid}").exists()  # reaped on the way
