"""The proving ground's report: what it says of a process that exited unplanned."""

from __future__ import annotations

from pathlib import Path

import pytest

from millstream.devtools.proving.faults import TIERS
from millstream.devtools.proving.report import GroundReport, Unplanned


@pytest.mark.unit
def test_an_unplanned_exit_is_reported_by_the_line_naming_its_error() -> None:
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
    report = GroundReport("r", 1, TIERS["ci"], tmp_path)
    clean = report.passed
    report.unplanned.append(Unplanned("injector", 1, "cassandra.cluster.NoHostAvailable: x"))
    assert (clean, report.passed) == (True, False)
    assert report.render().splitlines()[-1].startswith("FAILED")


@pytest.mark.unit
def test_a_report_says_how_the_topology_ran(tmp_path: Path) -> None:
    each = GroundReport("r", 1, TIERS["ci"], tmp_path)
    one = GroundReport("r", 1, TIERS["ci"], tmp_path, one_query=True)
    assert each.render().splitlines()[1] == "a query per computation"
    assert one.render().splitlines()[1] == "the topology in one query"
    assert (each.to_json()["one_query"], one.to_json()["one_query"]) == (False, True)
