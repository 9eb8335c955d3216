"""The Zeitgeist job: the topology of :mod:`zeitgeist.pipeline` and its log-file injector on
the stack, under one lifecycle, until the logs are processed::

    config = load_config()
    names = Names("today")
    run_job(config, names, Path("/var/log/searches"), origin=0)
    for anomaly in read_anomalies(config, names):
        print(anomaly)

:func:`run_job` is the whole job. Its halves run apart too, as a deployment with its
injector elsewhere would: :func:`inject` (the injector alone, to the end of the logs) and
:func:`process` (the topology alone, until its input is complete; ``python -m
zeitgeist.driver`` runs it, and resumes it after a crash). Where the state lives and how
topics are made is ``config.run`` (``[run]`` in millstream.toml), plus the batch cap the job
needs (:func:`job_settings`). What it tells its operator goes through a
:class:`~zeitgeist.progress.JobProgress`.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from millstream.connectors import MillstreamConfig, RunSettings, provision, read_stream
from millstream.injectors import InjectorStats, LogFileSource, connect_injector
from millstream.spark import ProcessingTime, RunningTopology, run_topology
from zeitgeist.model import ModelParams
from zeitgeist.pipeline import Names, zeitgeist_topology
from zeitgeist.progress import JobProgress
from zeitgeist.replay import parse_search

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "MAX_OFFSETS_PER_TRIGGER",
    "following_anomalies",
    "inject",
    "job_settings",
    "process",
    "read_anomalies",
    "run_job",
]

# A micro-batch may hold one query's searches of many days, and a key's changes are committed
# in one Cassandra batch, which holds at most 65,535 rows: cap what a micro-batch reads.
MAX_OFFSETS_PER_TRIGGER = 60_000
DEFAULT_TIMEOUT = 3600.0


def job_settings(config: MillstreamConfig) -> RunSettings:
    """The run's deployment: ``config.run``, with the job's batch cap unless one is set."""
    if config.run.max_offsets_per_trigger is not None:
        return config.run
    return replace(config.run, max_offsets_per_trigger=MAX_OFFSETS_PER_TRIGGER)


def _log_source(names: Names, logs: Path) -> LogFileSource:
    # follow=False: the replay's logs are complete, so the injector ends with them (and its
    # last report says so: the end of time).
    return LogFileSource(logs, parse_search, names.searches, pattern="*.log", follow=False)


def _injector(names: Names) -> str:
    return f"{names.topology}-logs"


def run_job(
    config: MillstreamConfig,
    names: Names,
    logs: Path,
    *,
    origin: int,
    params: ModelParams | None = None,
    settings: RunSettings | None = None,
    spark: SparkSession | None = None,
    progress: JobProgress | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> RunningTopology:
    """Replay the search logs under ``logs`` through the job: the topology and the log-file
    injector run together until every search is counted and judged. Returns the stopped
    topology (for its metrics)."""
    topology = zeitgeist_topology(names, params, origin=origin)
    with run_topology(
        topology,
        config,
        settings or job_settings(config),
        trigger=ProcessingTime(0.5),
        spark=spark,
        on_batch=progress.on_batch if progress else None,
    ) as running:
        running.add_injector(_injector(names), _log_source(names, logs))
        running.await_input_complete(timeout, progress=progress.watch if progress else None)
    return running


def inject(
    config: MillstreamConfig, names: Names, logs: Path, *, settings: RunSettings | None = None
) -> InjectorStats:
    """The log-file injector alone, over ``logs`` to their end."""
    source = _log_source(names, logs)
    with connect_injector(
        config, _injector(names), source, settings=settings or job_settings(config)
    ) as injector:
        return injector.run(until_exhausted=True)


def process(
    config: MillstreamConfig,
    names: Names,
    *,
    origin: int,
    params: ModelParams | None = None,
    settings: RunSettings | None = None,
    spark: SparkSession | None = None,
    progress: JobProgress | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> RunningTopology:
    """The topology alone, until its input is complete and processed (its injector runs
    elsewhere); returns the stopped topology. Run again after a crash, it resumes."""
    topology = zeitgeist_topology(names, params, origin=origin)
    with run_topology(
        topology,
        config,
        settings or job_settings(config),
        trigger=ProcessingTime(0.5),
        spark=spark,
        on_batch=progress.on_batch if progress else None,
    ) as running:
        running.await_input_complete(timeout, progress=progress.watch if progress else None)
    return running


def read_anomalies(
    config: MillstreamConfig,
    names: Names,
    *,
    follow: bool = False,
    stop: threading.Event | None = None,
) -> Iterator[dict[str, Any]]:
    """The anomalies the run ``names`` found, each once (deduplicated by record ID); with
    ``follow``, then those found from now on, until ``stop`` is set."""
    for record in read_stream(config, names.anomalies, follow=follow, dedup=True, stop=stop):
        anomaly = json.loads(record.value)
        if isinstance(anomaly, dict) and anomaly.get("run") == names.run:
            yield anomaly


@contextmanager
def following_anomalies(
    config: MillstreamConfig, names: Names, progress: JobProgress
) -> Iterator[None]:
    """Passes the run's anomalies to ``progress`` as they are found, while the block runs."""
    provision(config, job_settings(config), streams=[names.anomalies], store=False)
    stop = threading.Event()

    def follow() -> None:
        for anomaly in read_anomalies(config, names, follow=True, stop=stop):
            progress.anomaly(anomaly)

    thread = threading.Thread(target=follow, name="anomalies", daemon=True)
    thread.start()
    try:
        yield
    finally:
        time.sleep(1.0)  # the last anomalies' fetch
        stop.set()
        thread.join(10)
