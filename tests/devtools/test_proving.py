"""The proving ground on the real stack: the CI tier with a fault of every kind, and checks
that catch a lost, a duplicated and an unexpected effect and a watermark that went back."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from millstream.connectors import kafka as kafka_connector
from millstream.devtools.proving.checks import (
    PLAIN_DUPLICATES,
    STORE_WRITES_LOST,
    CheckResult,
    check_store_probes,
    injector_outage_waits,
    open_transactions,
    plain_duplicates,
    read_plain,
)
from millstream.devtools.proving.ground import (
    CRASHES,
    FAULTS,
    TIERS,
    TRANSACTION_FAULTS,
    Fault,
    GroundReport,
    Tier,
    discard,
    prove,
    recheck,
    run_config,
    run_kinds,
    schedule,
)
from millstream.devtools.proving.processes import RunDescription
from millstream.devtools.proving.workload import (
    ProvingSource,
    Workload,
    expected_outcome,
)
from millstream.engine.config import MillstreamConfig
from millstream.engine.productions import Production
from millstream.engine.records import Record
from millstream.engine.watermarks import WatermarkReport
from millstream.injectors.source import SourceRecord

# Alone on the machine under scripts/test's two workers: the proving ground's runs load
# both cores with drivers, injectors and faults. After the other exclusive modules: its CI
# tier takes a fifth longer on a stack just started.
pytestmark = pytest.mark.exclusive(warm_stack=True)

EXTERNAL = os.environ.get("MILLSTREAM_EXTERNAL_SERVICES") == "1"


def _progress(message: str) -> None:
    print(f"[proving {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _services(config: MillstreamConfig) -> list[object]:
    from millstream.devtools.local.stack import LocalStack

    return list(LocalStack(config, _progress).services)


@pytest.mark.unit
def test_a_seed_gives_one_schedule_with_every_kind_the_tier_asks_for() -> None:
    tier = Tier(records=100, keys=2, rate=10.0, faults=3)
    first = schedule(7, tier)
    assert first == schedule(7, tier)
    assert first != schedule(8, tier)
    assert sorted(f.kind for f in first) == sorted(list(FAULTS) * 3)
    ci = tuple(k for k in CRASHES if k != "driver-send")  # driver-transaction covers it there
    assert sorted(f.kind for f in schedule(7, TIERS["ci"])) == sorted(ci)
    # Every tier crashes on the transactional path too.
    for name, each in TIERS.items():
        assert set(TRANSACTION_FAULTS) <= set(each.kinds), name
    assert run_kinds(TIERS["ci"], None) == ci
    assert run_kinds(TIERS["ci"], ("zombie",)) == ("zombie",)
    assert {f.computation for f in first if f.kind in TRANSACTION_FAULTS} == {"tally"}


@pytest.mark.unit
def test_the_transaction_faults_park_at_the_engines_transaction_pause_points() -> None:
    from millstream.devtools.proving.faults import PAUSES, WORKER_KILLS, pause_point
    from millstream.engine.pause_points import PLACES

    places = {
        k: pause_point(f) for k, f in ((k, Fault(k, "tally", 0.0)) for k in TRANSACTION_FAULTS)
    }
    assert places == {
        "driver-transaction": "executor.transaction",
        "worker-transaction": "executor.transaction",
        "driver-delivered": "executor.delivered",
    }
    assert set(PAUSES.values()) <= PLACES.keys()
    assert "worker-transaction" in WORKER_KILLS
    assert not {"driver-transaction", "driver-delivered"} & set(WORKER_KILLS)


@pytest.mark.unit
def test_the_plain_reader_counts_byte_identical_messages_per_topic() -> None:
    envelope, other = b"\x01record-id-1 value", b"\x01record-id-2 value"
    messages = [
        ("windows", b"k1", envelope),
        ("windows", b"k1", envelope),  # a re-send: counted
        ("windows", b"k1", envelope),  # and again
        ("windows", b"k2", envelope),  # another key: not one
        ("windows", b"k1", other),  # another value: not one
        ("rollups", b"k1", envelope),  # another topic: not one
        ("rollups", None, None),  # a tombstone
        ("rollups", None, None),  # the same tombstone again: counted
        ("rollups", b"", b""),  # empty bytes are not a missing key or value
    ]
    found = plain_duplicates(messages)
    assert found == {"windows": 2, "rollups": 1}
    assert sum(found.values()) == 3
    assert plain_duplicates(messages[3:6]) == {}


@pytest.mark.unit
def test_a_probe_lwt_acknowledged_before_a_crash_and_missing_after_it_fails_the_run() -> None:
    durable = CheckResult()
    check_store_probes([{"acknowledged": 120, "found": 120}], durable)
    assert durable.passed
    assert durable.figures["LWTs acknowledged just before a Cassandra kill"] == 120
    lossy = CheckResult()
    # What a single node with commitlog_sync: periodic did: the last ~100 ms went missing.
    check_store_probes(
        [{"acknowledged": 553, "found": 547}, {"acknowledged": 9, "found": 9}], lossy
    )
    assert not lossy.passed
    assert lossy.counts[STORE_WRITES_LOST] == 6
    assert "553 LWTs acknowledged" in lossy.examples[STORE_WRITES_LOST][0]


@pytest.mark.unit
def test_the_source_is_a_pure_function_of_its_index_and_honours_its_gate(tmp_path: Path) -> None:
    workload = Workload(records=50, keys=3, seed=1, rate=10_000.0, malformed_every=5)
    gate = tmp_path / "gate"
    gate.write_text("20")
    source = ProvingSource(workload, "events", gate=gate)
    source.open(None)
    sent: list[SourceRecord] = []
    while len(sent) < 20:
        sent.extend(source.poll(0.0).records)
    assert len(sent) == 20
    assert not source.poll(0.0).records  # the gate holds
    gate.write_text("50")
    source.open({"next": 20})  # as after a restart from the checkpoint
    while not (poll := source.poll(0.0)).exhausted:
        sent.extend(poll.records)
    assert [r.offset for r in sent] == list(range(50))
    assert [r.value for r in sent] == [workload.value(i) for i in range(50)]
    expected = expected_outcome(workload)
    assert expected.malformed == {i for i in range(50) if workload.malformed(i)}
    assert 0 < len(expected.malformed) < 50
    assert sum(len(s) for s in expected.sequences.values()) == 50 - len(expected.malformed)


@pytest.mark.unit
def test_a_poisoned_record_is_no_part_of_the_expected_fold() -> None:
    workload = Workload(records=200, keys=5, seed=4, rate=100.0)
    whole = expected_outcome(workload)
    index = next(i for i in range(100, 200) if not workload.malformed(i))
    poisoned = expected_outcome(workload, [index], tombstones=3)
    assert poisoned.poisoned == {index}
    assert poisoned.tombstones == 3
    key, window = workload.key(index), workload.window_of(workload.timestamp(index))
    assert poisoned.sequences[key] == whole.sequences[key] - {workload.sequence(index)}
    assert poisoned.windows[key][window] == whole.windows[key][window] - 1
    assert poisoned.malformed == whole.malformed


@pytest.mark.unit
def test_a_skewed_workload_puts_its_share_on_one_hash_range_and_counts_each_key_on() -> None:
    from collections import Counter

    from millstream.engine.keys import key_interval

    workload = Workload(records=4_000, keys=20, seed=3, rate=100.0, hot_share=0.8)
    assert Workload.from_json(workload.to_json()) == workload
    keys = [workload.key(i) for i in range(workload.records)]
    hot = sum(key_interval(k, 4) == 0 for k in keys) / len(keys)
    assert 0.8 <= hot <= 0.9  # the hot share, plus the uniform rest's part of that range
    per_key: Counter[str] = Counter()
    for index, key in enumerate(keys):
        assert workload.sequence(index) == per_key[key]
        per_key[key] += 1
    assert len(per_key) == 20  # the cold keys still get records
    expected = expected_outcome(workload)
    assert sum(len(s) for s in expected.sequences.values()) == 4_000 - len(expected.malformed)
    assert keys == [Workload.from_json(workload.to_json()).key(i) for i in range(4_000)]
    with pytest.raises(ValueError, match="hot_share"):
        Workload(records=1, keys=1, seed=1, rate=1.0, hot_share=1.0)


@pytest.mark.unit
def test_a_split_faults_trickle_makes_every_interval_cold_and_keeps_the_last_record(
    tmp_path: Path,
) -> None:
    """A trickle lets through fewer records than tally's merge threshold (so the batch merges
    a pair, and a full layout gets room to split), never the run's last record."""
    from millstream.devtools.proving import ground
    from millstream.devtools.proving.workload import rebalance_policy

    workload = Workload(records=1_000, keys=20, seed=1, rate=320.0, hot_share=0.8)
    few = rebalance_policy(workload).merge_records
    assert few == 10
    description = RunDescription("r", workload, 4, 20_000, rebalance=True)
    # The gate alone: no process starts.
    run = ground._Run(MillstreamConfig(), description, tmp_path, None, lambda _: None, {})
    position = run.gate.with_suffix(".position")
    for injected, let_through in ((500, 500 + few), (995, 999)):
        position.write_text(str(injected))
        run.trickle()
        assert int(run.gate.read_text()) == let_through
    position.write_text("999")
    run.gate.write_text("999")
    run.trickle()
    assert int(run.gate.read_text()) == 999


@pytest.mark.unit
def test_an_unplanned_exit_is_reported_by_the_line_naming_its_error() -> None:
    from millstream.devtools.proving.report import Unplanned

    log = (
        "Traceback (most recent call last):\n"
        '  File "kafka.py", line 290, in _when_ready\n'
        "confluent_kafka.error.KafkaException: KafkaError{code=OFFSET_NOT_AVAILABLE}\n"
        "   +- ~StreamingDataSourceV2ScanRelation[key#27] KafkaTable\n"
    )
    assert Unplanned("driver", 1, log).error.startswith("confluent_kafka.error.KafkaException")
    assert Unplanned("driver", 1, "no error named\nlast line").error == "last line"


@pytest.mark.unit
def test_an_unplanned_exit_shows_its_last_traceback_in_the_report(tmp_path: Path) -> None:
    """A CI machine keeps no run directory: the report itself says where the process failed."""
    from millstream.devtools.proving.report import Unplanned

    log = (
        "2026-12-03 07:35:23,647 millstream.engine.outages: waiting for Kafka\n"
        "Traceback (most recent call last):\n"
        '  File "connect.py", line 90, in _connected\n'
        "    channel = kafka_connector.KafkaWatermarkTopic(config)\n"
        "TimeoutError\n"
    )
    exit = Unplanned("injector", 1, log)
    assert exit.traceback == log.splitlines()[1:]
    assert Unplanned("injector", 1, "no traceback\n").traceback == []
    report = GroundReport("r", 1, TIERS["ci"], tmp_path)
    report.unplanned.append(exit)
    rendered = report.render().splitlines()
    at = rendered.index("  injector exited with 1: TimeoutError")
    assert rendered[at + 1 : at + 5] == [f"    {line}" for line in log.splitlines()[1:]]


@pytest.mark.unit
def test_an_unplanned_exit_fails_a_run_that_lost_nothing(tmp_path: Path) -> None:
    from millstream.devtools.proving.report import Unplanned

    report = GroundReport("r", 1, TIERS["ci"], tmp_path)
    clean = report.passed
    report.unplanned.append(Unplanned("injector", 1, "cassandra.cluster.NoHostAvailable: x"))
    assert (clean, report.passed) == (True, False)
    assert report.render().splitlines()[-1].startswith("FAILED")


@pytest.mark.unit
def test_an_injectors_outage_waits_are_counted_apart_for_its_steps_and_its_starts(
    tmp_path: Path,
) -> None:
    first, second = tmp_path / "injector-1.log", tmp_path / "injector-2.log"
    first.write_text(
        "2026-12-02 07:35:23,647 millstream.engine.outages: injector 'p_injector' process "
        "'1a2b': waiting for Kafka (0 s so far): KafkaException: _TRANSPORT\n"
        "2026-12-02 07:35:24,155 millstream.engine.outages: batch 3: waiting for Kafka\n"
    )
    second.write_text(
        "2026-12-02 07:35:23,647 millstream.engine.outages: injector 'p_injector' starting: "
        "waiting for Cassandra (0 s so far): ServiceOutageError: Cassandra at ...\n" * 2
    )
    assert injector_outage_waits([first, second]) == 1
    assert injector_outage_waits([first, second, tmp_path / "none.log"], starting=True) == 2


@pytest.mark.unit
def test_a_roles_members_include_descendants_that_left_its_process_group(tmp_path: Path) -> None:
    """Spark starts its Python daemons in sessions of their own: killing the driver's process
    group alone would leave a parked worker running on (found by the proving ground)."""
    import signal
    import subprocess

    from millstream.devtools.local.process import alive
    from millstream.devtools.proving.process_groups import Role

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
    import signal
    import subprocess

    from millstream.devtools.proving.process_groups import dump_stacks

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


@pytest.mark.integration
def test_a_plain_read_committed_reader_counts_a_message_sent_twice(
    services: MillstreamConfig, kafka_topic: Callable[..., str]
) -> None:
    """Read as any Kafka application reads: a message sent twice is one duplicate; an
    aborted transaction's messages are never read; a partition that ends in a transaction's
    commit marker (which no consumer receives) is still read to its end."""
    import uuid

    from confluent_kafka import Producer

    topic, other = kafka_topic(partitions=2), kafka_topic()
    plain = kafka_connector.producer(services)
    for value in (b"same", b"same", b"different"):
        plain.produce(topic, key=b"k", value=value, partition=0)
    plain.produce(other, key=b"k", value=b"same")
    assert plain.flush(30) == 0
    transactional = Producer(
        {
            **kafka_connector.client_settings(services),
            "transactional.id": f"proving-test-{uuid.uuid4().hex}",
        }
    )
    transactional.init_transactions(30)
    transactional.begin_transaction()
    for _ in range(2):
        transactional.produce(topic, key=b"k", value=b"aborted", partition=1)
    transactional.abort_transaction(30)
    transactional.begin_transaction()
    transactional.produce(topic, key=b"k", value=b"committed", partition=1)
    transactional.commit_transaction(30)

    messages = read_plain(services, [topic, other], timeout=30)
    assert sorted(messages) == sorted(
        [
            (topic, b"k", b"same"),
            (topic, b"k", b"same"),
            (topic, b"k", b"different"),
            (topic, b"k", b"committed"),
            (other, b"k", b"same"),
        ]
    )
    assert plain_duplicates(messages) == {topic: 1}


@pytest.mark.integration
def test_the_checks_read_outputs_once_no_transaction_is_open_on_them(
    services: MillstreamConfig, kafka_topic: Callable[..., str]
) -> None:
    """What a transaction left open hides (it and what others committed after it) is read
    once it ends; one still open after the limit is reported, with where it is."""
    import threading
    import uuid

    topic = kafka_topic(partitions=2)
    dying = kafka_connector.producer(
        services, **{"transactional.id": f"proving-open-{uuid.uuid4().hex}"}
    )
    dying.init_transactions(30)
    dying.begin_transaction()
    dying.produce(topic, value=b"open", partition=1)
    assert dying.flush(30) == 0
    plain = kafka_connector.producer(services)
    plain.produce(topic, value=b"committed after it", partition=1)
    assert plain.flush(30) == 0

    assert open_transactions(services, [topic], limit=1.0) == {(topic, 1): (0, 2)}
    ends = threading.Timer(2.0, dying.commit_transaction, args=(30,))
    ends.start()
    try:
        started = time.monotonic()
        assert open_transactions(services, [topic], limit=60.0, poll=0.1) == {}
        assert time.monotonic() - started >= 1.5, "it did not wait for the transaction"
    finally:
        ends.join()
    values = [v for _, _, v in read_plain(services, [topic], timeout=30)]
    assert sorted(v for v in values if v is not None) == [
        b"committed after it",
        b"open",
    ]


@pytest.fixture(scope="module")
def ci_run(services: MillstreamConfig) -> Iterator[GroundReport]:
    """The CI tier with a fault of every kind; its topics and keyspace are kept for the
    checks test to tamper with (after the CI tier's own test read its report)."""
    kinds = tuple(k for k in TIERS["ci"].kinds if not (EXTERNAL and k in ("kafka", "cassandra")))
    report = prove(
        services, TIERS["ci"], seed=11, services=_services(services), kinds=kinds,
        keep=True, progress=_progress,
    )  # fmt: skip
    try:
        yield report
    finally:
        if report.passed:  # a failed run keeps what tells why; its report names the directory
            discard(services, report.directory)


@pytest.mark.integration
def test_the_checks_catch_lost_duplicated_unexpected_effects_and_regressions(
    services: MillstreamConfig, ci_run: GroundReport
) -> None:
    kept_run = ci_run
    assert kept_run.passed, kept_run.render()
    run = RunDescription.read(kept_run.directory)
    config = run_config(services, run.run)
    expected = expected_outcome(run.workload)

    # Hold the run against an expectation it does not meet: one sequence number it never
    # processed (lost) and one it did that the expectation lacks (unexpected).
    key = sorted(expected.sequences)[0]
    tampered = expected_outcome(run.workload)
    tampered.sequences[key] = set(tampered.sequences[key])
    dropped = min(tampered.sequences[key])
    tampered.sequences[key].remove(dropped)
    tampered.sequences[key].add(10_000)
    checks, _ = recheck(services, kept_run.directory, tampered)
    assert checks.counts["lost"] >= 1
    assert checks.counts["unexpected"] >= 1
    assert checks.counts["duplicated"] == 0

    # A window's effect written again under another record ID is a duplicated effect; a
    # source's report below its last one a watermark regression.
    key, window, count = next(expected.window_records())
    sink = kafka_connector.KafkaProductionSink(config)
    try:
        duplicate = Record(
            f"w{window}",
            f'{{"key": "{key}", "window": {window}, "count": {count}}}'.encode(),
            1,
            b"\x01" * 16,
        )
        assert sink.send([Production(run.names.windows, duplicate)], 30.0)
    finally:
        sink.close()
    publisher = kafka_connector.KafkaWatermarkTopic(config)
    try:
        publisher.publish(WatermarkReport("injector/tamper/0", (run.names.events,), 100, 1))
        publisher.publish(WatermarkReport("injector/tamper/0", (run.names.events,), 50, 2))
    finally:
        publisher.close()
    checks, _ = recheck(services, kept_run.directory)
    assert checks.counts["duplicated"] == 1, checks.examples
    assert checks.counts["watermark regressions"] == 1, checks.examples
    assert checks.counts["lost"] == 0
    windows = kafka_connector.stream_topic(run.names.windows)
    assert checks.figures[f"plain read_committed duplicates: {windows}"] == 0
    # The stage without exactly-once reran inputs under the faults: copies of its own.
    copies = checks.figures["plain read_committed duplicates (total)"]
    assert checks.counts[PLAIN_DUPLICATES] == 0  # a check by default
    unchecked, _ = recheck(services, kept_run.directory, plain_exactly_once=False)
    assert PLAIN_DUPLICATES not in unchecked.counts  # a figure only, when turned off

    # A window record sent again byte for byte: the stream's readers dedup it by record ID
    # (no duplicated effect), a plain read_committed consumer reads it twice.
    topic, raw_key, raw_value = read_plain(config, [windows])[0]
    producer = kafka_connector.producer(config)
    producer.produce(topic, key=raw_key, value=raw_value)
    assert producer.flush(30) == 0
    checks, _ = recheck(services, kept_run.directory)
    assert checks.counts[PLAIN_DUPLICATES] == 1, checks.examples
    assert checks.figures[f"plain read_committed duplicates: {windows}"] == 1
    assert checks.figures["plain read_committed duplicates (total)"] == copies + 1
    assert checks.counts["duplicated"] == 1, checks.examples  # the tamper above, no more
    assert not checks.passed


@pytest.mark.integration
def test_the_ci_tier_loses_and_duplicates_nothing_under_a_fault_of_every_kind(
    ci_run: GroundReport,
) -> None:
    report = ci_run
    kinds = tuple(k for k in TIERS["ci"].kinds if not (EXTERNAL and k in ("kafka", "cassandra")))
    text = report.render()
    print(text)
    assert sorted(o.fault.kind for o in report.outcomes) == sorted(kinds)
    assert all(o.applied for o in report.outcomes), text
    assert report.checks.passed, text
    assert (
        report.checks.figures["processed (distinct, from state)"]
        == report.checks.figures["expected processed"]
    )
    provoked = report.provoked
    # Non-vacuity: the zombie was fenced, a crash between commit and send left productions
    # that the next driver sent again, a replayed batch's records were dropped, the commit
    # in flight when Cassandra died had an unknown outcome, and the driver waited out the
    # services' restarts.
    assert provoked.fenced_attempts >= 1, text
    assert provoked.resent_productions >= 1, text
    assert provoked.duplicates_absorbed >= 1, text
    # A driver killed in an open Kafka transaction left commits its successor found
    # undelivered (the transaction aborted), and one killed after the Kafka commit left
    # pending productions its successor found delivered by the marker, not resent.
    assert provoked.aborted_commits >= 1, text
    assert provoked.marker_resolved >= 1, text
    # tally's intervals split and merged, and the driver killed amid one was followed by a
    # driver that finished the change it found journaled.
    assert provoked.interval_changes >= 1, text
    assert provoked.changes_finished_after_a_kill >= 1, text
    if not EXTERNAL:
        assert provoked.unknown_outcomes >= 1, text
        assert provoked.outage_waits >= 1, text
        # The injector restarted while a service was down waited for it as it started.
        assert provoked.injector_start_waits >= 1, text
        # The kill of Cassandra came moments after LWTs it had acknowledged (none lost).
        assert report.checks.figures["LWTs acknowledged just before a Cassandra kill"] >= 1, text
    assert not report.unplanned, text
