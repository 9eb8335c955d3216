"""The proving ground on the real stack: the CI tier with a fault of every kind, and checks
that catch a lost, a duplicated and an unexpected effect and a watermark that went back;
and the gate a split fault trickles records through."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

from millstream.connectors import kafka as kafka_connector
from millstream.devtools.proving import ground
from millstream.devtools.proving.checks import PLAIN_DUPLICATES, read_plain
from millstream.devtools.proving.faults import TIERS
from millstream.devtools.proving.ground import discard, prove, query_mode, recheck, run_config
from millstream.devtools.proving.processes import BATCHES_FILE, RunDescription
from millstream.devtools.proving.report import GroundReport
from millstream.devtools.proving.workload import Workload, expected_outcome, rebalance_policy
from millstream.engine.config import MillstreamConfig, RunSettings, load_config
from millstream.engine.productions import Production
from millstream.engine.records import Record
from millstream.engine.watermarks import WatermarkReport

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
def test_a_run_tells_its_driver_how_to_run_the_topology_and_says_which() -> None:
    config = MillstreamConfig()
    assert query_mode(config, {"A": "1"}, None) == ({"A": "1"}, False)
    configured = MillstreamConfig(run=RunSettings(one_query=True))
    assert query_mode(configured, {}, None) == ({}, True)
    for one_query in (True, False):
        environment, said = query_mode(configured, {"A": "1"}, one_query)
        assert said is one_query
        assert environment["A"] == "1"
        # What the driver's load_config makes of the environment it is given.
        assert load_config(environment, Path(os.devnull)).run.one_query is one_query


@pytest.mark.unit
def test_a_split_faults_trickle_makes_every_interval_cold_and_keeps_the_last_record(
    tmp_path: Path,
) -> None:
    """A trickle lets through fewer records than tally's merge threshold (so the batch merges
    a pair, and a full layout gets room to split), never the run's last record."""
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
def test_a_batch_on_given_intervals_is_one_of_the_current_driver_that_processed_records_there(
    tmp_path: Path,
) -> None:
    """What split-zombie waits for: the new driver's batch that processed records on the
    targets of the change the stopped driver journaled."""
    workload = Workload(records=100, keys=4, seed=1, rate=10.0)
    description = RunDescription("r", workload, 4, 20_000, rebalance=True)
    run = ground._Run(MillstreamConfig(), description, tmp_path, None, lambda _: None, {})
    run.driver.proc = cast(subprocess.Popen[bytes], SimpleNamespace(pid=41))
    # (pid, at, computation, processed, processed_intervals)
    batches = [
        (41, 5.0, "tally", 2, [7]),
        (40, 20.0, "tally", 2, [7]),
        (41, 20.0, "tally", 0, []),
        (41, 21.0, "rollup", 1, [7]),
        (41, 22.0, "tally", 3, [1]),
    ]
    names = ("pid", "at", "computation", "processed", "processed_intervals")
    lines = [dict(zip(names, batch, strict=True)) for batch in batches]
    (tmp_path / BATCHES_FILE).write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert run.ran_batch(10.0, "tally", processed=True)()
    assert run.ran_batch(10.0, "tally", processed=True, on=(1, 5))()
    # An earlier batch, another driver's, another computation's: none on interval 7.
    assert not run.ran_batch(10.0, "tally", processed=True, on=(7,))()
    assert run.ran_batch(0.0, "tally", processed=True, on=(7,))()


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
