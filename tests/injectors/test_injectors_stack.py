"""Injectors on the real stack: Kafka for records and reports, Cassandra for checkpoints,
Spark running the consumers.

Crash and resume (kill -9 of a real injector process), rotation, a zombie's checkpoint
refused, the expected set holding the watermark, and an idle injector's heartbeat firing a
timer downstream.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from millstream.connectors import kafka as kafka_connector
from millstream.engine.clock import SystemClock
from millstream.engine.computation import Computation
from millstream.engine.config import MillstreamConfig, RunSettings
from millstream.engine.context import Context
from millstream.engine.deadletters import decode_dead_letter
from millstream.engine.errors import InjectorFencedError
from millstream.engine.records import Record, decode_record
from millstream.engine.timers import Timer
from millstream.engine.topology import ComputationOptions, Topology
from millstream.engine.watermarks import injector_source
from millstream.injectors import (
    InjectorOptions,
    InjectorProcess,
    LogFileSource,
    Poll,
    Position,
    Source,
    SourceRecord,
)
from millstream.injectors.connect import connect_injector
from millstream.spark.runner import (
    AvailableNow,
    ProcessingTime,
    RunningTopology,
    run_topology,
)
from tests.admin_timeouts import AdminTimeouts
from tests.forwarding import LateService
from tests.injectors.logfile_app import parse
from tests.spark.test_runner import read_topic
from tests.waiting import InBackground, wait_until

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.integration

SECOND = 1_000_000
APP = Path(__file__).with_name("logfile_app.py")


def read_stream(config: MillstreamConfig, topic: str) -> list[Record]:
    """Every record on ``topic`` (repeats included), read up to its current end."""
    return [decode_record(value) for _, _, value in read_topic(config, topic)]


def run_settings(config: MillstreamConfig, keyspace: str) -> RunSettings:
    """The run's settings with the test's own keyspace."""
    return replace(config.run, keyspace=keyspace)


def message_count(config: MillstreamConfig, topic: str) -> int:
    consumer = kafka_connector.consumer(config, "test-injector-count")
    try:
        return sum(kafka_connector.end_offsets(consumer, [topic])[topic].values())
    finally:
        consumer.close()


class StreamNames:
    """Unique stream names for one test, whose topics are deleted after it."""

    def __init__(self, unique: Callable[[str], str]) -> None:
        self.unique = unique
        self.made: list[str] = []

    def new(self, prefix: str) -> str:
        name = self.unique(prefix)
        self.made.append(name)
        return name


@pytest.fixture
def streams(services: MillstreamConfig, unique: Callable[[str], str]) -> Iterator[StreamNames]:
    names = StreamNames(unique)
    yield names
    topics = [t for n in names.made for t in (n, f"{n}.dead-letters")]
    kafka_connector.delete_topics(services, topics)


def write_lines(path: Path, lines: list[tuple[int, str, str]]) -> None:
    with path.open("a") as handle:
        for micros, key, value in lines:
            handle.write(f"{micros} {key} {value}\n")


def test_a_killed_injector_resumes_from_its_checkpoint_losing_and_adding_nothing(
    services: MillstreamConfig,
    cassandra_keyspace: Callable[[], str],
    streams: StreamNames,
    tmp_path: Path,
) -> None:
    keyspace = cassandra_keyspace()
    name = streams.new("crash")
    stream = name
    logs = tmp_path / "logs"
    logs.mkdir()
    lines = [(SECOND * (1_000 + n), f"k{n % 7}", f"line-{n}") for n in range(6_000)]
    write_lines(logs / "a.log", lines[:3_000])
    write_lines(logs / "b.log", lines[3_000:])
    command = [sys.executable, str(APP), name, str(logs), stream, keyspace]

    first = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        assert first.stdout is not None
        assert first.stdout.readline().strip() == "started"
        deadline = time.monotonic() + 60
        while message_count(services, stream) < 500:
            assert time.monotonic() < deadline, "the injector sent nothing within 60 s"
            assert first.poll() is None, "the injector finished before it could be killed"
            time.sleep(0.05)
        os.kill(first.pid, signal.SIGKILL)
    finally:
        first.kill()
        first.wait(30)
    sent_before = message_count(services, stream)
    assert 0 < sent_before < len(lines), "kill -9 did not land mid-run"

    second = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr[-3000:]

    records = read_stream(services, stream)
    ids_of: dict[str, set[bytes]] = {}
    for record in records:
        ids_of.setdefault(record.value.decode(), set()).add(record.record_id)
    # Nothing lost, nothing foreign, and whatever was re-sent after the kill came with the
    # same ID as its first copy (consumers drop it).
    assert sorted(ids_of) == sorted(v for _, _, v in lines)
    assert all(len(ids) == 1 for ids in ids_of.values())
    assert len({r.record_id for r in records}) == len(lines)
    print(f"sent before the kill: {sent_before}, repeats after it: {len(records) - len(lines)}")


def test_a_rotated_log_is_read_to_its_end_and_the_new_file_after_it(
    services: MillstreamConfig,
    cassandra_keyspace: Callable[[], str],
    streams: StreamNames,
    tmp_path: Path,
) -> None:
    keyspace = cassandra_keyspace()
    stream = streams.new("rotation")
    log = tmp_path / "app.log"
    write_lines(log, [(SECOND * n, "k", f"before-{n}") for n in range(1, 4)])
    source = LogFileSource(tmp_path, parse, stream)
    with connect_injector(
        services, stream, source, settings=run_settings(services, keyspace)
    ) as injector:
        injector.start()
        injector.step()
        write_lines(log, [(SECOND * 4, "k", "late-in-old-file")])
        log.rename(tmp_path / "app.log.1")
        write_lines(log, [(SECOND * 5, "k", "after-rotation")])
        stat = log.stat()
        os.utime(log, ns=(stat.st_atime_ns, stat.st_mtime_ns + 5 * 10**9))
        injector.step()
        injector.flush()  # checkpoint and report now, not when the interval is up
        # The old file is finished: the new one's first event holds the watermark.
        assert injector.watermark == 5 * SECOND
    values = [r.value.decode() for r in read_stream(services, stream)]
    assert values == ["before-1", "before-2", "before-3", "late-in-old-file", "after-rotation"]


def test_a_zombie_copy_of_an_injector_process_cannot_checkpoint(
    services: MillstreamConfig,
    cassandra_keyspace: Callable[[], str],
    streams: StreamNames,
    tmp_path: Path,
) -> None:
    keyspace = cassandra_keyspace()
    stream = streams.new("zombie")
    write_lines(tmp_path / "a.log", [(SECOND * n, "k", f"v{n}") for n in range(1, 4)])

    def copy() -> Any:
        source = LogFileSource(tmp_path, parse, stream)
        return connect_injector(services, stream, source, settings=run_settings(services, keyspace))

    with copy() as zombie, copy() as successor:
        zombie.start()
        zombie.step()
        successor.start()  # takes the checkpoint over: the first copy is a zombie now
        write_lines(tmp_path / "a.log", [(SECOND * 9, "k", "v9")])
        with pytest.raises(InjectorFencedError, match="zombie"):
            zombie.step()
        successor.step()
    sent = [r.value.decode() for r in read_stream(services, stream)]
    assert "v9" in sent
    with copy() as third:
        third.start()
        third.step()
    # The successor's checkpoint stands: a third copy resumes after v9 and sends nothing.
    assert [r.value.decode() for r in read_stream(services, stream)] == sent


class Alarm(Computation):
    """Sets an event-time timer at each record's time plus a second; produces when it fires."""

    def __init__(self, output: str) -> None:
        self.output = output

    def process_record(self, ctx: Context, record: Record) -> None:
        ctx.set_timer(record.value.decode(), record.timestamp + SECOND)

    def process_timer(self, ctx: Context, timer: Timer) -> None:
        value = json.dumps({"tag": timer.tag, "watermark": ctx.input_low_watermark})
        ctx.produce(self.output, value.encode(), timer.timestamp)


def run_alarms(
    config: MillstreamConfig,
    spark: SparkSession,
    stream: str,
    fired: str,
    keyspace: str,
    tmp_path: Path,
    trigger: AvailableNow | ProcessingTime,
) -> RunningTopology:
    """A topology named ``stream`` of one :class:`Alarm` computation of the same name."""
    kafka_connector.create_topics(config, [fired], partitions=1)
    topology = Topology(stream, streams=[stream])
    topology.add_computation(
        stream,
        Alarm(fired),
        inputs=[stream],
        outputs=[fired],
        options=ComputationOptions(key_intervals=2),
    )
    settings = replace(
        config.run,
        keyspace=keyspace,
        checkpoint_root=tmp_path / "checkpoints",
        create_keyspace=False,
    )
    return run_topology(topology, config, settings, trigger=trigger, spark=spark)


def fired_tags(config: MillstreamConfig, topic: str) -> set[str]:
    return {json.loads(r.value)["tag"] for r in read_stream(config, topic)}


def test_an_expected_process_that_has_not_reported_holds_downstream_timers(
    services: MillstreamConfig,
    spark: SparkSession,
    cassandra_keyspace: Callable[[], str],
    streams: StreamNames,
    tmp_path: Path,
) -> None:
    keyspace = cassandra_keyspace()
    stream, fired = streams.new("expected"), streams.new("fired")
    name = stream
    directories = [tmp_path / "p0", tmp_path / "p1"]
    for directory in directories:
        directory.mkdir()
    write_lines(directories[0] / "a.log", [(SECOND * 10, "k", "early"), (SECOND * 30, "k", "t30")])
    write_lines(directories[1] / "a.log", [(SECOND * 20, "k", "middle")])

    def process(number: int) -> Any:
        source = LogFileSource(directories[number], parse, stream, out_of_order=SECOND)
        options = InjectorOptions(process=str(number), expected=("0", "1"))
        return connect_injector(services, name, source, options, run_settings(services, keyspace))

    running = run_alarms(services, spark, name, fired, keyspace, tmp_path, AvailableNow())
    try:
        with process(0) as first:
            first.start()
            first.step()
            assert first.watermark == 29 * SECOND
            running.process_available(timeout=300)
            # Process 1 is expected and silent: nothing may fire.
            assert fired_tags(services, fired) == set()
            (hold,) = running.holds(name)
            assert (hold.source, hold.reason) == (injector_source(name, "1"), "no report yet")

            with process(1) as second:
                second.start()
                second.step()
                assert second.watermark == 19 * SECOND
            running.process_available(timeout=300)
            # min(29 s, 19 s): the timer at 11 s fires, the ones at 21 s and 31 s wait.
            assert fired_tags(services, fired) == {"early"}
    finally:
        running.stop()


def test_an_idle_injector_heartbeat_fires_an_event_time_timer(
    services: MillstreamConfig,
    spark: SparkSession,
    cassandra_keyspace: Callable[[], str],
    streams: StreamNames,
    tmp_path: Path,
) -> None:
    keyspace = cassandra_keyspace()
    stream, fired = streams.new("idle"), streams.new("fired")
    clock = SystemClock()
    now = clock.now()
    write_lines(tmp_path / "a.log", [(now, "k", "only")])
    source = LogFileSource(
        tmp_path, parse, stream, out_of_order=SECOND // 2, idle_after=SECOND, clock=clock
    )
    options = InjectorOptions(heartbeat=SECOND // 2, poll_timeout=0.1)
    running = run_alarms(services, spark, stream, fired, keyspace, tmp_path, ProcessingTime(0.2))
    try:
        settings = run_settings(services, keyspace)
        with connect_injector(services, stream, source, options, settings) as injector:
            thread = threading.Thread(target=injector.run, daemon=True)
            thread.start()
            try:
                deadline = time.monotonic() + 60
                while not fired_tags(services, fired):
                    assert time.monotonic() < deadline, (
                        f"the timer did not fire; holds: {running.holds(stream)}, "
                        f"injector: {injector.stats}"
                    )
                    running.raise_failure()
                    time.sleep(0.5)
                # The only line is the record's: the idle heartbeats moved the watermark.
                assert injector.stats.heartbeats > 0
                assert injector.stats.emitted == 1
            finally:
                injector.stop()
                thread.join(30)
    finally:
        running.stop()


class LogWriter:
    """Writes lines to log files and remembers what each good and bad line should become."""

    def __init__(self) -> None:
        self.good: list[str] = []
        self.bad: list[tuple[int, int, str]] = []  # (inode, byte offset, error type)
        self.count = 0

    def good_lines(self, path: Path, count: int) -> None:
        with path.open("ab") as handle:
            for _ in range(count):
                self.count += 1
                value = f"good-{self.count}"
                line = f"{SECOND * (1_000 + self.count)} k{self.count % 5} {value}\n"
                handle.write(line.encode())
                self.good.append(value)

    def bad_line(self, path: Path, line: bytes, error_type: str) -> None:
        with path.open("ab") as handle:
            handle.write(line + b"\n")
        stat = path.stat()
        self.bad.append((stat.st_ino, stat.st_size - len(line) - 1, error_type))

    def every_kind_of_bad_line(self, path: Path) -> None:
        junk = random.Random(len(self.bad)).randbytes(200).replace(b"\n", b"") + b"\r\x00"
        self.bad_line(path, b"1000000000 k \xff\xfe invalid utf-8", "UnicodeDecodeError")
        self.good_lines(path, 3)
        self.bad_line(path, b"\x00" * 100, "ValueError")  # NULs: UTF-8, but no fields
        self.bad_line(path, junk, "UnicodeDecodeError")  # one line, whatever \r it holds
        self.good_lines(path, 3)
        self.bad_line(path, b"not a log line", "ValueError")
        self.bad_line(path, b"99999999999999999999999 k ns-not-us", "AbsurdTimestampError")
        self.good_lines(path, 3)
        # Over the line limit, and under it but over the record limit once enveloped.
        self.bad_line(path, b"1000000000 k " + b"x" * 10 * 1024 * 1024, "OversizedRecordError")
        self.bad_line(path, b"1000000000 k " + b"y" * 999_980, "OversizedRecordError")
        self.good_lines(path, 3)


def test_bad_lines_rotation_and_truncation_mid_run_lose_and_repeat_no_good_line(
    services: MillstreamConfig,
    cassandra_keyspace: Callable[[], str],
    streams: StreamNames,
    tmp_path: Path,
) -> None:
    keyspace = cassandra_keyspace()
    name = streams.new("badlines")
    logs = tmp_path / "logs"
    logs.mkdir()
    log = logs / "app.log"
    writer = LogWriter()
    writer.good_lines(log, 200)
    writer.every_kind_of_bad_line(log)
    writer.good_lines(log, 200)
    source = LogFileSource(logs, parse, name, max_bytes_per_poll=64 * 1024)
    options = InjectorOptions(poll_timeout=0.1)
    settings = run_settings(services, keyspace)
    started = time.monotonic()
    with connect_injector(services, name, source, options, settings) as injector:
        running = InBackground("the injector", injector.run)
        try:

            def wait_for(records: int, dead_letters: int) -> None:
                deadline = time.monotonic() + 120
                while (
                    message_count(services, name) < records
                    or message_count(services, f"{name}.dead-letters") < dead_letters
                ):
                    running.check()
                    assert time.monotonic() < deadline, f"stuck: {injector.stats}"
                    time.sleep(0.2)

            wait_for(100, 0)  # mid-run
            # Rotation by rename: lines written just before it are drained from the old file.
            writer.every_kind_of_bad_line(log)
            writer.good_lines(log, 100)
            log.rename(logs / "app.log.1")
            writer.good_lines(log, 50)
            writer.every_kind_of_bad_line(log)
            wait_for(len(writer.good) - 20, 0)
            # copytruncate: the lines written just before it are read from the copy.
            writer.good_lines(log, 100)
            writer.every_kind_of_bad_line(log)
            shutil.copyfile(log, logs / "app.log.2")
            with log.open("r+b") as handle:
                handle.truncate(0)
            writer.good_lines(log, 50)
            writer.every_kind_of_bad_line(log)
            writer.good_lines(log, 50)
            wait_for(len(writer.good), len(writer.bad))
            assert running.alive(), "the injector stopped"
        finally:
            injector.stop()
            running.join(30)
        running.check()
        stats = injector.stats
    elapsed = time.monotonic() - started

    records = read_stream(services, name)
    assert sorted(r.value.decode() for r in records) == sorted(writer.good)  # each once
    assert len({r.record_id for r in records}) == len(writer.good)
    letters = [decode_dead_letter(r.value) for r in read_stream(services, f"{name}.dead-letters")]
    found = sorted(
        (int(str(d.origin.stream).split("-")[0]), d.origin.offset or 0, d.error_type)
        for d in letters
    )
    assert found == sorted(writer.bad)  # each bad line once, with its file and byte offset
    assert stats.dead_letters == len(writer.bad)
    print(
        f"{len(writer.good)} good lines, {len(writer.bad)} bad ones, in {elapsed:.1f} s "
        f"({stats.polls} polls)"
    )


class Paced(Source):
    """``total`` numbered records, ``per_poll`` a poll, at most one poll per ``interval`` s."""

    def __init__(self, stream: str, total: int, per_poll: int, interval: float) -> None:
        self.streams = (stream,)
        self.total, self.per_poll, self.interval = total, per_poll, interval
        self.next = 0

    def open(self, position: Position | None) -> None:
        self.next = int(position["next"]) if position else 0

    def poll(self, timeout: float) -> Poll:
        time.sleep(self.interval)
        end = min(self.total, self.next + self.per_poll)
        records = [
            SourceRecord(self.streams[0], f"k{n % 5}", str(n).encode(), SECOND * (1 + n), "n", n)
            for n in range(self.next, end)
        ]
        self.next = end
        return Poll(records, position={"next": end}, watermark=SECOND * (1 + end))

    def close(self) -> None:
        pass


# A loopback address no local stack uses (the replicated one has 127.0.0.2-4, the secured
# one 127.0.0.5).
OWN_BROKER_HOST = "127.0.0.6"


@pytest.fixture
def own_broker(
    services: MillstreamConfig, tmp_path: Path
) -> Iterator[tuple[MillstreamConfig, int]]:
    """A Kafka broker of the test's own (the client config for it, and its pid), on
    :data:`OWN_BROKER_HOST` with the single node's ports and its data under ``tmp_path``;
    Cassandra is the shared one. A test that freezes it stalls no other test running
    meanwhile (``scripts/test`` runs two at once)."""
    if os.environ.get("MILLSTREAM_EXTERNAL_SERVICES") == "1":
        pytest.skip("needs a local Kafka broker of its own to freeze")
    from millstream.connectors.maven import MavenArtifacts
    from millstream.devtools.local.java import find_java
    from millstream.devtools.local.kafka import KafkaService
    from millstream.devtools.local.service import Node

    broker = KafkaService(
        replace(services, home=tmp_path),
        find_java(),
        MavenArtifacts(services.home / "artifacts", lambda _m: None),
        lambda _m: None,
        Node((OWN_BROKER_HOST,)),
    )
    status = broker.up()
    try:
        assert status.pid is not None, f"the test's broker did not start: {status}"
        yield replace(services, kafka_bootstrap=broker.address()), status.pid
    finally:
        broker.down()


def test_an_injector_rides_out_a_frozen_kafka_broker(
    own_broker: tuple[MillstreamConfig, int],
    cassandra_keyspace: Callable[[], str],
    unique: Callable[[str], str],
) -> None:
    services, broker = own_broker
    name = unique("outage")
    total = 2_000
    source = Paced(name, total, per_poll=20, interval=0.05)
    # A short send timeout: the frozen broker's sends time out and are waited out.
    options = InjectorOptions(poll_timeout=0.05, send_timeout=2.0, outage_timeout=120.0)
    settings = run_settings(services, cassandra_keyspace())
    started = time.monotonic()
    with connect_injector(services, name, source, options, settings) as injector:
        running = InBackground("the injector", injector.run)
        try:
            while injector.stats.emitted < 200:
                running.check()
                assert time.monotonic() - started < 30, f"stuck: {injector.stats}"
                time.sleep(0.1)
            os.kill(broker, signal.SIGSTOP)
            try:
                # Longer than the Kafka clients' own 30 s timeouts: the injector must wait.
                time.sleep(32)
                running.check()
                assert running.alive(), "the injector stopped"
            finally:
                os.kill(broker, signal.SIGCONT)
            frozen_at = injector.stats.emitted
            while injector.stats.emitted < total:
                running.check()
                assert time.monotonic() - started < 58, f"stuck: {injector.stats}"
                time.sleep(0.1)
            assert running.alive(), "the injector stopped"
        finally:
            injector.stop()
            running.join(30)
        running.check()
        stats = injector.stats
    elapsed = time.monotonic() - started

    records = read_stream(services, name)
    by_id = {r.record_id: r.value.decode() for r in records}
    # Every record once for a consumer (repeats, re-sent after a send timed out, carry the
    # same ID and are dropped), none lost.
    assert sorted(by_id.values(), key=int) == [str(n) for n in range(total)]
    assert stats.emitted == total
    assert frozen_at < total, "the broker froze after the input was all sent"
    print(
        f"frozen at {frozen_at} records; {len(records) - total} repeats on the topic; "
        f"{elapsed:.0f} s"
    )


def test_an_injector_started_while_cassandra_does_not_answer_starts_once_it_does(
    services: MillstreamConfig,
    cassandra_keyspace: Callable[[], str],
    streams: StreamNames,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """As a supervisor restarts an injector while Cassandra restarts too: it waits, saying
    where it looked for Cassandra, and starts once Cassandra answers."""
    keyspace = cassandra_keyspace()
    name = streams.new("late")
    total = 50
    caplog.set_level("WARNING", logger="millstream.engine.outages")
    with LateService((services.cassandra_hosts[0], services.cassandra_port)) as cassandra:
        config = replace(services, cassandra_port=cassandra.port)
        source = Paced(name, total, per_poll=10, interval=0.01)
        options = InjectorOptions(outage_timeout=120.0)
        started: list[InjectorProcess] = []
        stop = threading.Event()

        def run() -> None:
            settings = run_settings(config, keyspace)
            with connect_injector(config, name, source, options, settings) as injector:
                started.append(injector)
                injector.start()
                while not stop.is_set():
                    injector.step()

        def waits() -> list[str]:
            return [m for m in caplog.messages if f"injector {name!r} starting: waiting" in m]

        running = InBackground("the injector", run)
        try:
            wait_until(
                "the injector to wait for Cassandra",
                lambda: len(waits()) >= 2,
                30.0,
                meanwhile=running.check,
            )
            assert not started, "the injector started without Cassandra"
            cassandra.open()
            wait_until(
                lambda: f"the injector to send its records: {started}",
                lambda: started and started[0].stats.emitted == total,
                60.0,
                meanwhile=running.check,
            )
        finally:
            stop.set()
            running.join(30)
        running.check()
        assert cassandra.accepted > 0
    assert f"Cassandra at 127.0.0.1:{cassandra.port} (connection refused)" in waits()[0]
    values = sorted(int(r.value) for r in read_stream(services, name))
    assert sorted(set(values)) == list(range(total))


def test_an_injector_whose_kafka_stops_answering_as_it_connects_waits_it_out(
    services: MillstreamConfig,
    cassandra_keyspace: Callable[[], str],
    streams: StreamNames,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A supervisor restarts an injector as a broker dies: provisioning went through, then
    Kafka's admin requests time out (the watermark topic's check, the wake topics of its first
    report). It waits them out, saying it waits for Kafka, instead of exiting."""
    keyspace = cassandra_keyspace()
    name = streams.new("admin")
    total = 20
    timeouts = AdminTimeouts(monkeypatch, "millstream.injectors.connect")
    caplog.set_level("WARNING", logger="millstream.engine.outages")
    source = Paced(name, total, per_poll=5, interval=0.01)
    settings = run_settings(services, keyspace)
    options = InjectorOptions(outage_timeout=60.0)  # past it, a clear failure
    with connect_injector(services, name, source, options, settings) as injector:
        injector.start()
        deadline = time.monotonic() + 60
        while injector.stats.emitted < total:
            assert time.monotonic() < deadline, injector.stats
            injector.step()
    assert timeouts.left == 0
    waits = [m for m in caplog.messages if f"injector {name!r}" in m and "waiting for Kafka (" in m]
    assert len(waits) == 2, caplog.messages
    values = sorted(int(r.value) for r in read_stream(services, name))
    assert values == list(range(total))
