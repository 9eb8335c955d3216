"""What the Spark runtime counts: per interval task, per micro-batch, per computation.

The counter names are the fields of :class:`MetricCounts`, and nothing else spells them: the
interval task's result row (:data:`RESULT_SCHEMA`) has one column per counter, the batch sums
the rows (:func:`summarize`), and a computation sums its batches (:func:`totals`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Final

from millstream.engine.protocol import BatchResult, StepTime
from millstream.engine.watermarks import IntervalProgress

__all__ = [
    "COUNTERS",
    "RESULT_COLUMNS",
    "RESULT_SCHEMA",
    "ROUTING",
    "BatchMetrics",
    "ComputationMetrics",
    "MetricCounts",
    "ResultRow",
    "describe",
    "interval_counts",
    "sum_steps",
    "summarize",
    "totals",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class MetricCounts:
    """The counters of batch and computation metrics, summed over intervals and batches.

    ``inputs`` counts Kafka messages (``rejected`` of them undecodable or unkeyable);
    ``processed`` records that ran user code (duplicates apart); ``dead_letters`` includes the
    rejected ones; ``intervals`` interval tasks, of which ``rescans`` had to reload their soft
    state and ``cache_hits`` found their cached worker still valid; ``pending`` productions
    not yet acknowledged; ``resent`` checkpointed productions sent again as a batch began (a
    previous owner's or attempt's), ``unknown_outcomes`` commits whose outcome had to be read
    back, ``expired`` keys whose state expired (``ComputationOptions.state_ttl``).
    Transactional productions: ``transactions`` committed, ``transaction_failures`` aborted
    or unknown (and opens Kafka did not answer), ``fenced_producers`` refused as a zombie's,
    ``marker_resolved`` pending productions found delivered by the marker (not resent),
    ``aborted_commits`` earlier owners' commits found undelivered, ``unsettled_commits``
    commits Kafka answered whose marker did not read as committed after (see
    :class:`~millstream.engine.protocol.BatchResult`).
    """

    inputs: int = 0
    rejected: int = 0
    processed: int = 0
    duplicates: int = 0
    late: int = 0
    dead_letters: int = 0
    committed_keys: int = 0
    fired_timers: int = 0
    acknowledged: int = 0
    pending: int = 0
    intervals: int = 0
    rescans: int = 0
    cache_hits: int = 0
    resent: int = 0
    unknown_outcomes: int = 0
    expired: int = 0
    transactions: int = 0
    transaction_failures: int = 0
    fenced_producers: int = 0
    marker_resolved: int = 0
    aborted_commits: int = 0
    unsettled_commits: int = 0
    sequencer_conflicts: int = 0

    def __add__(self, other: MetricCounts) -> MetricCounts:
        return MetricCounts(
            **{name: getattr(self, name) + getattr(other, name) for name in COUNTERS}
        )

    def counts(self) -> dict[str, int]:
        """The counters alone (a subclass's other fields left out)."""
        return {name: getattr(self, name) for name in COUNTERS}


COUNTERS: Final = tuple(f.name for f in fields(MetricCounts))

RESULT_COLUMNS: Final = (
    ("computation", "string"),
    ("interval", "int"),
    *((name, "long") for name in COUNTERS),
    ("host", "string"),
    ("pid", "int"),
    ("seconds", "double"),
    ("cpu_seconds", "double"),
    ("oldest_work", "long"),
    ("next_event_timer", "long"),
    ("next_wall_timer", "long"),
    ("steps", "map<string,array<double>>"),
)
"""The columns of :data:`RESULT_SCHEMA`, with their types in Spark's names
(:class:`ResultRow`)."""

ROUTING: Final = "routing"
"""The step of a batch's task before its intervals' (:data:`~millstream.engine.protocol.STEPS`):
reading the batch's messages from Kafka and routing them, timed once a task, in the row of
its first interval."""

RESULT_SCHEMA: Final = ", ".join(f"{name} {kind}" for name, kind in RESULT_COLUMNS)
"""One row per interval and batch attempt, from the interval task: the interval's
:class:`MetricCounts` (``intervals`` 1; ``cache_hits`` 1 when this process had a worker for the
interval and its soft state was still valid), the Python worker's host and pid (the interval's
owner in this batch), the wall seconds of the
interval's work and the CPU seconds of the thread that did it (the load rebalancing weighs),
then the interval's :class:`~millstream.engine.watermarks.IntervalProgress` (null: none), and
the time of each step of its batch, ``[seconds, cpu_seconds]`` by name
(:data:`~millstream.engine.protocol.STEPS`, and :data:`ROUTING`)."""


@dataclass(frozen=True, slots=True)
class ResultRow:
    """One row of :data:`RESULT_SCHEMA`, written by the interval task and read by the driver,
    column by column by name (:meth:`columns`, :meth:`of`)."""

    computation: str
    interval: int
    counts: MetricCounts
    host: str
    pid: int
    seconds: float
    cpu_seconds: float
    progress: IntervalProgress
    steps: Mapping[str, StepTime] = field(default_factory=dict)

    @property
    def worker(self) -> str:
        """The Python worker that ran the interval, as ``host:pid``."""
        return f"{self.host}:{self.pid}"

    def columns(self) -> dict[str, Any]:
        """The row's value of each column of :data:`RESULT_SCHEMA`, by name."""
        progress = self.progress
        return {
            "computation": self.computation,
            "interval": self.interval,
            **self.counts.counts(),
            "host": self.host,
            "pid": self.pid,
            "seconds": self.seconds,
            "cpu_seconds": self.cpu_seconds,
            "oldest_work": progress.oldest_work,
            "next_event_timer": progress.next_event_timer,
            "next_wall_timer": progress.next_wall_timer,
            "steps": {name: [t.seconds, t.cpu_seconds] for name, t in self.steps.items()},
        }

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> ResultRow:
        """The row whose :data:`RESULT_SCHEMA` columns ``row`` holds by name (as a task
        yields it, :meth:`columns`, and the driver collects it)."""
        counts = MetricCounts(**{name: int(row[name]) for name in COUNTERS})
        return cls(
            computation=str(row["computation"]),
            interval=int(row["interval"]),
            counts=counts,
            host=str(row["host"]),
            pid=int(row["pid"]),
            seconds=float(row["seconds"]),
            cpu_seconds=float(row["cpu_seconds"]),
            progress=IntervalProgress(
                oldest_work=row["oldest_work"],
                next_event_timer=row["next_event_timer"],
                next_wall_timer=row["next_wall_timer"],
                pending=counts.pending,
            ),
            steps=_steps(row),
        )


def _steps(row: Mapping[str, Any]) -> dict[str, StepTime]:
    """The step times of a :data:`RESULT_SCHEMA` row (none in a row without them)."""
    return {
        str(name): StepTime(float(seconds), float(cpu_seconds))
        for name, (seconds, cpu_seconds) in (row.get("steps") or {}).items()
    }


def interval_counts(inputs: int, rejected: int, result: BatchResult, cached: bool) -> MetricCounts:
    """One interval task's counters, from what its worker returned."""
    return MetricCounts(
        inputs=inputs,
        rejected=rejected,
        processed=result.processed,
        duplicates=result.duplicates,
        late=result.late,
        dead_letters=len(result.dead_letters),
        committed_keys=result.committed_keys,
        fired_timers=len(result.fired_timers),
        acknowledged=result.acknowledged,
        pending=result.pending,
        intervals=1,
        rescans=int(result.rescanned),
        cache_hits=int(cached and not result.rescanned),
        resent=result.resent,
        unknown_outcomes=result.unknown_outcomes,
        expired=result.expired,
        transactions=result.transactions,
        transaction_failures=result.transaction_failures,
        fenced_producers=result.fenced_producers,
        marker_resolved=result.marker_resolved,
        aborted_commits=result.aborted_commits,
        unsettled_commits=result.unsettled_commits,
        sequencer_conflicts=result.sequencer_conflicts,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchMetrics(MetricCounts):
    """What one micro-batch of one computation did, summed over its intervals.

    ``failed_attempts`` describes the attempts that failed before the one these counts come
    from. ``isolated`` counts the poison pills the batch isolated and quarantined, in
    ``isolation_runs`` sub-runs (:mod:`millstream.spark.isolation`; what those committed
    counts as duplicates here). ``input_watermark`` is the input low watermark once the
    batch was consumed (its timers ran under it) and ``watermark`` the computation's own after
    the batch (µs); ``watermark_seconds`` of ``seconds`` went to reading, applying and
    publishing reports. ``steps``: the time of each step of the batch
    (:data:`~millstream.engine.protocol.STEPS`, and :data:`ROUTING`), summed over its
    intervals (and tasks): the seconds they took and the CPU seconds their threads ran.
    ``processed_intervals``: the key intervals that processed a record in the batch (one
    not dropped as a duplicate), in order.

    Transactional computations only (:mod:`millstream.connectors.kafka.stalls`): ``stalls``
    counts the output partitions found stalled after this batch that were not before (a
    producer died in a transaction: ``read_committed`` readers wait); ``stalled_partitions``,
    ``stall_seconds`` (the longest) and ``unstable_messages`` (behind the last stable
    offsets) are levels as of the latest probe.
    """

    computation: str
    batch_id: int
    seconds: float = 0.0
    failed_attempts: tuple[str, ...] = ()
    isolated: int = 0
    isolation_runs: int = 0
    input_watermark: int = 0
    watermark: int = 0
    watermark_seconds: float = 0.0
    stalls: int = 0
    stalled_partitions: int = 0
    stall_seconds: float = 0.0
    unstable_messages: int = 0
    steps: Mapping[str, StepTime] = field(default_factory=dict)
    processed_intervals: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class ComputationMetrics(MetricCounts):
    """Totals of a computation's batches in this run (``pending``: after the latest batch;
    ``failed_attempts``, ``isolated``, ``isolation_runs`` and ``stalls`` as in
    :class:`BatchMetrics`)."""

    computation: str
    batches: int = 0
    failed_attempts: int = 0
    isolated: int = 0
    isolation_runs: int = 0
    stalls: int = 0

    @property
    def cache_hit_rate(self) -> float:
        """The share of interval batches that reused a valid cached worker."""
        return self.cache_hits / self.intervals if self.intervals else 0.0

    def plus(self, batch: BatchMetrics) -> ComputationMetrics:
        """These totals with ``batch`` added (``pending`` becomes the batch's)."""
        summed = (MetricCounts(**self.counts()) + batch).counts()
        summed["pending"] = batch.pending
        return ComputationMetrics(
            computation=self.computation,
            batches=self.batches + 1,
            failed_attempts=self.failed_attempts + len(batch.failed_attempts),
            isolated=self.isolated + batch.isolated,
            isolation_runs=self.isolation_runs + batch.isolation_runs,
            stalls=self.stalls + batch.stalls,
            **summed,
        )


def summarize(
    computation: str,
    batch_id: int,
    rows: Iterable[Mapping[str, Any]],
    started: float,
    failures: Iterable[str] = (),
) -> BatchMetrics:
    """A batch's metrics from its interval rows (:data:`RESULT_SCHEMA`); ``started`` is the
    batch's ``time.monotonic()`` start."""
    sums = dict.fromkeys(COUNTERS, 0)
    steps: list[dict[str, StepTime]] = []
    processed: set[int] = set()
    for row in rows:
        for name in COUNTERS:
            sums[name] += int(row[name])
        steps.append(_steps(row))
        if int(row["processed"]) > 0:
            processed.add(int(row["interval"]))
    return BatchMetrics(
        computation=computation,
        batch_id=batch_id,
        seconds=time.monotonic() - started,
        failed_attempts=tuple(failures),
        steps=sum_steps(steps),
        processed_intervals=tuple(sorted(processed)),
        **sums,
    )


def sum_steps(steps: Iterable[Mapping[str, StepTime]]) -> dict[str, StepTime]:
    """The times of ``steps`` (interval rows', or batches') summed step by step."""
    total: dict[str, StepTime] = {}
    for each in steps:
        for step, took in each.items():
            total[step] = total[step] + took if step in total else took
    return total


def totals(batches: Iterable[BatchMetrics]) -> dict[str, ComputationMetrics]:
    """Per computation, the totals of its batches (``pending`` as of its latest batch)."""
    found: dict[str, ComputationMetrics] = {}
    for batch in batches:
        previous = found.get(batch.computation, ComputationMetrics(computation=batch.computation))
        found[batch.computation] = previous.plus(batch)
    return found


def describe(metrics: BatchMetrics) -> str:
    """One log line for a batch: its non-zero counters and time."""
    parts = ", ".join(f"{name}={value}" for name, value in metrics.counts().items() if value)
    retried = f", after {len(metrics.failed_attempts)} failed attempt(s)"
    isolated = (
        f", {metrics.isolated} poison record(s) isolated in {metrics.isolation_runs} sub-run(s)"
    )
    stalled = (
        f", {metrics.stalled_partitions} output partition(s) stalled by an open transaction "
        f"for up to {metrics.stall_seconds:.0f}s"
    )
    return (
        f"computation {metrics.computation!r} batch {metrics.batch_id}: {parts or 'empty'} "
        f"in {metrics.seconds:.2f}s{retried if metrics.failed_attempts else ''}"
        f"{isolated if metrics.isolation_runs else ''}"
        f"{stalled if metrics.stalled_partitions else ''}"
    )
