"""Replaying an input through the job and scoring what it found: the main job's harness.

:func:`run_input` writes an input's series as search logs, runs the job over them
(:func:`zeitgeist.job.run_job`), reads back what it produced (:func:`collect`), scores the
detections against the labelled windows (NAB's window scoring) and plots each query;
:func:`print_reports` prints the table of every input's scores.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from millstream.connectors import MillstreamConfig, read_stream
from zeitgeist.job import following_anomalies, read_anomalies, run_job
from zeitgeist.model import ModelParams
from zeitgeist.pipeline import Names
from zeitgeist.progress import JobProgress
from zeitgeist.series import (
    Detection,
    NabScore,
    Score,
    Series,
    bucket_length,
    format_time,
    judge,
    score,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "Collected",
    "JobInput",
    "Report",
    "collect",
    "describe_slice",
    "print_reports",
    "run_input",
    "run_offline",
    "score_run",
    "score_series",
]


@dataclass(frozen=True)
class JobInput:
    """One input of a run: its series, and the truth to score against.

    ``windows`` are labelled windows per query (any kind); ``truth`` windows per kind
    ("spike", "dip") per query, for generated traffic whose truth knows the kind; ``outages``
    the truth windows ``(query, start, end)`` of outages, which must be found as dips.
    """

    name: str
    series: list[Series]
    truth: dict[str, dict[str, list[tuple[int, int]]]] = field(default_factory=dict)
    outages: list[tuple[str, int, int]] = field(default_factory=list)

    @property
    def bucket(self) -> int:
        """The series' bucket length, µs (5 minutes for NAB's tweets, 30 for nyc_taxi)."""
        return bucket_length(self.series)

    @property
    def origin(self) -> int:
        """Where the series' buckets start, mod their length (NAB's tweets at :x2:53)."""
        return min(s.start for s in self.series) % self.bucket

    def params(self, base: ModelParams | None = None) -> ModelParams:
        """``base`` (the defaults) carried to this input's bucket length."""
        return (base or ModelParams()).for_bucket(self.bucket)


@dataclass
class Collected:
    """What one run put on its streams, deduplicated by record ID."""

    anomalies: list[dict[str, Any]]
    predictions: dict[str, list[dict[str, Any]]]  # per query, by bucket

    @property
    def detections(self) -> list[Detection]:
        return [Detection(a["query"], a["kind"], int(a["bucket"])) for a in self.anomalies]


def collect(config: MillstreamConfig, names: Names) -> Collected:
    """The run's anomalies and predictions, read back from their streams."""
    anomalies = sorted(
        read_anomalies(config, names), key=lambda a: (a["query"], a["bucket"], a["kind"])
    )
    predictions: dict[str, dict[int, dict[str, Any]]] = {}
    for record in read_stream(config, names.predictions, dedup=True):
        value = json.loads(record.value)
        predictions.setdefault(record.key, {})[int(value["bucket"])] = value
    return Collected(
        anomalies,
        {q: [by[b] for b in sorted(by)] for q, by in predictions.items()},
    )


@dataclass
class Report:
    """One input's outcome: scores, counts and speed."""

    name: str
    queries: int
    events: int
    processed: int
    seconds: float
    anomalies: int
    overall: Score
    per_kind: dict[str, Score] = field(default_factory=dict)
    outages_found: int = 0
    outages: int = 0
    plots: list[Path] = field(default_factory=list)
    per_series: dict[str, tuple[Score, NabScore]] = field(default_factory=dict)
    offline: bool = False  # found by the offline reference, not by the job on the stack

    @property
    def nab(self) -> NabScore:
        """NAB's standard score over every series."""
        return sum((nab for _, nab in self.per_series.values()), NabScore(0.0, 0))

    @property
    def rate(self) -> float:
        return self.processed / self.seconds if self.seconds else 0.0


def score_run(job: JobInput, detections: Sequence[Detection]) -> tuple[Score, dict[str, Score]]:
    """NAB window scoring over all queries, and per kind when the truth knows kinds."""
    overall = Score(0, 0, 0, 0)
    for one in job.series:
        overall += score(one.windows, [d.bucket for d in detections if d.query == one.query])
    per_kind: dict[str, Score] = {}
    for kind, windows in job.truth.items():
        total = Score(0, 0, 0, 0)
        for query, query_windows in windows.items():
            total += score(
                query_windows,
                [d.bucket for d in detections if d.query == query and d.kind == kind],
            )
        per_kind[kind] = total
    return overall, per_kind


def score_series(
    job: JobInput, detections: Sequence[Detection]
) -> dict[str, tuple[Score, NabScore]]:
    """Each series' window scoring and NAB standard score (its rows: its buckets)."""
    return {
        one.query: judge(one, (d.bucket for d in detections if d.query == one.query))
        for one in job.series
    }


def run_input(
    config: MillstreamConfig,
    job: JobInput,
    names: Names,
    workdir: Path,
    *,
    params: ModelParams | None = None,
    spark: SparkSession | None = None,
    progress: JobProgress | None = None,
    plot: bool = True,
) -> Report:
    """Replay ``job`` end to end: logs, the job (injector and topology), scoring, plots."""
    from zeitgeist.replay import write_logs

    progress = progress or JobProgress(job.name)
    logs = workdir / "logs"
    files, events = write_logs(job.series, logs, job.bucket)
    progress.logs_written(len(job.series), events, files, logs)
    started = time.monotonic()
    # The progress (a console, live) shows the job while it runs; the anomalies scroll above.
    with progress, following_anomalies(config, names, progress):
        running = run_job(
            config,
            names,
            logs,
            origin=job.origin,
            params=job.params(params),
            spark=spark,
            progress=progress,
        )
    seconds = time.monotonic() - started
    counted = running.metrics().get(names.computation("window_counter"))
    processed = counted.processed if counted is not None else 0
    collected = collect(config, names)
    overall, per_kind = score_run(job, collected.detections)
    outages_found = sum(
        1
        for query, start, end in job.outages
        if any(
            d.query == query and d.kind == "dip" and start <= d.bucket <= end
            for d in collected.detections
        )
    )
    report = Report(
        job.name,
        len(job.series),
        events,
        processed,
        seconds,
        len(collected.anomalies),
        overall,
        per_kind,
        outages_found,
        len(job.outages),
        per_series=score_series(job, collected.detections),
    )
    if plot:
        from zeitgeist.plot import plot_queries

        report.plots = plot_queries(job, collected, workdir / "plots")
    progress.finished()
    return report


def run_offline(job: JobInput, *, params: ModelParams | None = None) -> Report:
    """``job`` through the offline reference (:mod:`zeitgeist.offline`), which finds what the
    streaming job finds, without the stack: for series too big to replay as events (NAB's
    nyc_taxi is 156 million passengers), or a quick look."""
    from zeitgeist.offline import reference_detections

    started = time.monotonic()
    detections = reference_detections(job.series, job.params(params))
    seconds = time.monotonic() - started
    overall, per_kind = score_run(job, detections)
    events = sum(one.events for one in job.series)
    return Report(
        job.name,
        len(job.series),
        events,
        events,
        seconds,
        len(detections),
        overall,
        per_kind,
        per_series=score_series(job, detections),
        offline=True,
    )


def print_reports(reports: Sequence[Report], out: TextIO | None = None) -> None:
    out = out or sys.stdout  # looked up now: a redirection since import counts
    header = (
        f"{'input':<12} {'queries':>7} {'events':>10} {'anomalies':>9} {'windows':>9} "
        f"{'recall':>6} {'precision':>9} {'NAB':>5} {'seconds':>8} {'events/s':>9}"
    )
    print("\n" + header, file=out)
    print("-" * len(header), file=out)
    for report in reports:
        rows: list[tuple[str, Score, NabScore | None]] = [
            (report.name, report.overall, report.nab),
            *((f"  {kind}s", kind_score, None) for kind, kind_score in report.per_kind.items()),
            *((f"  {query}", one, nab) for query, (one, nab) in report.per_series.items()),
        ]
        for label, row, nab in rows:
            first = label == report.name
            normalised = None if nab is None else nab.normalised
            print(
                f"{label:<12} {report.queries if first else '':>7} "
                f"{format(report.processed, ',') if first else '':>10} "
                f"{report.anomalies if first else row.detections:>9} "
                f"{row.found:>4}/{row.windows:<4} {row.recall:>6.2f} {row.precision:>9.2f} "
                f"{'' if normalised is None else format(normalised, '.1f'):>5} "
                f"{format(report.seconds, '.1f') if first else '':>8} "
                f"{format(report.rate, ',.0f') if first and not report.offline else '':>9}",
                file=out,
            )
        if report.outages:
            print(
                f"  outage reported as a dip: {report.outages_found} of {report.outages}",
                file=out,
            )
    print(
        "\nwindows: labelled anomaly windows found / all; precision = found / (found + "
        "detections outside every window); NAB: the Numenta Anomaly Benchmark's standard "
        "score (100: every window caught at its start and no false alarm; 0: nothing "
        "found), normalised over the input's series or over the one series",
        file=out,
    )
    if any(report.offline for report in reports):
        print(
            "found by the offline reference (zeitgeist.offline), in one process without the "
            "stack; the job on the stack finds the same",
            file=out,
        )
    for report in reports:
        for path in report.plots:
            print(f"plot: {path}", file=out)
    out.flush()


def describe_slice(series: Sequence[Series]) -> str:
    start = min(s.start for s in series)
    end = max(s.end for s in series) + bucket_length(series)
    return f"{format_time(start)} to {format_time(end)} UTC"
