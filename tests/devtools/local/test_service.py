"""What every local node does the same way (:mod:`millstream.devtools.local.service`), on a
node whose JVM runs a small class of its own (``tests/devtools/local/conftest.py``)."""

from __future__ import annotations

import os
import signal

import pytest

from tests.devtools.local.conftest import SleeperService, command_line
from tests.waiting import wait_until


@pytest.mark.integration
def test_a_node_keeps_its_temporary_files_at_home_and_a_killed_nodes_go_as_it_starts_again(
    sleeper: tuple[SleeperService, list[str]],
) -> None:
    service, _ = sleeper
    service.up()
    pid = service.process.running_pid()
    assert pid is not None
    assert f"-Djava.io.tmpdir={service.scratch}" in command_line(pid)
    first = service.temporary_file()
    assert first.parent == service.scratch
    assert first.exists()

    os.kill(pid, signal.SIGKILL)
    wait_until("the killed node gone", lambda: service.process.running_pid() is None)
    assert first.exists(), "a JVM killed -9 deleted its temporary file"
    service.up()
    assert not first.exists(), "a killed node's temporary file outlived its next start"
    second = service.temporary_file()
    assert second != first
    assert second.exists()

    assert service.down()
    assert not second.exists(), "a node stopped by SIGTERM left its temporary file"
