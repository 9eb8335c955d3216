"""Zeitgeist on the stack: a slice of real traffic with a kill -9 of the driver in the middle,
its anomalies read back by millstream and by Kafka's own console consumer. (Its pieces
in-process: ``test_zeitgeist.py``.)"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from zeitgeist.evaluation import JobInput, collect, score_run
from zeitgeist.job import inject, job_settings
from zeitgeist.model import ModelParams
from zeitgeist.offline import trace
from zeitgeist.pipeline import Names, zeitgeist_topology
from zeitgeist.replay import write_logs
from zeitgeist.series import Detection, load_series

from millstream.connectors import kafka as kafka_connector
from millstream.connectors.stream_reader import read_messages
from millstream.devtools.local.kafka_tools import CONSOLE_CONSUMER, kafka_tool_argv
from millstream.engine.config import MillstreamConfig
from millstream.engine.deadletters import default_dead_letter_stream
from millstream.engine.records import decode_record

# Alone on the machine under scripts/test's two workers: its slice of real traffic runs
# the whole job, a driver killed half way. (The module holds the machine from its first test
# to its last, so the in-process tests are in a module of their own.)
pytestmark = pytest.mark.exclusive

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NAB = EXAMPLES / "zeitgeist" / "data" / "nab"
DAY = 24 * 3_600_000_000

IBM_SLICE_DAYS = 27  # Feb 26 to Mar 25: the labelled IBM window of Mar 22 to 25 is inside


@pytest.fixture
def zeitgeist_run(
    services: MillstreamConfig,
    unique: Callable[[str], str],
    cassandra_keyspace: Callable[[], str],
) -> Iterator[tuple[Names, str]]:
    suffix = unique("t")
    names = Names(suffix, anomalies=f"anomalies_{suffix}")
    yield names, cassandra_keyspace()
    # Every stream of the run: the topology's (dead letters included) and the injector's
    # dead letters.
    streams = zeitgeist_topology(names).streams() | {
        names.anomalies,
        default_dead_letter_stream(f"{names.topology}-logs"),
    }
    kafka_connector.delete_topics(services, [kafka_connector.stream_topic(s) for s in streams])


def _end(config: MillstreamConfig, stream: str) -> int:
    """How many committed messages ``stream`` holds (its end offsets also count the markers
    of its transactions)."""
    return sum(1 for _ in read_messages(config, stream))


_BYTES_DESERIALIZER = "org.apache.kafka.common.serialization.BytesDeserializer"


def kafka_bytes_text(data: bytes) -> str:
    """``data`` as Kafka's ``Bytes.toString`` shows it (the console consumer's formatter with
    the ``BytesDeserializer``): printable ASCII as is but the backslash, every other byte as
    ``\\xNN``; so a message never spans lines."""
    return "".join(chr(b) if 0x20 <= b <= 0x7E and b != 0x5C else f"\\x{b:02X}" for b in data)


@dataclasses.dataclass
class ConsoleConsumer:
    """Kafka's console consumer (from the stack's artifacts) reading a stream in the
    background, ``read_committed`` from the beginning, into ``output``; it stops 15 s after the
    last message it got."""

    process: subprocess.Popen[bytes]
    output: Path
    errors: Path

    @classmethod
    def start(cls, config: MillstreamConfig, stream: str, directory: Path) -> ConsoleConsumer:
        options = [
            "--bootstrap-server",
            config.kafka_bootstrap,
            "--topic",
            kafka_connector.stream_topic(stream),
            "--from-beginning",
            "--isolation-level",
            "read_committed",
            "--timeout-ms",
            "15000",
            "--formatter-property",
            "print.key=true",
            "--formatter-property",
            f"key.deserializer={_BYTES_DESERIALIZER}",
            "--formatter-property",
            f"value.deserializer={_BYTES_DESERIALIZER}",
        ]
        argv = kafka_tool_argv(CONSOLE_CONSUMER, options, config=config)
        directory.mkdir(parents=True, exist_ok=True)
        output, errors = directory / "console.out", directory / "console.err"
        with output.open("wb") as out, errors.open("wb") as err:
            process = subprocess.Popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
        return cls(process, output, errors)

    def lines(self) -> list[str]:
        """What it printed, once it ended: key, a tab, value, a line a message."""
        code = self.process.wait(180)
        assert code == 0, self.errors.read_text()[-4000:]
        return self.output.read_text().splitlines()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(60)


def assert_each_once_as_millstream_reads(
    config: MillstreamConfig, stream: str, shown: list[str]
) -> None:
    """The console consumer's lines ``shown`` hold every message of ``stream`` once, and
    exactly the messages a millstream reader reads."""
    expected = []
    for message in read_messages(config, stream):
        assert message.value is not None, message
        key = decode_record(message.value).key.encode()
        expected.append(f"{kafka_bytes_text(key)}\t{kafka_bytes_text(message.value)}")
    assert expected, f"{stream} holds no message: nothing to compare"
    copies = {line: count for line, count in Counter(shown).items() if count > 1}
    assert not copies, f"the console consumer read {len(copies)} messages more than once"
    assert sorted(shown) == sorted(expected)


@pytest.mark.integration
def test_a_slice_of_real_traffic_finds_its_anomaly_and_a_killed_driver_changes_nothing(
    services: MillstreamConfig,
    zeitgeist_run: tuple[Names, str],
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    names, keyspace = zeitgeist_run
    (ibm,) = load_series(NAB, ["IBM"])
    ibm = ibm.between(ibm.start, ibm.start + IBM_SLICE_DAYS * DAY)
    job = JobInput("ibm", [ibm])
    write_logs(job.series, tmp_path / "logs")
    checkpoints = tmp_path / "checkpoints"
    settings = dataclasses.replace(job_settings(services), keyspace=keyspace)
    stats = inject(services, names, tmp_path / "logs", settings=settings)
    assert (stats.emitted, stats.dead_letters) == (ibm.events, 0)

    command = [
        sys.executable,
        "-m",
        "zeitgeist.driver",
        names.run,
        str(job.origin),
        f"--keyspace={keyspace}",
        f"--checkpoint-root={checkpoints}",
        f"--anomalies={names.anomalies}",
    ]
    log = tmp_path / "driver.log"
    with log.open("w") as sink:
        crashed = subprocess.Popen(
            command,
            cwd=EXAMPLES,
            stdout=sink,
            stderr=sink,
            start_new_session=True,  # its own process group: the JVM and Python workers too
        )
    buckets = sum(1 for c in ibm.counts.values() if c)

    def tail() -> str:
        return log.read_text()[-4000:]

    try:
        deadline = time.monotonic() + 240
        while True:
            assert crashed.poll() is None, f"the driver ended before it could be killed: {tail()}"
            assert time.monotonic() < deadline, f"the driver made no progress: {tail()}"
            with contextlib.suppress(Exception):
                if _end(services, names.predictions) >= buckets // 3:
                    break
            time.sleep(0.5)
        os.kill(crashed.pid, signal.SIGKILL)
        assert crashed.wait(60) == -signal.SIGKILL
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(crashed.pid, signal.SIGKILL)
        crashed.wait(60)
    assert _end(services, names.predictions) < buckets, "the kill did not land mid-run"

    finished = subprocess.run(
        command, cwd=EXAMPLES, capture_output=True, text=True, timeout=600, check=False
    )
    assert finished.returncode == 0, finished.stderr[-4000:]
    # Meanwhile, a client no one here wrote reads the anomalies: Kafka's console consumer.
    console = ConsoleConsumer.start(services, names.anomalies, tmp_path / "console")
    request.addfinalizer(console.stop)

    collected = collect(services, names)
    found = sorted(collected.detections)
    # Deduplicated by record ID, each anomaly is there once, and exactly the reference's.
    assert len(found) == len(set(found))
    assert found == sorted(trace(ibm, ModelParams()).detections)
    overall, _ = score_run(job, found)
    assert (overall.windows, overall.found) == (1, 1), found
    # Every counted bucket was predicted once.
    assert sum(len(p) for p in collected.predictions.values()) == buckets
    # And a user sees the same with the CLI.
    tailed = subprocess.run(
        [
            sys.executable,
            "-m",
            "millstream.cli",
            "tail",
            names.anomalies,
            "--from-beginning",
            "--dedup",
            "--value=json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert tailed.returncode == 0, tailed.stderr
    shown = [json.loads(line)["value"] for line in tailed.stdout.splitlines()]
    assert sorted(Detection(a["query"], a["kind"], a["bucket"]) for a in shown) == found
    # So does the console consumer, read_committed, without millstream's deduplication: each
    # anomaly once (transactional productions).
    lines = console.lines()
    assert_each_once_as_millstream_reads(services, names.anomalies, lines)
    assert len(lines) == len(found), lines
