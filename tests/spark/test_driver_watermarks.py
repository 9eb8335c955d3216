"""The driver's watermark bookkeeping keeps a report it could not publish (Kafka down)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from millstream.connectors import kafka as kafka_connector
from millstream.engine.authority import WatermarkAuthority
from millstream.engine.clock import ManualClock
from millstream.engine.computation import Computation
from millstream.engine.config import MillstreamConfig
from millstream.engine.context import Context
from millstream.engine.records import Record
from millstream.engine.topology import Topology
from millstream.engine.watermark_topic import MemoryWatermarkTopic
from millstream.engine.watermarks import WatermarkReport
from millstream.engine.watermarks.intervals import IntervalProgress
from millstream.spark import driver_watermarks
from millstream.spark.driver_watermarks import DriverWatermarks

pytestmark = pytest.mark.unit


class Forward(Computation):
    def process_record(self, ctx: Context, record: Record) -> None:
        ctx.produce("out", record.value, record.timestamp)


class Unused:
    """Stands in for a Kafka client this test never reaches."""

    def close(self) -> None:
        pass


class FlakyTopic(MemoryWatermarkTopic):
    """Fails its first ``failures`` publishes as a broker that is down would."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    def publish(self, report: WatermarkReport) -> None:
        if self.failures:
            self.failures -= 1
            raise TimeoutError("the broker did not acknowledge the report within 30 s")
        super().publish(report)


@pytest.fixture
def driver(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[DriverWatermarks, FlakyTopic]]:
    monkeypatch.setattr(driver_watermarks, "offsets_consumer", lambda config: Unused())
    monkeypatch.setattr(kafka_connector, "end_offsets", lambda *_: {"out": {0: 7}})
    topology = Topology("flaky", streams=["in"])
    spec = topology.add_computation("forward", Forward(), inputs=["in"], outputs=["out"])
    topic = FlakyTopic(failures=1)
    authority = WatermarkAuthority(MemoryWatermarkTopic())  # a topic without messages
    watermarks = DriverWatermarks(
        MillstreamConfig(), topology, spec, topic, ManualClock(), authority
    )
    yield watermarks, topic
    watermarks.close()


def test_a_report_that_failed_to_publish_is_published_by_the_next_call(
    driver: tuple[DriverWatermarks, FlakyTopic],
) -> None:
    watermarks, topic = driver
    made: list[WatermarkReport] = []

    def report_once(sequence: int, offsets: Any) -> WatermarkReport | None:
        # The bookkeeping makes a report once per change: after the first it says "no change".
        if made:
            return None
        made.append(
            WatermarkReport(
                watermarks.state.source, ("out",), 5, sequence, offsets, input_watermark=6
            )
        )
        return made[0]

    with pytest.raises(TimeoutError):
        watermarks.after_batch(1, report_once)
    assert topic.reports() == []
    watermarks.after_batch(1, report_once)  # the batch retried once Kafka is back
    assert topic.reports() == made
    watermarks.after_batch(2, report_once)
    assert topic.reports() == made  # published once, not again


def test_a_batch_that_left_productions_pending_wakes_its_query_for_another(
    driver: tuple[DriverWatermarks, FlakyTopic], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the input has ended nothing else starts the batch that delivers them (a
    transaction fenced in the last batch left a proving run's driver waiting for good)."""
    watermarks, topic = driver
    topic.failures = 0
    monkeypatch.setattr(driver_watermarks, "UNDELIVERED_RETRY_SECONDS", 0.05)
    intervals = watermarks.state.intervals
    interval = min(intervals.ids)
    intervals.record(interval, IntervalProgress(oldest_work=3, pending=2))
    watermarks.after_batch(1, lambda *_: None)
    deadline = time.monotonic() + 5.0
    while not topic.wakes and time.monotonic() < deadline:
        time.sleep(0.01)
    assert topic.wakes == [(watermarks.alarm_topic, f"alarm/flaky/{watermarks.spec.name}")]

    # Delivered: no more wake-ups.
    topic.wakes.clear()
    intervals.record(interval, IntervalProgress())
    watermarks.after_batch(2, lambda *_: None)
    time.sleep(0.2)
    assert topic.wakes == []
