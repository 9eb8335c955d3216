"""``millstream watermarks`` and ``millstream state``: what the watermark overview shows for
each kind of source and the exit codes, without services; then the command on the real
watermark topic."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable

import pytest

from millstream import cli
from millstream.cli import inspection
from millstream.connectors import kafka as kafka_connector
from millstream.engine.config import MillstreamConfig, load_config
from millstream.engine.errors import MillstreamError
from millstream.engine.records import MAX_EVENT_TIME, MIN_EVENT_TIME
from millstream.engine.watermarks import (
    ExpectedSet,
    SourceStatus,
    WatermarkMessage,
    WatermarkReport,
    computation_source,
    injector_source,
)

FINISHED = computation_source("shop", "totals")
STARTING = injector_source("orders", "0")
SILENT = injector_source("orders", "1")
RUNNING = computation_source("shop", "counts")

# A finished computation (its input ended), an injector process whose first report has no time
# yet, its sibling that never reported, and a computation a minute behind.
TOPIC: list[tuple[str, WatermarkMessage | None]] = [
    (FINISHED, WatermarkReport(FINISHED, ("totals",), MAX_EVENT_TIME, 9, held_by="input")),
    ("injector/orders", ExpectedSet("orders", ("orders",), ("0", "1"))),
    (STARTING, WatermarkReport(STARTING, ("orders",), MIN_EVENT_TIME, 1)),
    (RUNNING, WatermarkReport(RUNNING, ("counts",), 1_700_000_000_000_000, 3, held_by="input")),
]
NOW = 1_700_000_060_000_000


@pytest.fixture
def watermark_topic(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, WatermarkMessage | None]]:
    """What ``millstream watermarks`` reads (a list to fill), at the wall time ``NOW``."""
    messages: list[tuple[str, WatermarkMessage | None]] = []
    monkeypatch.setattr(inspection, "_read_watermark_topic", lambda config: messages)
    monkeypatch.setattr("millstream.engine.clock.SystemClock.now", lambda self: NOW)
    return messages


@pytest.mark.unit
def test_watermarks_shows_complete_and_no_report_yet_without_a_lag(
    watermark_topic: list[tuple[str, WatermarkMessage | None]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    watermark_topic += TOPIC
    assert cli.main(["watermarks"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"{STARTING}: no report yet  held by: reported  streams: orders",
        f"{SILENT}: no report yet  held by: expected, never reported: holds  streams: orders",
        f"{RUNNING}: 2023-11-14T22:13:20.000000Z  lag 60.0 s  held by: input  streams: counts",
        f"{FINISHED}: complete  streams: totals",
    ]


@pytest.mark.unit
def test_watermarks_json_says_each_sources_state_and_no_lag_where_it_means_nothing(
    watermark_topic: list[tuple[str, WatermarkMessage | None]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    watermark_topic += TOPIC
    assert cli.main(["watermarks", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["source"], r["state"], r["watermark"], r["lag"]) for r in rows] == [
        (STARTING, "no report yet", None, None),
        (SILENT, "no report yet", None, None),
        (RUNNING, "reporting", 1_700_000_000_000_000, 60_000_000),
        (FINISHED, "complete", MAX_EVENT_TIME, None),
    ]


@pytest.mark.unit
def test_watermarks_exits_1_when_no_source_has_reported(
    watermark_topic: list[tuple[str, WatermarkMessage | None]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["watermarks"]) == 1
    shown = capsys.readouterr()
    assert shown.out == ""
    topic = load_config().kafka_watermark_topic
    assert shown.err == f"no source has reported on the watermark topic {topic!r} yet\n"


@pytest.mark.unit
def test_percentile_and_timer_watermarks_at_the_ends_of_time_are_said_in_words() -> None:
    row = SourceStatus(
        RUNNING,
        1_700_000_000_000_000,
        5_000_000,
        "interval 2",
        ("counts",),
        percentiles={99.0: MIN_EVENT_TIME},
        timer_watermark=MAX_EVENT_TIME,
        hot=((2, 1_200),),
    )
    assert inspection.render_source(row) == (
        f"{RUNNING}: 2023-11-14T22:13:20.000000Z  lag 5.0 s  p99: not yet  timers at: complete"
        "  held by: interval 2  hot: interval 2 (1,200 records)  streams: counts"
    )


@pytest.mark.unit
def test_an_unreachable_kafka_is_an_error_naming_it() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free_port = probe.getsockname()[1]
    nowhere = MillstreamConfig(kafka_bootstrap=f"127.0.0.1:{free_port}")
    with pytest.raises(MillstreamError) as failed:
        inspection._read_watermark_topic(nowhere, timeout=1)
    assert str(failed.value).startswith(
        "could not read the watermark topic 'millstream.watermarks'"
    )
    assert str(failed.value).endswith(
        f"is Kafka up at 127.0.0.1:{free_port}? (millstream status shows the local one)"
    )


@pytest.mark.integration
def test_watermarks_shows_each_source_and_the_silent_expected_processes(
    services: MillstreamConfig,
    unique: Callable[[str], str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    injector = unique("inj").replace("_", "-")
    publisher = kafka_connector.KafkaWatermarkTopic(services)
    try:
        publisher.declare(ExpectedSet(injector, (injector,), ("0", "1")))
        publisher.publish(
            WatermarkReport(injector_source(injector, "0"), (injector,), 1_700_000_000_000_000, 1)
        )
        assert cli.main(["watermarks", "--json"]) == 0
        rows = {
            row["source"]: row
            for row in map(json.loads, capsys.readouterr().out.splitlines())
            if row["source"].startswith(f"injector/{injector}/")
        }
        assert rows[injector_source(injector, "0")]["watermark"] == 1_700_000_000_000_000
        assert rows[injector_source(injector, "0")]["lag"] > 0
        assert rows[injector_source(injector, "0")]["state"] == "reporting"
        assert rows[injector_source(injector, "1")]["watermark"] is None
        assert rows[injector_source(injector, "1")]["lag"] is None
        assert rows[injector_source(injector, "1")]["state"] == "no report yet"
        assert cli.main(["watermarks"]) == 0
        assert f"{injector_source(injector, '1')}: no report yet" in capsys.readouterr().out

        # A computation's report: its percentile watermark, its timers' and its hot intervals.
        computation = f"computation/{injector}/count"
        publisher.publish(
            WatermarkReport(
                computation,
                ("counts",),
                1_700_000_000_000_000,
                1,
                percentiles={99.0: 1_700_000_060_000_000},
                timer_watermark=1_700_000_030_000_000,
                hot=((3, 1_200), (0, 40)),
            )
        )
        assert cli.main(["watermarks"]) == 0
        line = next(
            row for row in capsys.readouterr().out.splitlines() if row.startswith(computation)
        )
        assert "p99: 2023-11-14T22:14:20" in line
        assert "timers at: 2023-11-14T22:13:50" in line
        assert "hot: interval 3 (1,200 records), interval 0 (40 records)" in line
    finally:
        publisher.retire(f"computation/{injector}/count")
        publisher.retire(injector_source(injector, "0"))
        publisher.retire(f"injector/{injector}")
        publisher.close()
