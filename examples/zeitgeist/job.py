"""Running Zeitgeist on the stack: replay an input through the log-file injector, process it
on Spark, print anomalies as they come, then score them and plot each query.

The steps are separate functions so a test can kill the driver between them:
:func:`inject` (the injector, to the end of the logs), :func:`process` (the topology, until
its last watermark reached the end of time), :func:`collect` (what the run produced, read
back from Kafka and deduplicated by record ID).
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from millstream.connectors.kafka import create_topics, stream_topic
from millstream.connectors.streams import tail_stream
from millstream.engine.config import MillstreamConfig
from millstream.engine.records import MAX_EVENT_TIME
from millstream.injectors.connect import connect_injector
from millstream.injectors.logfile import LogFileSource
from millstream.injectors.process import InjectorOptions, InjectorProcess, InjectorStats
from millstream.spark.console import Console
from millstream.spark.metrics import BatchMetrics
from millstream.spark.runner import ProcessingTime, RunningTopology, run_topology
from zeitgeist.model import BUCKET_MICROS, ModelParams
from zeitgeist.pipeline import Names, zeitgeist_topology
from zeitgeist.replay import parse_search
from zeitgeist.series import Detection, Score, Series, format_time, score

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "Collected",
    "JobInput",
    "Report",
    "collect",
    "inject",
    "print_reports",
    "process",
    "register_for_spark",
    "run_input",
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
    def origin(self) -> int:
        """Where the series' 5-minute buckets start, mod 5 minutes (NAB's start at :x2:53)."""
        return min(s.start for s in self.series) % BUCKET_MICROS


def register_for_spark() -> None:
    """Ship this package's code to the executors by value (they cannot import it)."""
    from pyspark import cloudpickle

    import zeitgeist

    cloudpickle.register_pickle_by_value(zeitgeist)  # type: ignore[no-untyped-call]


def inject(
    config: MillstreamConfig,
    names: Names,
    logs: Path,
    *,
    keyspace: str = "millstream",
    started: Callable[[InjectorProcess], None] | None = None,
) -> InjectorStats:
    """Run the log-file injector over ``logs`` to its end (a replay ends with the end of time).

    ``started`` gets the process first (to watch its stats or stop it from another thread).
    """
    source = LogFileSource(logs, parse_search, names.searches, pattern="*.log", follow=False)
    with connect_injector(
        config, f"{names.topology}-logs", source, InjectorOptions(), keyspace=keyspace
    ) as injector:
        if started is not None:
            started(injector)
        return injector.run(until_exhausted=True)


def process(
    config: MillstreamConfig,
    names: Names,
    *,
    origin: int,
    params: ModelParams | None = None,
    spark: SparkSession | None = None,
    keyspace: str = "millstream",
    checkpoint_root: Path | None = None,
    timeout: float = 3600.0,
    watch: Callable[[RunningTopology], None] | None = None,
    on_batch: Callable[[BatchMetrics], None] | None = None,
) -> RunningTopology:
    """Run the job's topology until every computation's input watermark is the end of time
    and everything is processed; returns the (stopped) topology for its metrics.

    ``watch`` is called every half second while it runs (to report progress, or raise to
    give up); ``on_batch`` gets every batch's metrics (a :class:`Console`'s, say).
    """
    topology = zeitgeist_topology(names, params, origin=origin)
    running = run_topology(
        topology,
        config,
        trigger=ProcessingTime(0.5),
        spark=spark,
        keyspace=keyspace,
        checkpoint_root=checkpoint_root,
        max_offsets_per_trigger=60_000,  # one key must stay under a Cassandra batch (65,535 rows)
        on_batch=on_batch,
    )
    try:
        deadline = time.monotonic() + timeout
        while True:
            running.raise_failure()
            if watch is not None:
                watch(running)
            if all(running.input_watermark(c) >= MAX_EVENT_TIME for c in topology.computations):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{names.topology} did not finish within {timeout} s")
            time.sleep(0.5)
        running.await_idle(timeout=max(60.0, deadline - time.monotonic()))
    finally:
        running.stop()
    return running


@dataclass
class Collected:
    """What one run put on its streams, deduplicated by record ID."""

    anomalies: list[dict[str, Any]]
    predictions: dict[str, list[dict[str, Any]]]  # per query, by bucket

    @property
    def detections(self) -> list[Detection]:
        return [Detection(a["query"], a["kind"], int(a["bucket"])) for a in self.anomalies]


def _read(config: MillstreamConfig, stream: str) -> list[dict[str, Any]]:
    out = io.StringIO()
    tail_stream(config, stream, out=out, from_beginning=True, dedup=True, value_format="json")
    return [json.loads(line) for line in out.getvalue().splitlines()]


def collect(config: MillstreamConfig, names: Names) -> Collected:
    anomalies = sorted(
        (
            entry["value"]
            for entry in _read(config, names.anomalies)
            if isinstance(entry.get("value"), dict) and entry["value"].get("run") == names.run
        ),
        key=lambda a: (a["query"], a["bucket"], a["kind"]),
    )
    predictions: dict[str, dict[int, dict[str, Any]]] = {}
    for entry in _read(config, names.predictions):
        value = entry["value"]
        predictions.setdefault(entry["key"], {})[int(value["bucket"])] = value
    return Collected(
        anomalies,
        {q: [by[b] for b in sorted(by)] for q, by in predictions.items()},
    )


class AnomalyPrinter:
    """Prints the run's anomalies as they reach the anomalies stream (a follower thread)."""

    def __init__(self, config: MillstreamConfig, names: Names, out: TextIO) -> None:
        self.names = names
        self.out = out
        self.stop = threading.Event()
        self.printed = 0
        self._pending = ""
        self.thread = threading.Thread(
            target=tail_stream,
            args=(config, names.anomalies),
            kwargs={
                "out": self,
                "follow": True,
                "dedup": True,
                "value_format": "json",
                "stop": self.stop,
            },
            daemon=True,
        )

    def write(self, text: str) -> int:
        self._pending += text
        while "\n" in self._pending:
            line, self._pending = self._pending.split("\n", 1)
            value = json.loads(line).get("value")
            if isinstance(value, dict) and value.get("run") == self.names.run:
                self.printed += 1
                print(
                    f"  anomaly: {value['query']:<10} {value['kind']:<5} "
                    f"{value['bucket_time']} UTC  observed {value['observed']:>6}  "
                    f"expected {value['expected']:>8.1f}  score {value['score']:>7.1f}",
                    file=self.out,
                    flush=True,
                )
        return len(text)

    def flush(self) -> None:
        pass

    def __enter__(self) -> AnomalyPrinter:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        time.sleep(1.0)  # the last anomalies' fetch
        self.stop.set()
        self.thread.join(10)


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


def run_input(
    config: MillstreamConfig,
    job: JobInput,
    names: Names,
    workdir: Path,
    *,
    params: ModelParams | None = None,
    spark: SparkSession | None = None,
    out: TextIO = sys.stdout,
    plot: bool = True,
    console: Console | None = None,
) -> Report:
    """Replay ``job`` end to end: logs, injector, topology, scoring, plots. A ``console``
    shows the injection's and the computations' progress meanwhile, and ``out`` is then
    its own."""
    from zeitgeist.replay import write_logs

    if console is not None:
        out = console.out
    logs = workdir / "logs"
    files, events = write_logs(job.series, logs)
    print(
        f"[{job.name}] {len(job.series)} queries, {events:,} search events in {files} log "
        f"files under {logs}",
        file=out,
        flush=True,
    )
    started = time.monotonic()
    injectors: list[InjectorProcess] = []
    failure: list[BaseException] = []
    last_status = [started]

    def run_injector() -> None:
        try:
            inject(config, names, logs, started=injectors.append)
        except BaseException as exc:  # raised again by the driver's thread
            failure.append(exc)

    def watch(running: RunningTopology) -> None:
        if failure:
            raise RuntimeError(f"the log-file injector failed: {failure[0]!r}") from failure[0]
        if console is not None:
            console.track_topology(running.topology)
        elif time.monotonic() - last_status[0] >= 15:
            last_status[0] = time.monotonic()
            emitted = injectors[0].stats.emitted if injectors else 0
            marks = [running.input_watermark(c) for c in running.topology.computations]
            low = min(marks)
            shown = "end of input" if low >= MAX_EVENT_TIME else format_time(low) + " UTC"
            print(
                f"[{job.name}] {time.monotonic() - started:6.0f} s: injected {emitted:,} of "
                f"{events:,}; every computation's input complete up to {shown}",
                file=out,
                flush=True,
            )

    if console is not None:
        console.track_injection(
            "injected", lambda: sum(one.stats.emitted for one in injectors), events, "searches"
        )
    create_topics(config, [stream_topic(names.anomalies)], partitions=2)
    with console or contextlib.nullcontext(), AnomalyPrinter(config, names, out) as printer:
        injector = threading.Thread(target=run_injector, name="injector", daemon=True)
        injector.start()
        try:
            running = process(
                config,
                names,
                origin=job.origin,
                params=params,
                spark=spark,
                watch=watch,
                on_batch=console.on_batch if console is not None else None,
            )
        finally:
            for one in injectors:
                one.stop()
            injector.join(60)
    if failure:
        raise failure[0]
    seconds = time.monotonic() - started
    counter = names.computation("window_counter")
    counted = running.metrics().get(counter)
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
    )
    if plot:
        from zeitgeist.plot import plot_queries

        report.plots = plot_queries(job, collected, workdir / "plots")
    print(f"[{job.name}] {printer.printed} anomalies printed as found", file=out, flush=True)
    return report


def print_reports(reports: Sequence[Report], out: TextIO = sys.stdout) -> None:
    header = (
        f"{'input':<12} {'queries':>7} {'events':>10} {'anomalies':>9} {'windows':>9} "
        f"{'recall':>6} {'precision':>9} {'seconds':>8} {'events/s':>9}"
    )
    print("\n" + header, file=out)
    print("-" * len(header), file=out)
    for report in reports:
        rows = [(report.name, report.overall)] + [
            (f"  {kind}s", kind_score) for kind, kind_score in report.per_kind.items()
        ]
        for label, row in rows:
            first = label == report.name
            print(
                f"{label:<12} {report.queries if first else '':>7} "
                f"{format(report.processed, ',') if first else '':>10} "
                f"{report.anomalies if first else row.detections:>9} "
                f"{row.found:>4}/{row.windows:<4} {row.recall:>6.2f} {row.precision:>9.2f} "
                f"{format(report.seconds, '.1f') if first else '':>8} "
                f"{format(report.rate, ',.0f') if first else '':>9}",
                file=out,
            )
        if report.outages:
            print(
                f"  outage reported as a dip: {report.outages_found} of {report.outages}",
                file=out,
            )
    print(
        "\nwindows: labelled anomaly windows found / all; precision = found / (found + "
        "detections outside every window)",
        file=out,
    )
    for report in reports:
        for path in report.plots:
            print(f"plot: {path}", file=out)
    out.flush()


def describe_slice(series: Sequence[Series]) -> str:
    start = min(s.start for s in series)
    end = max(s.end for s in series) + BUCKET_MICROS
    return f"{format_time(start)} to {format_time(end)} UTC"
