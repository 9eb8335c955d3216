"""A running topology's metrics for Prometheus (``run_topology(metrics_port=...)``,
``millstream run --metrics-port``).

:class:`TopologyMetrics` fills a registry of its own from two feeds, so that it needs no
handle on the runner:

- every recorded batch (:meth:`TopologyMetrics.observe`, called by the runner as each
  :class:`~millstream.spark.metrics.BatchMetrics` is recorded) adds to the counters of
  its computation, observes its seconds and sets the gauges of its latest batch;
- at each scrape, ``watermarks()`` gives every computation's
  :class:`~millstream.spark.driver_watermarks.WatermarkSnapshot`, from which the
  watermark gauges and their lag behind ``clock`` (the runner's) are read.

Every series carries the labels ``topology`` and ``computation``, except the injector
gauges, which carry ``topology``, ``injector`` and ``process``. Counters count from the
driver's start (Prometheus' ``rate()`` and ``increase()`` handle the restart). Timestamps are
seconds since the epoch, like Prometheus' own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Metric
from prometheus_client.core import GaugeMetricFamily

from millstream.connectors.kafka.stalls import STALL_AFTER_SECONDS
from millstream.engine.clock import Clock, SystemClock
from millstream.engine.watermarks import parse_injector_source
from millstream.spark.driver_watermarks import WatermarkSnapshot
from millstream.spark.metrics import BatchMetrics

__all__ = ["BATCH_SECONDS_BUCKETS", "COUNTER_METRICS", "TopologyMetrics"]

COUNTER_METRICS: Final[Mapping[str, tuple[str, str]]] = {
    "inputs": (
        "millstream_records_in_total",
        "Kafka messages a computation read from its input streams (rejected ones included).",
    ),
    "rejected": (
        "millstream_records_rejected_total",
        "Input messages that could not be decoded or keyed (they became dead letters).",
    ),
    "processed": (
        "millstream_records_processed_total",
        "Records that ran the computation's process_record (duplicates apart).",
    ),
    "duplicates": (
        "millstream_duplicates_total",
        "Records dropped because their record ID was already committed (exactly-once).",
    ),
    "late": (
        "millstream_late_records_total",
        "Records older than the input low watermark when they were processed.",
    ),
    "dead_letters": (
        "millstream_dead_letters_total",
        "Dead letters written to the computation's dead-letter stream (rejected included).",
    ),
    "committed_keys": (
        "millstream_committed_keys_total",
        "Key commits (one conditional write of a key's changes each).",
    ),
    "fired_timers": ("millstream_timers_fired_total", "Timers that ran process_timer."),
    "acknowledged": (
        "millstream_productions_acknowledged_total",
        "Productions Kafka acknowledged.",
    ),
    "intervals": (
        "millstream_interval_runs_total",
        "Key-interval tasks run (one per interval with work and batch).",
    ),
    "rescans": (
        "millstream_interval_rescans_total",
        "Interval tasks that had to reload the interval's soft state from Cassandra.",
    ),
    "cache_hits": (
        "millstream_cache_hits_total",
        "Interval tasks that found their cached worker still valid (no reload).",
    ),
    "resent": (
        "millstream_productions_resent_total",
        "Checkpointed productions sent again as a batch began (after a crash or takeover).",
    ),
    "unknown_outcomes": (
        "millstream_unknown_outcomes_total",
        "Commits whose outcome was unknown (a timeout) and was read back from the store.",
    ),
    "expired": (
        "millstream_state_expired_total",
        "Keys whose state expired: the input watermark passed its last update plus its TTL.",
    ),
    "transactions": (
        "millstream_transactions_total",
        "Kafka transactions of transactional productions committed.",
    ),
    "transaction_failures": (
        "millstream_transaction_failures_total",
        "Kafka transactions aborted or of unknown outcome, and opens Kafka did not answer.",
    ),
    "fenced_producers": (
        "millstream_fenced_producers_total",
        "Transactions refused because a newer producer of the interval was opened (zombies).",
    ),
    "marker_resolved": (
        "millstream_productions_marker_resolved_total",
        "Pending productions a new owner found delivered by the transaction marker (not resent).",
    ),
    "aborted_commits": (
        "millstream_aborted_commits_total",
        "Earlier owners' commits found undelivered by an open: their Kafka transaction was "
        "aborted, timed out or never begun (while open it held read_committed readers).",
    ),
    "unsettled_commits": (
        "millstream_unsettled_commits_total",
        "Kafka transactions whose commit was answered but whose marker did not then read as "
        "committed (their productions stay pending until the marker resolves them).",
    ),
    "sequencer_conflicts": (
        "millstream_sequencer_conflicts_total",
        "Acquire attempts that lost the interval's sequencer to another writer, or whose "
        "outcome was unknown (each costs one more conditional write).",
    ),
}
"""The Prometheus counter of each :class:`~millstream.spark.metrics.MetricCounts`
field that counts; ``pending``, a level, is the gauge ``millstream_productions_pending``."""

BATCH_SECONDS_BUCKETS: Final = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)

_LABELS: Final = ("topology", "computation")
_INJECTOR_LABELS: Final = ("topology", "injector", "process")


class TopologyMetrics:
    """The Prometheus metrics of topology ``topology``, in ``registry`` (default: a new
    one); see the module docstring. ``watermarks`` may be given later (:meth:`watch`):
    until then no watermark gauge is exported."""

    def __init__(
        self,
        topology: str,
        *,
        registry: CollectorRegistry | None = None,
        clock: Clock | None = None,
        watermarks: Callable[[], Mapping[str, WatermarkSnapshot]] | None = None,
    ) -> None:
        self.topology = topology
        self.registry = registry if registry is not None else CollectorRegistry()
        self._counters = {
            field: Counter(name, help_text, _LABELS, registry=self.registry)
            for field, (name, help_text) in COUNTER_METRICS.items()
        }
        self._pending = Gauge(
            "millstream_productions_pending",
            "Productions not yet acknowledged by Kafka after the computation's latest batch.",
            _LABELS,
            registry=self.registry,
        )
        self._batches = Counter(
            "millstream_batches_total",
            "Micro-batches that ran anything.",
            _LABELS,
            registry=self.registry,
        )
        self._failed_attempts = Counter(
            "millstream_batch_failed_attempts_total",
            "Attempts of a micro-batch that failed and were run again.",
            _LABELS,
            registry=self.registry,
        )
        self._isolated = Counter(
            "millstream_poison_records_total",
            "Messages that made the engine fail, isolated from their batch and quarantined "
            "(each one dead letter with PoisonRecordError).",
            _LABELS,
            registry=self.registry,
        )
        self._isolation_runs = Counter(
            "millstream_isolation_runs_total",
            "Sub-runs of failing micro-batches run to isolate poison records.",
            _LABELS,
            registry=self.registry,
        )
        self._step_seconds = Counter(
            "millstream_step_seconds_total",
            "Seconds of each step of the computation's batches (routing, once a task; an "
            "interval's lease, resend, reads, user_code, weak_sends, staging, commit, "
            "delivery, finish), summed over tasks and intervals.",
            (*_LABELS, "step"),
            registry=self.registry,
        )
        self._step_cpu_seconds = Counter(
            "millstream_step_cpu_seconds_total",
            "CPU seconds the threads of each step ran (its seconds less this: waiting on "
            "Cassandra or Kafka, on the Python worker's interpreter, or for a core).",
            (*_LABELS, "step"),
            registry=self.registry,
        )
        self._seconds = Histogram(
            "millstream_batch_seconds",
            "Wall seconds of a micro-batch on the driver, watermark bookkeeping included.",
            _LABELS,
            registry=self.registry,
            buckets=BATCH_SECONDS_BUCKETS,
        )
        self._hit_ratio = Gauge(
            "millstream_cache_hit_ratio",
            "Share of the latest batch's interval tasks whose cached worker was still valid "
            "(over a time range: rate of millstream_cache_hits_total over "
            "millstream_interval_runs_total).",
            _LABELS,
            registry=self.registry,
        )
        self._stalls = Counter(
            "millstream_transaction_stalls_total",
            "Output partitions found stalled: their last stable offset stayed behind the high "
            f"watermark, unmoved, for {STALL_AFTER_SECONDS:.0f} s or more (a producer died in a "
            "transaction; "
            "read_committed readers wait until the next owner or the transaction timeout "
            "aborts it).",
            _LABELS,
            registry=self.registry,
        )
        self._stalled = Gauge(
            "millstream_transaction_stalled_partitions",
            "Output partitions stalled by an open transaction as of the latest probe.",
            _LABELS,
            registry=self.registry,
        )
        self._stall_seconds = Gauge(
            "millstream_transaction_stall_seconds",
            "How long the longest stalled output partition's last stable offset has not moved.",
            _LABELS,
            registry=self.registry,
        )
        self._unstable = Gauge(
            "millstream_transaction_unstable_messages",
            "Messages of the output partitions past their last stable offset (not yet readable "
            "by read_committed readers) as of the latest probe.",
            _LABELS,
            registry=self.registry,
        )
        self._hanging = Counter(
            "millstream_hanging_transactions_aborted_total",
            "Transactions found hanging on the topology's transactional streams or their "
            "markers (open, silent, and no longer counted by their coordinator) and aborted "
            "by the driver's sweep.",
            ("topology",),
            registry=self.registry,
        )
        self._watermarks = _WatermarkCollector(topology, clock or SystemClock(), watermarks)
        self.registry.register(self._watermarks)

    def hanging_aborted(self, count: int = 1) -> None:
        """Count hanging transactions the driver aborted."""
        self._hanging.labels(self.topology).inc(count)

    def watch(self, watermarks: Callable[[], Mapping[str, WatermarkSnapshot]]) -> None:
        """Read the watermark gauges from ``watermarks()`` at each scrape."""
        self._watermarks.source = watermarks

    def observe(self, batch: BatchMetrics) -> None:
        """Count a recorded batch (thread-safe: each computation's query calls it)."""
        labels = (self.topology, batch.computation)
        for field, counter in self._counters.items():
            counter.labels(*labels).inc(getattr(batch, field))
        self._pending.labels(*labels).set(batch.pending)
        self._batches.labels(*labels).inc()
        self._failed_attempts.labels(*labels).inc(len(batch.failed_attempts))
        self._isolated.labels(*labels).inc(batch.isolated)
        self._isolation_runs.labels(*labels).inc(batch.isolation_runs)
        self._seconds.labels(*labels).observe(batch.seconds)
        for step, took in batch.steps.items():
            self._step_seconds.labels(*labels, step).inc(took.seconds)
            self._step_cpu_seconds.labels(*labels, step).inc(took.cpu_seconds)
        self._stalls.labels(*labels).inc(batch.stalls)
        self._stalled.labels(*labels).set(batch.stalled_partitions)
        self._stall_seconds.labels(*labels).set(batch.stall_seconds)
        self._unstable.labels(*labels).set(batch.unstable_messages)
        if batch.intervals:
            self._hit_ratio.labels(*labels).set(batch.cache_hits / batch.intervals)


class _WatermarkCollector:
    """The watermark gauges, read at scrape time so that their lag is the lag now."""

    def __init__(
        self,
        topology: str,
        clock: Clock,
        source: Callable[[], Mapping[str, WatermarkSnapshot]] | None,
    ) -> None:
        self.topology = topology
        self.clock = clock
        self.source = source

    def describe(self) -> Iterable[Metric]:
        return self._families()

    def collect(self) -> Iterable[Metric]:
        families = self._families()
        if self.source is None:
            return families
        input_watermark, watermark, lag, injector_watermark, injector_lag = families
        now = self.clock.now()
        injectors: dict[tuple[str, str], int] = {}
        for computation, snapshot in sorted(self.source().items()):
            labels = [self.topology, computation]
            input_watermark.add_metric(labels, snapshot.input_watermark / 1e6)
            watermark.add_metric(labels, snapshot.watermark / 1e6)
            lag.add_metric(labels, (now - snapshot.input_watermark) / 1e6)
            for source, value in snapshot.sources.items():
                parsed = parse_injector_source(source)
                if parsed is not None:
                    injectors[parsed] = max(injectors.get(parsed, value), value)
        for (injector, process), value in sorted(injectors.items()):
            labels = [self.topology, injector, process]
            injector_watermark.add_metric(labels, value / 1e6)
            injector_lag.add_metric(labels, (now - value) / 1e6)
        return families

    @staticmethod
    def _families() -> list[GaugeMetricFamily]:
        return [
            GaugeMetricFamily(
                "millstream_input_watermark_timestamp_seconds",
                "The computation's input low watermark as of its latest batch: no input older "
                "than it is expected (0 until every source of its inputs reported).",
                labels=_LABELS,
            ),
            GaugeMetricFamily(
                "millstream_watermark_timestamp_seconds",
                "The computation's own low watermark, which it reports for its output streams.",
                labels=_LABELS,
            ),
            GaugeMetricFamily(
                "millstream_watermark_lag_seconds",
                "Wall time now minus the computation's input low watermark.",
                labels=_LABELS,
            ),
            GaugeMetricFamily(
                "millstream_injector_watermark_timestamp_seconds",
                "An injector process's low watermark as this topology applied it from the "
                "watermark topic (the highest over the computations reading its streams).",
                labels=_INJECTOR_LABELS,
            ),
            GaugeMetricFamily(
                "millstream_injector_watermark_lag_seconds",
                "Wall time now minus millstream_injector_watermark_timestamp_seconds.",
                labels=_INJECTOR_LABELS,
            ),
        ]
