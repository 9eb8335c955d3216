"""An injector process's Prometheus metrics: in the harness, and served on the real stack."""

from __future__ import annotations

import urllib.error
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from millstream.connectors import kafka as kafka_connector
from millstream.engine.config import MillstreamConfig
from millstream.injectors import InjectorOptions, LogFileSource, Poll, RejectedInput, SourceRecord
from millstream.injectors.connect import connect_injector
from millstream.injectors.process import InjectorStats
from millstream.injectors.prometheus import STATS_METRICS
from millstream.injectors.testing import injector_harness
from tests.connectors.test_prometheus import Samples, free_port, scrape
from tests.injectors.logfile_app import parse
from tests.injectors.test_process import Numbers, Scripted

SECOND = 1_000_000
NUMS = {"injector": "nums", "process": "0"}


@pytest.mark.unit
def test_every_counter_of_the_stats_is_exported() -> None:
    counting = {name for name, value in vars(InjectorStats()).items() if isinstance(value, int)}
    assert set(STATS_METRICS) == counting


@pytest.mark.unit
def test_records_emitted_dead_letters_and_the_watermark_are_read_at_scrape_time() -> None:
    registry = CollectorRegistry()
    polls = [
        Poll(
            records=[
                SourceRecord("numbers", "a", b"1", 5 * SECOND, "file", 0),
                SourceRecord("numbers", "a", b"2", 10**25, "file", 1),  # ns, not µs
                SourceRecord("numbers", "b", b"3", 6 * SECOND, "file", 2),
            ],
            rejected=[RejectedInput("file", 3, b"garbage", "ValueError", "no time")],
            position={"at": 4},
            watermark=6 * SECOND,
        )
    ]
    harness = injector_harness("nums", Scripted(polls), metrics=registry)
    before = Samples.of(registry)
    assert before["millstream_injector_records_emitted_total", NUMS] == 0
    assert before["millstream_injector_watermark_timestamp_seconds", NUMS] == 0

    harness.process.start()
    harness.process.step()
    harness.clock.set(10 * SECOND)

    samples = Samples.of(registry)
    assert samples["millstream_injector_records_emitted_total", NUMS] == 2
    assert samples["millstream_injector_dead_letters_total", NUMS] == 2
    assert samples["millstream_injector_polls_total", NUMS] == 1
    assert samples["millstream_injector_checkpoints_total", NUMS] == 1
    assert samples["millstream_injector_reports_total", NUMS] == harness.process.stats.reports
    assert samples["millstream_injector_watermark_timestamp_seconds", NUMS] == 6
    assert samples["millstream_injector_watermark_lag_seconds", NUMS] == 4
    assert "acknowledged" in samples.help["millstream_injector_records_emitted"]


@pytest.mark.unit
def test_a_restarted_process_takes_over_the_harness_metrics() -> None:
    registry = CollectorRegistry()
    harness = injector_harness("nums", Numbers(), metrics=registry)
    harness.process.start()
    harness.process.step()
    assert Samples.of(registry)["millstream_injector_records_emitted_total", NUMS] == 3

    harness.restart(Numbers())
    harness.process.step()
    samples = Samples.of(registry)
    # A new process counts from zero (Prometheus' rate() sees a counter reset); its
    # watermark is where the checkpoint left it, and further.
    assert samples["millstream_injector_records_emitted_total", NUMS] == 3
    assert samples["millstream_injector_watermark_timestamp_seconds", NUMS] == 6


@pytest.fixture
def stream(services: MillstreamConfig, unique: Callable[[str], str]) -> Iterator[str]:
    name = unique("metered")
    yield name
    kafka_connector.delete_topics(services, [name, f"{name}.dead-letters"])


@pytest.mark.integration
def test_a_connected_injector_serves_its_metrics_while_it_runs(
    services: MillstreamConfig,
    cassandra_keyspace: Callable[[], str],
    stream: str,
    tmp_path: Path,
) -> None:
    lines = [f"{SECOND * (1_000 + n)} k{n % 3} v{n}" for n in range(40)]
    (tmp_path / "a.log").write_text("\n".join([*lines[:20], "not a line", *lines[20:]]) + "\n")
    source = LogFileSource(tmp_path, parse, stream, follow=False)
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    labels = {"injector": stream, "process": "1"}
    options = InjectorOptions(process="1", poll_timeout=0)
    settings = replace(services.run, keyspace=cassandra_keyspace(), metrics_port=port)
    with connect_injector(services, stream, source, options, settings) as injector:
        injector.start()
        while not injector.exhausted:
            injector.step()
        samples = scrape(url)
        wall = injector.clock.now()
    assert samples["millstream_injector_records_emitted_total", labels] == len(lines)
    assert samples["millstream_injector_dead_letters_total", labels] == 1
    # A replayed directory promises the end of time once it is read.
    assert samples["millstream_injector_watermark_timestamp_seconds", labels] == 253_402_300_800
    lag = samples["millstream_injector_watermark_lag_seconds", labels]
    assert lag == pytest.approx((wall - 253_402_300_799_999_999) / 1e6, abs=5)
    with pytest.raises(urllib.error.URLError):
        scrape(url, timeout=2)  # the endpoint went with the block
