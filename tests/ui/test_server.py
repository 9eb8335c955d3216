"""The live view served from a child process beside a driver (``millstream run --ui-port``,
the main job), against the real Kafka: it listens once started, refuses a port in use, frees
its port when stopped, and ends with its parent."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any

import pytest

from millstream.engine.config import MillstreamConfig
from millstream.engine.errors import ConfigError
from millstream.ui import start_view
from millstream.ui.server import VIEW_NICENESS

pytestmark = pytest.mark.integration


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def first_snapshot(address: str, timeout: float = 30.0) -> dict[str, Any]:
    """The view's first snapshot (it answers 503 until it has one)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(address + "api/snapshot", timeout=10) as response:
                document: dict[str, Any] = json.load(response)
                return document
        except urllib.error.HTTPError as exc:
            if exc.code != 503 or time.monotonic() > deadline:
                raise
        time.sleep(0.1)


def test_a_view_beside_a_driver_serves_refuses_a_taken_port_and_frees_its_own(
    services: MillstreamConfig,
) -> None:
    port = free_port()
    with start_view(services, port=port, period=0.2) as view:
        assert view.address == f"http://127.0.0.1:{port}/"
        document = first_snapshot(view.address)
        assert document["error"] is None  # Kafka answered
        assert document["seq"] >= 1
        # Below the driver's CPU priority: on a busy machine the topology goes first.
        mine = os.getpriority(os.PRIO_PROCESS, 0)
        assert os.getpriority(os.PRIO_PROCESS, view.pid) == min(19, mine + VIEW_NICENESS)
        # Never preempting the batches' threads when its readings fall due: none of its own.
        threads = [int(t) for t in os.listdir(f"/proc/{view.pid}/task")]
        assert len(threads) > 1
        assert {os.sched_getscheduler(t) for t in threads} == {os.SCHED_IDLE}
        with pytest.raises(ConfigError, match="could not listen"):
            start_view(services, port=port)
    # Stopped: nothing listens there any more (what a restarted view binds with, as uvicorn
    # does: the stopped one's closed connections may linger in TIME_WAIT).
    with socket.socket() as again:
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        again.bind(("127.0.0.1", port))
        again.listen()


def test_a_frozen_page_holds_back_neither_the_readings_nor_the_other_pages(
    services: MillstreamConfig,
) -> None:
    port = free_port()
    with start_view(services, port=port, period=0.05) as view:
        first_snapshot(view.address)
        # A page that opens its event stream and then reads nothing (a frozen tab): its
        # socket's buffers fill with the snapshots it does not read.
        frozen = socket.create_connection(("127.0.0.1", port))
        frozen.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        frozen.sendall(b"GET /events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        try:
            start = first_snapshot(view.address)["seq"]
            time.sleep(3)
            # The readings went on at their pace (60 in 3 s; 20 leaves room for a slow
            # machine), and another page is served the newest at once.
            assert first_snapshot(view.address)["seq"] >= start + 20
        finally:
            frozen.close()


def test_a_view_ends_with_the_process_that_started_it(services: MillstreamConfig) -> None:
    port = free_port()
    # A parent that starts a view and dies without stopping it (a killed driver).
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os, sys; from millstream.engine.config import load_config; "
            "from millstream.ui import start_view; "
            f"start_view(load_config(), port={port}); print('up', flush=True); "
            "os._exit(0)",
        ],
        env={**os.environ, "MILLSTREAM_KAFKA_WATERMARK_TOPIC": services.kafka_watermark_topic},
        stdout=subprocess.PIPE,
        text=True,
    )
    assert parent.stdout is not None
    assert parent.stdout.readline().strip() == "up"
    parent.wait(30)
    # The view noticed (its standard input closed) and let go of its port.
    deadline = time.monotonic() + 15
    while True:
        with socket.socket() as again:
            again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                again.bind(("127.0.0.1", port))
                break
            except OSError:
                assert time.monotonic() < deadline, "the orphaned view still listens"
        time.sleep(0.2)
