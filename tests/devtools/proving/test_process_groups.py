"""The proving ground's processes: a role's members, and the stacks of a stuck run."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from millstream.devtools.local.process import alive
from millstream.devtools.proving.process_groups import Role, dump_stacks


@pytest.mark.unit
def test_a_roles_members_include_descendants_that_left_its_process_group(tmp_path: Path) -> None:
    """Spark starts its Python daemons in sessions of their own: killing the driver's process
    group alone would leave a parked worker running on (found by the proving ground)."""
    script = tmp_path / "tree.py"
    script.write_text(
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],"
        " start_new_session=True)\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    role = Role("driver", tmp_path, dict(os.environ))
    role.proc = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, start_new_session=True
    )
    assert role.proc.stdout is not None
    child = int(role.proc.stdout.readline())
    try:
        assert os.getpgid(child) != role.pid  # it left the group
        assert {role.pid, child} <= role.members()
        role.kill_all(10)
        assert not alive(role.pid)
        assert not alive(child)
    finally:
        for pid in (role.pid, child):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.unit
def test_a_stuck_runs_stacks_are_dumped_python_by_py_spy_and_the_jvm_to_its_log(
    tmp_path: Path,
) -> None:
    """What a run that stopped making progress leaves to tell where it waits: each Python
    process's threads in a file, and each JVM's thread dump in its own output."""
    (tmp_path / "Parked.java").write_text(
        "public class Parked { public static void main(String[] a) throws Exception {"
        ' System.out.println("ready"); System.out.flush(); Thread.sleep(60_000); } }'
    )
    jvm_log = tmp_path / "jvm.log"
    with jvm_log.open("wb") as out:
        jvm = subprocess.Popen(["java", str(tmp_path / "Parked.java")], stdout=out)
    python = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time\ndef parked_here():\n    print('ready', flush=True)\n"
            "    time.sleep(60)\nparked_here()\n",
        ],
        stdout=subprocess.PIPE,
    )
    shell = subprocess.Popen(["sleep", "60"])
    try:
        assert python.stdout is not None
        assert python.stdout.readline() == b"ready\n"
        deadline = time.monotonic() + 60
        while b"ready" not in jvm_log.read_bytes():  # compiled and running
            assert time.monotonic() < deadline, "the JVM did not start"
            time.sleep(0.1)
        stacks = tmp_path / "stacks.txt"
        said = dump_stacks({python.pid, jvm.pid, shell.pid}, stacks)
        assert said == f"1 Python stacks in {stacks}; 1 JVM thread dumps in the driver's log"
        assert "parked_here" in stacks.read_text()
        while b"Full thread dump" not in jvm_log.read_bytes():
            assert time.monotonic() < deadline, jvm_log.read_text()
            time.sleep(0.1)
        assert shell.poll() is None  # neither signalled nor dumped: neither Python nor a JVM
    finally:
        for process in (jvm, python, shell):
            process.send_signal(signal.SIGKILL)
            process.wait()
