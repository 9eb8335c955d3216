"""An injector process's metrics for Prometheus (``InjectorProcess(metrics=registry)``,
``connect_injector(metrics_port=...)``).

:class:`InjectorCollector` reads the process's :class:`~millstream.injectors.process.InjectorStats`
and watermark at each scrape, so the injector loop does nothing more per record. Every series
carries the labels ``injector`` and ``process``:

- ``millstream_injector_records_emitted_total``: records Kafka acknowledged, dead letters apart;
- ``millstream_injector_dead_letters_total``: input that became dead letters;
- ``millstream_injector_polls_total``, ``..._checkpoints_total``, ``..._reports_total``,
  ``..._heartbeats_total``, ``..._skew_waits_total``: the rest of its stats;
- ``millstream_injector_watermark_timestamp_seconds``: the watermark it reported last
  (seconds since the epoch), and ``millstream_injector_watermark_lag_seconds``, wall time
  (the process's clock) minus it.

A topology's driver exports the same watermark gauges as its consumers applied them, with a
``topology`` label (:mod:`millstream.spark.prometheus`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Final

from prometheus_client import Metric
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

if TYPE_CHECKING:
    from millstream.injectors.process import InjectorProcess

__all__ = ["STATS_METRICS", "InjectorCollector"]

STATS_METRICS: Final = {
    "emitted": (
        "millstream_injector_records_emitted",
        "Records the injector sent and Kafka acknowledged (dead letters apart).",
    ),
    "dead_letters": (
        "millstream_injector_dead_letters",
        "Input the injector could not turn into records, sent as dead letters.",
    ),
    "polls": ("millstream_injector_polls", "Polls of the injector's source."),
    "checkpoints": (
        "millstream_injector_checkpoints",
        "Positions checkpointed under the process's sequencer.",
    ),
    "reports": (
        "millstream_injector_reports",
        "Watermark reports published, heartbeats included.",
    ),
    "heartbeats": (
        "millstream_injector_heartbeats",
        "Watermark reports repeated while the source was idle.",
    ),
    "skew_waits": (
        "millstream_injector_skew_waits",
        "Waits because the injector was more than its skew limit ahead of downstream.",
    ),
}
"""The counter (``<name>_total``) of each counting field of ``InjectorStats``."""

_LABELS: Final = ("injector", "process")


class InjectorCollector:
    """Collects ``process``'s metrics at scrape time; see the module docstring."""

    def __init__(self, process: InjectorProcess) -> None:
        self.process = process

    def describe(self) -> Iterable[Metric]:
        counters, watermark, lag = self._families()
        return [*counters, watermark, lag]

    def collect(self) -> Iterable[Metric]:
        counters, watermark, lag = self._families()
        process = self.process
        labels = [process.name, process.process]
        for family, field in zip(counters, STATS_METRICS, strict=True):
            family.add_metric(labels, getattr(process.stats, field))
        watermark.add_metric(labels, process.watermark / 1e6)
        lag.add_metric(labels, (process.clock.now() - process.watermark) / 1e6)
        return [*counters, watermark, lag]

    @staticmethod
    def _families() -> tuple[list[CounterMetricFamily], GaugeMetricFamily, GaugeMetricFamily]:
        counters = [
            CounterMetricFamily(name, help_text, labels=_LABELS)
            for name, help_text in STATS_METRICS.values()
        ]
        watermark = GaugeMetricFamily(
            "millstream_injector_watermark_timestamp_seconds",
            "The injector process's low watermark as it reported it last (0 before its "
            "first report).",
            labels=_LABELS,
        )
        lag = GaugeMetricFamily(
            "millstream_injector_watermark_lag_seconds",
            "Wall time now minus millstream_injector_watermark_timestamp_seconds.",
            labels=_LABELS,
        )
        return counters, watermark, lag
