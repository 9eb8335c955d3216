"""A run's logs go to a file of its own; the console keeps millstream's warnings, one line each."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer

from millstream.connectors import logs
from millstream.connectors.kafka import client_settings
from millstream.connectors.logs import LOG4J2_CONFIG, LogRouting, route_logs
from millstream.engine.config import MillstreamConfig
from millstream.engine.errors import ConfigError
from tests.waiting import wait_until

pytestmark = pytest.mark.unit


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    routing = logs.active()
    if routing is not None:  # a test that failed before closing its routing
        routing.close()


def closed_port() -> int:
    """A loopback port nothing listens on (it was free a moment ago)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def test_a_librdkafka_record_lands_in_the_file_not_on_stderr(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # No broker there: librdkafka logs each refused connection, through client_settings'
    # logger.
    config = MillstreamConfig(home=home, kafka_bootstrap=f"127.0.0.1:{closed_port()}")
    routing = route_logs(config, "test")
    try:
        producer = Producer(client_settings(config))
        wait_until(
            "librdkafka logs to the file",
            lambda: "rdkafka#producer" in routing.path.read_text(),
            timeout=20,
            every=0,
            meanwhile=lambda: producer.poll(0.2),
        )
    finally:
        routing.close()
    logged = routing.path.read_text()
    assert " librdkafka: " in logged
    assert "Connection refused" in logged
    captured = capsys.readouterr()
    assert "rdkafka" not in captured.err + captured.out


def test_a_millstream_warning_is_one_console_line_and_its_traceback_is_in_the_file(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    routing = route_logs(MillstreamConfig(home=home), "test")
    try:
        raise RuntimeError("An error occurred while calling o81.collectToPython.\nat ...")
    except RuntimeError:
        logging.getLogger("millstream.spark.batch").warning(
            "computation 'counter' batch 12 attempt 1/3 failed, retrying: %s",
            "Py4JJavaError: java.lang.InterruptedException",
            exc_info=True,
        )
    finally:
        routing.close()
    assert capsys.readouterr().err == (
        "warning: computation 'counter' batch 12 attempt 1/3 failed, retrying: Py4JJavaError: "
        f"java.lang.InterruptedException; details in {routing.path}\n"
    )
    logged = routing.path.read_text()
    assert "WARNING millstream.spark.batch: computation 'counter' batch 12" in logged
    assert "Traceback (most recent call last)" in logged
    assert "o81.collectToPython" in logged


def test_the_libraries_and_millstreams_info_stay_in_the_file(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    routing = route_logs(MillstreamConfig(home=home), "test")
    try:
        logging.getLogger("cassandra.cluster").warning("no load_balancing_policy")
        logging.getLogger("librdkafka").warning("GETPID [rdkafka#producer-1] Coordinator load")
        logging.getLogger("millstream.spark.runner").info("batch 3: inputs=10")
        logging.getLogger("py4j.clientserver").info("Received command c on object id p0")
        logging.getLogger("py4j.clientserver").warning("Answer received: !yv")
    finally:
        routing.close()
    assert capsys.readouterr().err == ""
    logged = routing.path.read_text()
    for seen in ("no load_balancing_policy", "GETPID", "batch 3: inputs=10", "!yv"):
        assert seen in logged
    assert "Received command" not in logged  # py4j below WARNING: not even in the file


def test_verbose_brings_every_record_to_the_console_too(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    routing = route_logs(MillstreamConfig(home=home), "test", verbose=True)
    try:
        logging.getLogger("librdkafka").warning("GETPID Coordinator load in progress")
        logging.getLogger("millstream.spark.runner").info("batch 3: inputs=10")
    finally:
        routing.close()
    shown = capsys.readouterr().err
    assert "WARNING librdkafka: GETPID Coordinator load in progress" in shown
    assert "INFO millstream.spark.runner: batch 3: inputs=10" in shown
    assert "GETPID" in routing.path.read_text()
    assert "and here" in routing.where()


def test_close_puts_logging_back_and_each_run_gets_a_file_of_its_own(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    first = route_logs(MillstreamConfig(home=home), "test")
    second = route_logs(MillstreamConfig(home=home), "test")  # closes the first
    assert logs.active() is second
    assert second.path != first.path
    assert second.path.parent == home / "logs"
    second.close()
    assert logs.active() is None
    assert root.handlers == handlers
    assert root.level == level
    logging.getLogger("millstream.x").warning("after the run")
    assert "after the run" not in second.path.read_text()


def test_the_newest_files_are_kept(home: Path) -> None:
    directory = home / "logs"
    directory.mkdir()
    for number in range(8):
        old = directory / f"old-{number}.log"
        old.write_text("")
        os.utime(old, (1_000_000 + number, 1_000_000 + number))
    routing = route_logs(MillstreamConfig(home=home), "test", keep=5)
    routing.close()
    kept = sorted(path.name for path in directory.glob("*.log"))
    assert kept == sorted(["old-4.log", "old-5.log", "old-6.log", "old-7.log", routing.path.name])


def test_the_driver_jvm_is_pointed_at_the_file(home: Path) -> None:
    routing = route_logs(MillstreamConfig(home=home / "a home"), "test")
    routing.close()
    options = routing.jvm_options()
    assert f'"-Dlog4j2.configurationFile={LOG4J2_CONFIG}"' in options
    assert f'"-Dmillstream.log.file={routing.path}"' in options  # quoted: the path has a space
    assert '"-Dmillstream.log.console=off"' in options
    assert "${sys:millstream.log.file}" in LOG4J2_CONFIG.read_text()
    verbose = LogRouting(routing.path, verbose=True)
    assert '"-Dmillstream.log.console=warn"' in verbose.jvm_options()


def test_a_failure_is_a_line_for_the_console_and_a_traceback_in_the_file(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    routing = route_logs(MillstreamConfig(home=home), "test")
    try:
        try:
            raise ConfigError("no [kafka] bootstrap; set MILLSTREAM_KAFKA_BOOTSTRAP.")
        except ConfigError as exc:
            ours = routing.failed(exc)
        try:
            raise RuntimeError(
                "An error occurred while calling o99.awaitTermination.\n"
                ": org.apache.spark.SparkException: Job aborted\n"
                "\tat org.apache.spark.scheduler.DAGScheduler.failJob\n"
                '  File "executor.py", line 3, in task\n'
                "ValueError: the state of key 'x' is not JSON"
            )
        except RuntimeError as exc:
            theirs = routing.failed(exc)
    finally:
        routing.close()
    assert ours == (
        f"no [kafka] bootstrap; set MILLSTREAM_KAFKA_BOOTSTRAP; details in {routing.path}"
    )
    assert theirs == (
        f"RuntimeError: ValueError: the state of key 'x' is not JSON; details in {routing.path}"
    )
    assert capsys.readouterr().err == ""
    logged = routing.path.read_text()
    assert logged.count("Traceback (most recent call last)") == 2
    assert "o99.awaitTermination" in logged


def test_a_long_warning_is_cut_short_on_the_console_and_whole_in_the_file(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    routing = route_logs(MillstreamConfig(home=home), "test")
    long = "waiting for Cassandra: ReadTimeout " + "x" * 400
    try:
        logging.getLogger("millstream.engine.outages").warning(long)
    finally:
        routing.close()
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("warning: waiting for Cassandra: ReadTimeout xxx")
    assert line.endswith(f"…; details in {routing.path}")
    assert len(line) < 300 + len(str(routing.path))
    assert long in routing.path.read_text()
