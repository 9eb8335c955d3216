"""The live view's browser tests: a headless Chromium driven by Selenium (Debian's chromium
and chromium-driver, which scripts/test installs), and ``millstream ui`` started as a user
starts it, against the session's Kafka."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

from millstream.engine.config import MillstreamConfig

# Chromium on a machine without internet: no background traffic to Google's hosts, whose
# refused connections and failed lookups only slow it down (and no sandbox: tests run as root).
CHROMIUM_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1400,1200",
)


@pytest.fixture(scope="session")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[webdriver.Chrome]:
    chromium, chromedriver = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or chromedriver is None:
        pytest.fail(
            "the browser tests need Debian's chromium and chromium-driver: ./scripts/test "
            "installs them (scripts/browser.sh)"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium')}")
    driver = webdriver.Chrome(options=options, service=Service(chromedriver))
    try:
        yield driver
    finally:
        driver.quit()


class ViewProcess:
    """A ``millstream ui`` process on ``port``, with the environment ``env`` and the
    command's ``arguments`` (such as ``--topology``)."""

    def __init__(
        self, port: int, env: dict[str, str], log: Path, arguments: Sequence[str] = ()
    ) -> None:
        self.port = port
        self.env = env
        self.log = log
        self.arguments = tuple(arguments)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [
                    *(sys.executable, "-m", "millstream.cli", "ui"),
                    *("--port", str(self.port), *self.arguments),
                ],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 30
        while True:
            if self.process.poll() is not None:
                raise AssertionError(f"millstream ui exited: {self.log.read_text()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise AssertionError(
                        f"millstream ui did not listen within 30 s: {self.log.read_text()}"
                    ) from None
                time.sleep(0.1)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)
        self.process = None


@pytest.fixture
def view(services: MillstreamConfig, tmp_path: Path) -> Iterator[Callable[..., ViewProcess]]:
    """Factory: ``view(config, *arguments)`` starts ``millstream ui`` with ``arguments``,
    reading ``config``'s watermark topic and its ``[run]`` interval table; stopped after the
    test."""
    started: list[ViewProcess] = []

    def start(config: MillstreamConfig, *arguments: str) -> ViewProcess:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        env = {
            **os.environ,
            "MILLSTREAM_KAFKA_WATERMARK_TOPIC": config.kafka_watermark_topic,
            "MILLSTREAM_RUN_KEYSPACE": config.run.keyspace,
            "MILLSTREAM_RUN_TABLE": config.run.table,
        }
        process = ViewProcess(port, env, tmp_path / f"ui-{port}.log", arguments)
        started.append(process)
        process.start()
        return process

    yield start
    for process in started:
        process.stop()


@pytest.fixture
def screenshots(pytestconfig: pytest.Config, tmp_path: Path) -> Path:
    """Where the browser tests save their screenshots: ``$MILLSTREAM_SCREENSHOTS`` (relative
    to the repository's root; ``docs/images/live-view`` makes the documentation's), else the
    test's temporary directory."""
    chosen = os.environ.get("MILLSTREAM_SCREENSHOTS")
    directory = pytestconfig.rootpath / chosen if chosen else tmp_path / "screenshots"
    directory.mkdir(parents=True, exist_ok=True)
    return directory
