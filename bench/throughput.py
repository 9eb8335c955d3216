"""Throughput of a keyed count on millstream and its peers, on one workload; latency; large state.

**Workload.** A backlog of ``--records`` (20,000) millstream records (Avro single-object
envelopes, about 41 bytes: key ``k<n mod --keys>`` over 10,000 keys, empty value, the
injection time as event time) is injected into a fresh 2-partition topic by an injector
(``bench.harness.inject_events``: acknowledged, checkpointed in the run's keyspace, and
reported on the run's watermark topic, which only millstream reads); then each system starts
and drains it as fast as it can. For every input record it writes one output record,
carrying the key's new count, to a fresh 2-partition output topic. Peers read the same bytes,
take the key from the Kafka message key, and write plain values of the size of millstream's
outputs (42 bytes: the count, zero-padded); the stateless floors forward each input as it
is (41 bytes).

| row | what (txns: Kafka transactions per interval commit) | guarantee |
|---|---|---|
| ``kafka-loop`` | confluent-kafka consume→produce loop, no state | none |
| ``spark-floor`` | Spark Kafka → ``foreachBatch`` → Kafka, no state | at-least-once |
| ``spark-floor-3-stages`` | the floor's query, chained three times | at-least-once |
| ``spark-floor-3-in-one`` | those stages in one query (a batch forwards each) | at-least-once |
| ``quix`` | Quix Streams 3, ``processing_guarantee="exactly-once"``, RocksDB | exactly-once |
| ``bytewax`` | Bytewax 0.21, one worker, state in SQLite recovery partitions | at-least-once |
| ``pathway`` | Pathway 0.33, two threads, input persisted to the filesystem | at-least-once |
| ``spark-tws`` | ``transformWithStateInPandas``, RocksDB state store, Kafka sink | at-least-once |
| ``millstream-strong`` | strong productions, exactly-once, default intervals, txns | exactly-once |
| ``millstream-notx`` | the same, ``transactional_productions=False`` | eo-millstream |
| ``millstream-watched`` | ``millstream-strong``, three pages of its live view open | exactly-once |
| ``millstream-viewed`` | the same, key intervals open, one page tailing a stream | exactly-once |
| ``millstream-3-stages`` | ``millstream-strong``'s count, chained three times | exactly-once |
| ``millstream-3-in-one`` | those three in one query (``RunSettings.one_query``) | exactly-once |
| ``millstream-weak`` | weak productions, ``exactly_once=False`` | none |

(``eo-millstream``: exactly-once for millstream's deduplicating readers, at-least-once for
plain ones. The millstream rows run ``ComputationOptions``' default key intervals, one per
core of the Spark job, unless ``--key-intervals`` says otherwise.)

**records/s** = records / (end - start). *Start* is when the system began reading the
backlog: for the Spark rows (millstream included) the trigger time of the first micro-batch that
read rows (Spark's progress report), for the two consumer processes the moment their first
poll returned input. What comes before (JVM query start, consumer-group join, topic
creation) is shown as *startup s*, not counted. *End* is when the last output record
was in the output topic: the wall-clock time at which a separate ``read_committed`` consumer
of the output topic had seen all of them (so Quix's records count once its transaction
committed). Spark triggers every 0.2 s; Quix keeps its default 5 s commit interval but commits
at once when it stops after the last record. The *check* column says whether the outputs are
right: for the counting rows, each key's counts 1..n exactly once (duplicates and gaps are
listed); for the floors, one output per input. For the Spark rows (millstream included) the
notes give each Spark Python worker's CPU seconds while draining, and its share of that time
(from /proc, so Linux only): how busy each core's worker was; for the peer processes (the
loop, Quix, Bytewax, Pathway), their CPU over their whole life, start-up included. For
every Spark row they also give Spark's own steps of the batches triggered during the drain
(``durationMs`` summed: the offsets' request, planning, the batch, the logs) and when the
last output was seen against the last batch's end: what of the drain no batch covers.

**Latency** (``--rates``, ``--latency-seconds`` at each): after its backlog, the
``spark-floor``, ``spark-floor-3-stages``, ``millstream-strong``, ``millstream-notx``,
``millstream-watched``, ``millstream-viewed``, ``millstream-3-stages`` and
``millstream-3-in-one`` instances get paced
input at each rate from the same injector (which reports its watermark after each poll);
latency = the moment a ``read_committed`` reader of the output topic received the output
minus the event's injection time (its event time, which both copy to their output): a
transactional producer's records are visible only once its transaction commits, so their
append time would flatter it. Same trigger (0.2 s) for all. *A further stage*: the
three-stage chain's p50 and p95 less ``millstream-strong``'s (the same count, one stage), over
two, against the floor's p50 (one batch of the floor, injection to output): issue 24 allows a
stage at most that. *A further floor stage*: the same of ``spark-floor-3-stages`` against
``spark-floor``, what a stage costs Spark itself when each is a query of its own, as
millstream's are; *a further fused stage*: the same of ``spark-floor-3-in-one``, the three
stages in one query (a record waits a batch a stage); *a further stage in one query*: the
same of ``millstream-3-in-one`` against ``millstream-strong``. For a pipeline's rows the notes give
each computation's batches and where a batch's time went.

**The live view's cost** (``millstream-watched``, ``millstream-viewed``): ``millstream-strong``
again, with the view of its topology served as ``millstream run --ui-port`` serves it beside a
driver (a child process of the benchmark's, which runs the driver) and three pages open on it
from a process of their own (``bench/view_pages.py``, as browsers elsewhere would be) before
the topology starts. Each page reads every snapshot of the event stream, as a page does once
opened (``millstream-watched``); in ``millstream-viewed`` each also has the computation's key
intervals open (read every 5 s), and the third tails the output stream every 2 s. Their
throughput and latency are printed against ``millstream-strong``'s, medians and run by run,
with 90 % intervals (the issue's bound: within 2 %). ``--runs N`` goes round the rows N
times, so that they alternate, every other round backwards (no row always runs first, or
always right after the same one); ``--warmup 1`` first runs the first row once, uncounted.

**Large state**: one millstream computation with ``key_intervals=1`` whose interval already
holds the state of ``--large-keys`` keys (preloaded through ``CassandraIntervalStore.commit``),
and one whose interval holds 1,000 keys. Per run, a fresh topology over the two computations
gives each a 100-record warm-up batch on new keys (Python workers, connections, interval
caches), then one batch of 1,000 records on 1,000 distinct preloaded keys (in the large
interval, keys no earlier run read); the batch time is ``BatchMetrics.seconds``. Both run with
the ``AvailableNow`` trigger, so each batch is exactly what was injected. Each measured batch's
rescans and cache hits are printed: one that found its interval cache invalid (0 cache hits,
1 rescan) paid for a rescan, which the ratio then includes.

Spark rows share one session, warmed up by a throwaway floor query and a throwaway millstream
run before the first of them, so none pays for the JVM's, Cassandra's or the Python workers'
cold start.

Install the peers' extras and run (Kafka and Cassandra up: ``millstream up``)::

    .venv/bin/python -m pip install -e '.[test,bench]'
    .venv/bin/python bench/throughput.py [--records 20000] [--runs 1] [--only quix,spark-tws]
        [--rates 200,2000] [--latency-seconds 5] [--large-keys 1000000]
        [--json out.json] [--plot out.png] [--profile DIR [--profile-idle]]

``--profile DIR`` records the driver and every Spark Python worker of each Spark and millstream
row with py-spy (``bench/profiling.py``; the ``bench`` extra installs it) while the row drains,
keeps the collapsed stacks in ``DIR`` and prints each role's top functions with the row;
``--profile-idle`` samples waiting threads too, so that the shares are of wall time and show what
the workers wait on. py-spy's own processes share the cores: a profiled row drains at about half
its speed on 2 cores, so its records/s is marked and not comparable; the shares are the point.

Quix Streams, Bytewax and Pathway run in virtualenvs of their own (see
``bench/kafka_peers.py`` for why), created on first use under ``~/.millstream/bench/`` as
``quix-venv``, ``bytewax-venv`` and ``pathway-venv`` with pip (or pass ``--quix-python``);
Pathway's takes about a minute and 1.6 GB (it brings pandas, scipy, scikit-learn and more).
Runtime with the defaults on 2 cores: about 3.5 minutes (half a minute of it preloading the
large state), plus a minute the first time for Quix's virtualenv.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import itertools
import json
import os
import random
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import venv
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol

if __package__ in (None, ""):  # run as a script: make `bench.harness` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import (
    Injection,
    OutputWatcher,
    core_note,
    core_use,
    cpu_note,
    cpu_seconds,
    create_topic_pair,
    delete_topics_containing,
    drop_keyspace,
    first_data_batch_start,
    floor_query,
    inject_events,
    percentile,
    process_cpu,
    python_worker_cpu,
    settle_compactions,
    stack_services,
    unique_suffix,
)
from bench.kafka_peers import (
    BYTEWAX_REQUIREMENT,
    PATHWAY_REQUIREMENT,
    QUIX_REQUIREMENT,
    spend_cpu,
)
from bench.profiling import Profiler
from millstream.connectors import cassandra as cassandra_connector
from millstream.connectors import kafka as kafka_connector
from millstream.engine.clock import SystemClock
from millstream.engine.codecs import IntCodec
from millstream.engine.computation import Computation
from millstream.engine.config import MillstreamConfig, load_config
from millstream.engine.context import Context
from millstream.engine.protocol import STEPS
from millstream.engine.records import (
    Record,
    decode_record,
    encode_record,
    injector_record_id,
    production_record_id,
)
from millstream.engine.state import KeyChanges
from millstream.engine.stores.cassandra import CassandraIntervalStore, create_schema
from millstream.engine.topology import ComputationOptions, Topology
from millstream.spark.metrics import ROUTING, BatchMetrics, sum_steps
from millstream.spark.runner import (
    AvailableNow,
    ProcessingTime,
    RunningTopology,
    run_topology,
)
from millstream.spark.session import kafka_options, kafka_stream, spark_session
from millstream.ui import start_view

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

TRIGGER_SECONDS = 0.2
PARTITIONS = 2
PEERS_SCRIPT = Path(__file__).resolve().parent / "kafka_peers.py"
ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
PROVIDER_CONF = "spark.sql.streaming.stateStore.providerClass"
SMALL_KEYS = 1_000
LARGE_BATCH = 1_000
WARM_UP = 100
PRELOAD_CHUNK = 50_000
PRELOAD_BATCH_BYTES = 1024 * 1024
VIEW_PAGES = 3
VIEWED = ("millstream-watched", "millstream-viewed")  # the rows with the view's pages open
STAGES = 3
STAGED = f"millstream-{STAGES}-stages"  # millstream-strong's count, chained STAGES times over
FLOOR_STAGED = f"spark-floor-{STAGES}-stages"  # the floor, chained as STAGED is
FLOOR_FUSED = f"spark-floor-{STAGES}-in-one"  # FLOOR_STAGED's stages in one query
STAGED_FUSED = f"millstream-{STAGES}-in-one"  # STAGED's computations in one query
FURTHER_STAGE = {  # a pipeline's row: (its one-stage row, the name of what a stage adds)
    FLOOR_STAGED: ("spark-floor", "a-further-floor-stage"),
    FLOOR_FUSED: ("spark-floor", "a-further-fused-stage"),
    STAGED: ("millstream-strong", "a-further-stage"),
    STAGED_FUSED: ("millstream-strong", "a-further-stage-in-one"),
}
VIEW_PAGES_SCRIPT = Path(__file__).resolve().parent / "view_pages.py"


@dataclass(frozen=True)
class System:
    name: str
    short: str
    what: str
    guarantee: str
    latency: bool = False  # measured in the latency phase too

    @property
    def on_spark(self) -> bool:
        """Whether the row runs on the benchmark's Spark session (millstream's rows too)."""
        return self.name.startswith(("spark", "millstream"))


SYSTEMS = (
    System("kafka-loop", "loop", "confluent-kafka consume→produce loop, no state", "none"),
    System(
        "spark-floor",
        "floor",
        "Spark Kafka → foreachBatch → Kafka, no state",
        "at-least-once",
        latency=True,
    ),
    System("quix", "quix", "Quix Streams 3, RocksDB count", "exactly-once"),
    System("bytewax", "bytewax", "Bytewax 0.21, one worker, SQLite recovery", "at-least-once"),
    System(
        "pathway", "pathway", "Pathway 0.33, two threads, filesystem persistence", "at-least-once"
    ),
    System(
        "spark-tws",
        "tws",
        "Spark transformWithStateInPandas, RocksDB, Kafka sink",
        "at-least-once",
    ),
    System(
        "millstream-strong",
        "ms-strong",
        "millstream, strong productions + exactly-once, the default key intervals",
        "exactly-once",
        latency=True,
    ),
    System(
        "millstream-notx",
        "ms-notx",
        "millstream-strong without transactional productions",
        "eo-millstream",
        latency=True,
    ),
    System(
        "millstream-watched",
        "ms-watched",
        f"millstream-strong with the live view serving {VIEW_PAGES} pages as they open",
        "exactly-once",
        latency=True,
    ),
    System(
        "millstream-viewed",
        "ms-viewed",
        f"millstream-strong with the live view serving {VIEW_PAGES} open pages",
        "exactly-once",
        latency=True,
    ),
    System(
        FLOOR_STAGED,
        "floor-stages",
        f"the floor {STAGES} times over, each query's output the next's input",
        "at-least-once",
        latency=True,
    ),
    System(
        FLOOR_FUSED,
        "floor-in-one",
        f"the floor's {STAGES} stages in one query: a batch forwards each stage's input",
        "at-least-once",
        latency=True,
    ),
    System(
        STAGED,
        "ms-stages",
        f"millstream-strong's count {STAGES} times over, each count's output the next's input",
        "exactly-once",
        latency=True,
    ),
    System(
        STAGED_FUSED,
        "ms-in-one",
        f"those {STAGES} counts in one query (RunSettings.one_query)",
        "exactly-once",
        latency=True,
    ),
    System(
        "millstream-weak",
        "ms-weak",
        "millstream, weak productions, exactly_once=False",
        "none",
    ),
)
LARGE_STATE = "large-state"
BY_NAME = {system.name: system for system in SYSTEMS}


# -- what runs on Spark executors (shipped by value: keep it self-contained) -----------------


class Count(Computation):
    """Counts records per key; for each, produces the key's new count. ``work_us``: CPU µs
    spent per record besides (a costly computation, as a model's would be)."""

    def __init__(self, output: str, work_us: float = 0.0) -> None:
        self.output = output
        self.work_us = work_us

    def process_record(self, ctx: Context, record: Record) -> None:
        spend_cpu(self.work_us)
        state = ctx.state(IntCodec())
        count = state.get(0) + 1
        state.set(count)
        ctx.produce(self.output, str(count).encode(), record.timestamp)


# -- running one system ----------------------------------------------------------------------


class Handle(Protocol):
    """A system draining the backlog."""

    def check(self) -> None:
        """Raise if the system failed."""

    def first_data_at(self) -> float | None:
        """When (wall clock, s) it began reading input."""

    def spark_query(self) -> StreamingQuery | None:
        """The Spark query it runs, if it runs on Spark."""

    def stop(self) -> None: ...


@dataclass
class Bench:
    config: MillstreamConfig
    args: argparse.Namespace
    root: Path
    output_bytes: int
    _spark: SparkSession | None = None
    _services: dict[str, int] | None = None

    @property
    def services(self) -> dict[str, int]:
        """The pids of the local stack's nodes this benchmark runs against (none if the
        services run elsewhere), for the cores each row's note accounts for."""
        if self._services is None:
            self._services = stack_services(self.config)
        return self._services

    def spark(self) -> SparkSession:
        """The one Spark session of the benchmark, warmed up (see :func:`warm_up`)."""
        if self._spark is None:
            self._spark = spark_session(self.config, app_name="millstream-bench-throughput")
            print("  warming up Spark, Cassandra and the Python workers", flush=True)
            warm_up(self)
        return self._spark

    def close(self) -> None:
        if self._spark is not None:
            self._spark.stop()
            self._spark = None


@dataclass
class RunResult:
    system: str
    records_per_s: float | None = None
    startup_s: float | None = None
    check: str = ""
    error: str | None = None
    latency: dict[float, list[float]] = field(default_factory=dict)  # rate → ms samples
    notes: list[str] = field(default_factory=list)
    # CPU seconds of everything the row ran on while it drained the backlog (start-up
    # included): the services, this process, Spark's JVM and Python workers, a peer.
    cpu_s: float | None = None


@dataclass
class Topics:
    suffix: str
    source: str
    sink: str


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class ProcessHandle:
    """A peer process of bench/kafka_peers.py; it exits once it handled the backlog."""

    def __init__(self, peer: str, command: list[str], logs: Path) -> None:
        self.peer = peer
        self.stdout = (logs.with_suffix(".out")).open("w+")
        self.stderr = (logs.with_suffix(".err")).open("w+")
        # The peer is this process's only child reaped meanwhile (Spark's JVM lives on), so
        # the children's CPU before and after it is its own.
        self._children_cpu = _children_cpu()
        self._started = time.monotonic()
        self.process = subprocess.Popen(command, stdout=self.stdout, stderr=self.stderr)
        self._result: dict[str, Any] | None = None
        self._life: tuple[float, float] | None = None  # CPU and wall seconds, once exited

    def check(self) -> None:
        code = self.process.poll()
        if code is not None and code != 0:
            raise RuntimeError(f"{self._name()} exited with {code}: {self._tail(self.stderr)}")

    def spark_query(self) -> StreamingQuery | None:
        return None  # a process of its own, not on Spark

    def first_data_at(self) -> float | None:
        if self._result is None:
            try:
                self.process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                raise RuntimeError(f"{self._name()} did not exit after its backlog") from None
            wall = time.monotonic() - self._started
            self._life = (_children_cpu() - self._children_cpu, wall)
            self.check()
            self.stdout.seek(0)
            lines = [line for line in self.stdout.read().splitlines() if line.startswith("{")]
            if not lines:
                raise RuntimeError(f"{self._name()} printed no result: {self._tail(self.stderr)}")
            self._result = json.loads(lines[-1])
        first = self._result.get("first_record_at")
        return None if first is None else float(first)

    def cpu_seconds(self) -> float:
        """The peer's CPU seconds over its whole life, once it exited (0 before)."""
        return 0.0 if self._life is None else self._life[0]

    def cpu_note(self) -> str:
        """The peer's CPU over its whole life (start-up included): its share of one core."""
        if self._life is None:
            return "peer's CPU: not measured (still running)"
        cpu, wall = self._life
        return f"peer process CPU: {cpu:.1f} s over its {wall:.1f} s ({cpu / wall:.0%})"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()  # by its own PID
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=15)
        self.stdout.close()
        self.stderr.close()

    def _name(self) -> str:
        return f"the {self.peer} peer (process {self.process.pid})"

    @staticmethod
    def _tail(stream: Any) -> str:
        stream.seek(0)
        return " | ".join(stream.read().strip().splitlines()[-5:])


class QueryHandle:
    """A plain Spark streaming query."""

    def __init__(
        self,
        query: StreamingQuery,
        on_stop: Callable[[], None] | None = None,
        also: Sequence[StreamingQuery] = (),
    ) -> None:
        self.query = query  # the one that reads the input
        self.on_stop = on_stop
        self.chain = [query, *also]  # and a pipeline's further queries, in order

    def check(self) -> None:
        for query in self.chain:
            if not query.isActive:
                failure = query.exception()
                if failure is not None:
                    raise failure
                raise RuntimeError("the Spark query stopped")

    def first_data_at(self) -> float | None:
        return await_first_batch(lambda: self.query, self.check)

    def spark_query(self) -> StreamingQuery | None:
        return self.query

    def stop(self) -> None:
        try:
            for query in self.chain:
                stop_query(query)
        finally:
            if self.on_stop is not None:
                self.on_stop()


def stop_query(query: StreamingQuery, patience: float = 10.0) -> None:
    """Stop a query between batches if it gets there within ``patience`` s: interrupting a
    ``foreachBatch`` call in flight makes Spark log a StackOverflowError (harmless, but loud)."""
    deadline = time.monotonic() + patience
    while query.isActive and query.status["isTriggerActive"] and time.monotonic() < deadline:
        time.sleep(0.05)
    query.stop()


class MillstreamHandle:
    def __init__(self, running: RunningTopology, computation: str, topic: str) -> None:
        self.running = running
        self.computation = computation
        self.topic = topic

    def check(self) -> None:
        self.running.raise_failure()

    def first_data_at(self) -> float | None:
        return await_first_batch(
            lambda: self.running.queries.get(self.computation), self.check, self.topic
        )

    def spark_query(self) -> StreamingQuery | None:
        return self.running.queries.get(self.computation)

    def stop(self) -> None:
        self.running.stop()


class Viewers:
    """The live view of one run's topology, served as ``millstream run --ui-port`` serves it
    beside a driver (``start_view``: a child process), and ``VIEW_PAGES`` pages open on it in
    a process of their own (bench/view_pages.py), as browsers would be."""

    def __init__(self, run: BacklogRun, computation: str, *, panels: bool) -> None:
        with socket.socket() as probe:  # a free port of this machine's
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        self.started = time.monotonic()
        self.view = start_view(
            run.config,
            port=port,
            topologies=[f"tp_{run.topics.suffix}"],
            keyspace=run.keyspace,
        )
        self.pages: subprocess.Popen[str] | None = None
        try:
            self.pages = subprocess.Popen(
                [
                    sys.executable,
                    str(VIEW_PAGES_SCRIPT),
                    self.view.address,
                    "--pages",
                    str(VIEW_PAGES),
                    "--computation",
                    computation,
                    "--tail",
                    run.topics.sink,
                    *(() if panels else ("--no-panels",)),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            assert self.pages.stdout is not None
            opened = json.loads(self.pages.stdout.readline() or "{}")
            if "connected" not in opened:
                raise RuntimeError(f"the view's pages did not open: {opened}")
        except BaseException:
            self.stop()
            raise

    def pause(self) -> None:
        """Freeze the view and its pages (SIGSTOP): no reading, serving or asking until
        :meth:`resume`, as if there were no view, but nothing they hold is closed, so
        resuming costs no start-up (bench/view_cost.py's slices)."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        """Let a paused view and its pages go on (SIGCONT; harmless on running ones)."""
        self._signal(signal.SIGCONT)

    def _signal(self, which: signal.Signals) -> None:
        for pid in (self.view.pid, *(() if self.pages is None else (self.pages.pid,))):
            os.kill(pid, which)  # by its own PID: a child of this process

    def stop(self) -> str:
        """Close the pages and stop the view; what the pages did, as a note. Raises if a
        page's request failed: the row then measured a broken view."""
        self.resume()  # a stopped process would not read its closed standard input
        summary: dict[str, Any] = {}
        cpu = ""
        view_seconds = process_cpu(self.view.pid)
        view_cpu = "an unknown CPU time" if view_seconds is None else f"{view_seconds:.1f} s of CPU"
        if self.pages is not None:
            seconds = process_cpu(self.pages.pid)
            cpu = "an unknown CPU time" if seconds is None else f"{seconds:.1f} s of CPU"
            try:
                out, _ = self.pages.communicate(timeout=30)  # closes their stdin: they stop
            except subprocess.TimeoutExpired:
                self.pages.kill()  # by its own PID
                out, _ = self.pages.communicate(timeout=15)
            lines = [line for line in out.splitlines() if line.startswith("{")]
            summary = json.loads(lines[-1]) if lines else {}
            self.pages = None
        self.view.stop()
        pages = summary.get("pages", [])
        if len(pages) != VIEW_PAGES or any(p["failed"] or not p["snapshots"] for p in pages):
            raise RuntimeError(f"the view's pages did not all work: {summary}")
        total = {k: sum(p[k] for p in pages) for k in ("snapshots", "answered", "refused")}
        return (
            f"{VIEW_PAGES} pages received {total['snapshots']} snapshots, "
            f"{total['answered']} reads answered, {total['refused']} refused (429); "
            f"their process used {cpu}, the view's {view_cpu} over "
            f"{time.monotonic() - self.started:.0f} s"
        )


def await_first_batch(
    query: Callable[[], StreamingQuery | None],
    check: Callable[[], None],
    topic: str | None = None,
    timeout: float = 120,
) -> float | None:
    """The start of the query's first batch that read rows, once its progress is reported
    (after the batch: the outputs of a batch show before its progress does)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        current = query()
        start = None if current is None else first_data_batch_start(current, topic)
        if start is not None:
            return start
        check()
        time.sleep(0.1)
    return None


PEER_REQUIREMENTS = {
    "quix": QUIX_REQUIREMENT,
    "bytewax": BYTEWAX_REQUIREMENT,
    "pathway": PATHWAY_REQUIREMENT,
}


def peer_python(bench: Bench, peer: str) -> Path:
    """The interpreter a peer runs with: its own virtualenv, created on first use, for the
    frameworks (each pins its own confluent-kafka), else this one."""
    requirement = PEER_REQUIREMENTS.get(peer)
    if requirement is None:
        return Path(sys.executable)
    if peer == "quix" and bench.args.quix_python:
        return Path(bench.args.quix_python)
    home = bench.config.home / "bench" / f"{peer}-venv"
    python = home / "bin" / "python"
    stamp = home / ".requirement"
    if python.exists() and stamp.exists() and stamp.read_text() == requirement:
        return python
    print(f"  creating {home} with {requirement} (once; takes about a minute)", flush=True)
    venv.EnvBuilder(with_pip=True, clear=True).create(home)
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", requirement],
        check=True,
    )
    stamp.write_text(requirement)
    return python


def start_peer(
    bench: Bench, topics: Topics, peer: str, python: Path, work_us: float = 0.0
) -> Handle:
    command = [
        str(python),
        str(PEERS_SCRIPT),
        peer,
        "--bootstrap",
        bench.config.kafka_bootstrap,
        "--source",
        topics.source,
        "--sink",
        topics.sink,
        "--records",
        str(bench.args.records),
        "--group",
        f"bench_{peer}_{topics.suffix}",
        "--state-dir",
        str(bench.root / f"{peer}-state-{topics.suffix}"),
        "--pad",
        str(bench.output_bytes),
        "--work-us",
        str(work_us),
    ]
    return ProcessHandle(peer, command, bench.root / f"{peer}-{topics.suffix}")


def start_floor(bench: Bench, topics: Topics, stages: int = 1, *, fused: bool = False) -> Handle:
    """The floor's query; with ``stages`` > 1, that many, each forwarding the one before's
    output (FLOOR_STAGED) through topics between them, as ``start_millstream`` chains its
    counts; ``fused``: those stages in one query (FLOOR_FUSED)."""
    between = [f"tp_floorstage{n}_{topics.suffix}" for n in range(1, stages)]
    if between:
        kafka_connector.create_topics(bench.config, between, partitions=PARTITIONS)
    streams = [topics.source, *between, topics.sink]
    if fused:
        return QueryHandle(
            floor_query(
                bench.spark(),
                bench.config,
                topics.source,
                streams[1],
                str(bench.root / f"floor-{topics.suffix}"),
                TRIGGER_SECONDS,
                further=streams[2:],
            )
        )
    queries = [
        floor_query(
            bench.spark(),
            bench.config,
            source,
            sink,
            str(bench.root / f"floor-{topics.suffix}-{stage}"),
            TRIGGER_SECONDS,
        )
        for stage, (source, sink) in enumerate(itertools.pairwise(streams))
    ]
    return QueryHandle(queries[0], also=queries[1:])


def start_tws(bench: Bench, topics: Topics, work_us: float = 0.0) -> Handle:
    from pyspark.sql import functions as F  # noqa: N812  (pyspark's convention)
    from pyspark.sql.streaming.stateful_processor import (
        StatefulProcessor,
        StatefulProcessorHandle,
        TimerValues,
    )

    pad = bench.output_bytes

    class CountProcessor(StatefulProcessor):
        """Per key a count in a ValueState; one output row per input row, with the key's new
        count (zero-padded to millstream's output size)."""

        def init(self, handle: StatefulProcessorHandle) -> None:
            self.count = handle.getValueState("count", "n bigint")

        def handleInputRows(  # noqa: N802  (pyspark's name)
            self,
            key: Any,
            rows: Iterator[Any],
            timerValues: TimerValues,  # noqa: N803
        ) -> Iterator[Any]:
            import pandas as pd

            received = sum(len(frame) for frame in rows)
            spend_cpu(work_us * received)
            stored = self.count.get()  # None for a new key: one state round trip, not two
            before = int(stored[0]) if stored is not None else 0
            self.count.update((before + received,))
            yield pd.DataFrame(
                {
                    "key": [key[0]] * received,
                    "value": [
                        str(n).encode().rjust(pad, b"0")
                        for n in range(before + 1, before + received + 1)
                    ],
                }
            )

        def close(self) -> None:
            pass

    spark = bench.spark()
    previous = spark.conf.get(PROVIDER_CONF, None)
    spark.conf.set(PROVIDER_CONF, ROCKSDB_PROVIDER)

    def restore() -> None:
        if previous is None:
            spark.conf.unset(PROVIDER_CONF)
        else:
            spark.conf.set(PROVIDER_CONF, previous)

    try:
        counted = (
            kafka_stream(spark, bench.config, [topics.source])
            .select(F.col("key").cast("string").alias("key"), "value")
            .groupBy("key")
            .transformWithStateInPandas(
                statefulProcessor=CountProcessor(),
                outputStructType="key string, value binary",
                outputMode="Update",
                timeMode="None",
            )
        )
        query = (
            counted.writeStream.format("kafka")
            .options(**kafka_options(bench.config))
            .option("topic", topics.sink)
            .option("checkpointLocation", str(bench.root / f"tws-{topics.suffix}"))
            .outputMode("update")
            .trigger(processingTime=f"{TRIGGER_SECONDS} seconds")
            .start()
        )
    except BaseException:
        restore()
        raise
    return QueryHandle(query, on_stop=restore)


def warm_up(bench: Bench) -> None:
    """A throwaway floor query (JIT, Kafka source and sink), then a throwaway millstream run."""
    suffix = unique_suffix()
    source, sink = f"tp_in_warm_{suffix}", f"tp_out_warm_{suffix}"
    config = replace(bench.config, kafka_watermark_topic=f"tp_watermarks_{suffix}")
    query: StreamingQuery | None = None
    watcher: OutputWatcher | None = None
    try:
        create_topic_pair(config, source, sink, PARTITIONS)
        inject_events(
            config, source, 5_000, None, keyspace=f"tp_{suffix}", key_of=backlog_key(1_000)
        )
        watcher = OutputWatcher(config, sink, PARTITIONS)
        assert bench._spark is not None
        query = floor_query(
            bench._spark,
            config,
            source,
            sink,
            str(bench.root / f"warm-{suffix}"),
            TRIGGER_SECONDS,
        )
        watcher.wait(5_000, 300, QueryHandle(query).check)
    finally:
        steps: list[Callable[[], None]] = []
        if query is not None:
            steps.append(lambda: stop_query(query))
        if watcher is not None:
            steps.append(watcher.close)
        steps.append(lambda: delete_topics_containing(config, suffix))
        steps.append(lambda: drop_keyspace(config, f"tp_{suffix}"))
        run_all(steps)
    warm_up_millstream(bench)


def warm_up_millstream(bench: Bench) -> None:
    """A throwaway millstream run, so that no measured row pays for a cold Cassandra (its JIT,
    the LWT paths) or for Spark's Python workers importing their modules."""
    suffix = unique_suffix()
    topics = Topics(suffix, f"tp_in_warm_{suffix}", f"tp_out_warm_{suffix}")
    config = replace(bench.config, kafka_watermark_topic=f"tp_watermarks_{suffix}")
    handle: Handle | None = None
    watcher: OutputWatcher | None = None
    try:
        create_topic_pair(config, topics.source, topics.sink, PARTITIONS)
        inject_events(
            config, topics.source, 5_000, None, keyspace=f"tp_{suffix}", key_of=backlog_key(1_000)
        )
        watcher = OutputWatcher(config, topics.sink, PARTITIONS)
        handle = start_millstream(bench, topics, config)
        watcher.wait(5_000, 300, handle.check)
    finally:
        steps: list[Callable[[], None]] = []
        if handle is not None:
            steps.append(handle.stop)
        if watcher is not None:
            steps.append(watcher.close)
        steps.append(lambda: delete_topics_containing(config, suffix))
        steps.append(lambda: drop_keyspace(config, f"tp_{suffix}"))
        run_all(steps)


def millstream_options(system: str, key_intervals: int | None = None) -> ComputationOptions:
    """The row's options; ``key_intervals`` (``--key-intervals``) if given, else the
    default's (one per core of the Spark job)."""
    if system in ("millstream-strong", STAGED, STAGED_FUSED, *VIEWED):
        # Strong productions, exactly-once, Kafka transactions.
        return ComputationOptions(key_intervals=key_intervals)
    if system == "millstream-notx":
        return ComputationOptions(key_intervals=key_intervals, transactional_productions=False)
    return ComputationOptions(
        key_intervals=key_intervals, strong_productions=False, exactly_once=False
    )


def start_millstream(
    bench: Bench, topics: Topics, config: MillstreamConfig, system: str = "millstream-strong"
) -> Handle:
    topology = Topology(f"tp_{topics.suffix}", streams=[topics.source])
    name = f"count_{topics.suffix}"
    # STAGED: stage n counts what stage n-1 produced, through a topic between them.
    chained = system in (STAGED, STAGED_FUSED)
    between = [f"tp_stage{n}_{topics.suffix}" for n in range(1, STAGES if chained else 1)]
    if between:
        kafka_connector.create_topics(config, between, partitions=PARTITIONS)
    streams = [topics.source, *between, topics.sink]
    for stage, (source, sink) in enumerate(itertools.pairwise(streams)):
        topology.add_computation(
            name if stage == 0 else f"{name}_{stage + 1}",
            Count(sink),
            inputs=[source],
            outputs=[sink],
            options=millstream_options(system, bench.args.key_intervals),
        )
    settings = replace(
        config.run,
        keyspace=f"tp_{topics.suffix}",
        checkpoint_root=bench.root / f"millstream-{topics.suffix}",
        partitions=PARTITIONS,
        one_query=system == STAGED_FUSED,
    )
    running = run_topology(
        topology, config, settings, trigger=ProcessingTime(TRIGGER_SECONDS), spark=bench.spark()
    )
    return MillstreamHandle(running, name, topics.source)


# -- measuring -------------------------------------------------------------------------------


def backlog_key(keys: int) -> Callable[[int], str]:
    def key_of(n: int) -> str:
        return f"k{n % keys}"

    return key_of


def no_value(record_id: bytes) -> bytes:
    return b""


@dataclass
class BacklogRun:
    """One system's run over a backlog in topics, a watermark topic and a keyspace of its
    own (see :func:`backlog_run`); ``handle`` is the system once started."""

    topics: Topics
    config: MillstreamConfig
    keyspace: str
    injection: Injection
    watcher: OutputWatcher
    handle: Handle | None = None
    viewers: Viewers | None = None

    def drain(self, records: int) -> tuple[float, float, float]:
        """Wait until ``records`` outputs are in; the records/s from the system's first batch
        that read input to the last output, and those two wall-clock times."""
        handle = self.handle
        assert handle is not None, "start the system first"
        done = self.watcher.wait(records, max(300.0, records / 50), handle.check)
        first = handle.first_data_at()
        if first is None:
            raise RuntimeError("could not tell when the system began reading its input")
        return records / (done - first), first, done


@contextmanager
def backlog_run(bench: Bench, records: int, key_of: Callable[[int], str]) -> Iterator[BacklogRun]:
    """Fresh topics (2 partitions; the output's timestamps are append times), a watermark
    topic of the run's own (only millstream reads it) and a keyspace (the injector's
    checkpoint, millstream's state), ``records`` injected with keys ``key_of(n)``;
    everything is removed at the end."""
    suffix = unique_suffix()
    topics = Topics(suffix, f"tp_in_{suffix}", f"tp_out_{suffix}")
    config = replace(bench.config, kafka_watermark_topic=f"tp_watermarks_{suffix}")
    keyspace = f"tp_{suffix}"
    run: BacklogRun | None = None
    watcher: OutputWatcher | None = None
    try:
        create_topic_pair(config, topics.source, topics.sink, PARTITIONS)
        injection = inject_events(
            config, topics.source, records, None, keyspace=keyspace, key_of=key_of,
            value_of=no_value,
        )  # fmt: skip
        watcher = OutputWatcher(config, topics.sink, PARTITIONS)
        run = BacklogRun(topics, config, keyspace, injection, watcher)
        yield run
    finally:
        cleanup: list[Callable[[], None]] = []
        if run is not None and (viewers := run.viewers) is not None:
            cleanup.append(lambda: print(f"  after a failure: {viewers.stop()}"))
        if run is not None and run.handle is not None:
            cleanup.append(run.handle.stop)
        if watcher is not None:
            cleanup.append(watcher.close)
        cleanup.append(lambda: delete_topics_containing(config, suffix))
        cleanup.append(lambda: drop_keyspace(config, keyspace))
        run_all(cleanup)


def measure(bench: Bench, system: System) -> RunResult:
    """One run of ``system``: drain the backlog, check the outputs, then the latency phases."""
    args = bench.args
    result = RunResult(system.name)
    key_of = backlog_key(args.keys)
    try:
        with backlog_run(bench, args.records, key_of) as run:
            measure_backlog(bench, system, run, result, key_of)
    except Exception as exc:
        result.error = failure(system.name, exc)
    return result


def failure(name: str, exc: Exception) -> str:
    """A failed run's error, printed: the benchmark goes on with the next row."""
    error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}"
    print(f"  {name} failed: {error}", flush=True)
    return error


def measure_backlog(
    bench: Bench, system: System, run: BacklogRun, result: RunResult, key_of: Callable[[int], str]
) -> None:
    args = bench.args
    result.notes.append(f"injected at {run.injection.rate:,.0f} records/s")
    python = peer_python(bench, system.name)
    if system.on_spark:
        bench.spark()  # before the clock starts
    profiler = (
        Profiler(args.profile, system.name, idle=args.profile_idle)
        if args.profile is not None and system.on_spark
        else None
    )
    with profiler or contextlib.nullcontext():
        _start_and_drain(bench, system, run, result, python)
    if profiler is not None:
        result.notes.append("profiled: records/s slowed by py-spy, not comparable")
        result.notes.append("\n".join(["", *profiler.summary()]))
    handle = run.handle
    assert handle is not None  # _start_and_drain started it
    time.sleep(0.5)  # let stragglers (duplicates) show before checking
    result.check = check_outputs(system, run.watcher.messages, args.records, key_of)
    if isinstance(handle, MillstreamHandle):
        batches = handle.running.batches(handle.computation)
        busy = sum(b.seconds for b in batches)
        result.notes.append(f"{len(batches)} batches, {busy:.1f} s in batches")
        result.notes.append(step_note(batches))
    if system.latency:
        result.latency = latency_phases(
            bench, run.config, run.topics, run.watcher, handle, notes=result.notes
        )
    if run.viewers is not None:
        viewers, run.viewers = run.viewers, None
        result.notes.append(viewers.stop())


def _start_and_drain(
    bench: Bench, system: System, run: BacklogRun, result: RunResult, python: Path
) -> None:
    """Start ``system`` on the run's backlog and drain it, into ``result``: records/s, the
    startup time, and the Python workers' CPU meanwhile (in the notes)."""
    if system.name in VIEWED:  # the pages are open before the topology starts
        run.viewers = Viewers(
            run, f"count_{run.topics.suffix}", panels=system.name == "millstream-viewed"
        )
    if (settled := settle_compactions(run.config)) >= 0.5:
        result.notes.append(f"waited {settled:.1f} s for Cassandra's compactions to end")
    cpu_before = python_worker_cpu()
    cores_before = core_use(bench.services)
    started = time.time()
    if system.name in ("kafka-loop", "quix", "bytewax", "pathway"):
        run.handle = start_peer(bench, run.topics, system.short, python)
    elif system.name in ("spark-floor", FLOOR_STAGED, FLOOR_FUSED):
        stages = 1 if system.name == "spark-floor" else STAGES
        run.handle = start_floor(bench, run.topics, stages, fused=system.name == FLOOR_FUSED)
    elif system.name == "spark-tws":
        run.handle = start_tws(bench, run.topics)
    else:
        run.handle = start_millstream(bench, run.topics, run.config, system.name)
    result.records_per_s, first, done = run.drain(bench.args.records)
    if system.on_spark:
        result.notes.append(cpu_note(cpu_before, python_worker_cpu(), done - started))
    cores_after = core_use(bench.services)
    result.cpu_s = cpu_seconds(cores_before, cores_after)
    if isinstance(run.handle, ProcessHandle):
        result.notes.append(run.handle.cpu_note())
        result.cpu_s += run.handle.cpu_seconds()  # exited: core_use no longer sees it
    result.notes.append(core_note(cores_before, cores_after, done - started))
    if drained := drain_phases(run.handle.spark_query(), first, done):
        result.notes.append(drained)
    result.startup_s = first - started


def latency_phases(
    bench: Bench,
    config: MillstreamConfig,
    topics: Topics,
    watcher: OutputWatcher,
    handle: Handle,
    *,
    rates: list[float] | None = None,
    first: int | None = None,
    key_of: Callable[[int], str] | None = None,
    notes: list[str] | None = None,
) -> dict[float, list[float]]:
    """Paced input at each of ``rates`` (default ``--rates``) for ``--latency-seconds``,
    numbered on from ``first`` (default: after the backlog); the latencies (ms) per rate.
    Where each phase's cores went is added to ``notes``."""
    args = bench.args
    samples: dict[float, list[float]] = {}
    first = args.records if first is None else first
    key_of = key_of or backlog_key(args.keys)
    for rate in args.rates if rates is None else rates:
        count = max(1, int(rate * args.latency_seconds))
        before = watcher.count()
        phase_start = time.time_ns() // 1_000
        cores_before = core_use(bench.services)
        batches_before = (
            len(handle.running.batches()) if isinstance(handle, MillstreamHandle) else 0
        )
        inject_events(
            config,
            topics.source,
            count,
            rate,
            keyspace=f"tp_{topics.suffix}",
            first=first,
            key_of=key_of,
            value_of=no_value,
        )
        watcher.wait(before + count, max(120.0, count / 20), handle.check)
        if notes is not None:
            seconds = time.time() - phase_start / 1_000_000
            notes.append(
                f"at {rate:g} events/s, "
                + core_note(cores_before, core_use(bench.services), seconds)
                + spark_phases(handle.spark_query(), phase_start / 1_000_000)
                + stage_phases(handle, phase_start / 1_000_000, batches_before)
            )
        time.sleep(0.3)
        phase: list[float] = []
        for message in watcher.messages[before:]:
            # The floor forwards the input itself, millstream's output carries the input's
            # event time: either way the record's timestamp is the injection time.
            record = decode_record(message.value)
            if record.timestamp >= phase_start:
                phase.append(message.seen - record.timestamp / 1_000)
        samples[rate] = phase
        first += count
    return samples


def step_note(batches: Sequence[BatchMetrics]) -> str:
    """Where the batches' time went, step by step (``routing``, once a task, then each
    interval's :data:`~millstream.engine.protocol.STEPS`), summed over tasks and intervals:
    seconds, and in brackets the CPU seconds their threads ran (the rest they waited)."""
    total = sum_steps(batch.steps for batch in batches)
    shown = [
        f"{step} {total[step].seconds:.2f} ({total[step].cpu_seconds:.2f})"
        for step in (ROUTING, *STEPS)
        if step in total and total[step].seconds >= 0.005
    ]
    return "steps, s (CPU s), summed over tasks and intervals: " + ", ".join(shown or ["none"])


SPARK_PHASES: Final = ("walCommit", "addBatch", "commitOffsets", "triggerExecution")
"""Steps of a micro-batch in Spark's progress reports (``durationMs``): writing the offset
log, running the batch (``foreachBatch``), writing the commit log, and all of it."""


def durations_since(query: StreamingQuery, since: float) -> list[dict[str, int]]:
    """The ``durationMs`` of ``query``'s batches triggered at or after ``since`` (wall
    clock, s), as far as Spark's recent progress reaches back."""
    return [
        p.durationMs
        for p in query.recentProgress
        if datetime.fromisoformat(p.timestamp).timestamp() >= since
    ]


def drain_phases(query: StreamingQuery | None, first: float, done: float) -> str:
    """Where a Spark row's drain went, from its first batch's trigger (``first``, wall clock,
    s) to its last output seen (``done``): Spark's ``durationMs`` of each batch triggered
    meanwhile, summed step by step (the offsets' request, planning, the batch itself, the
    logs), and when the output was seen against the last batch's end; or ``""``."""
    if query is None:
        return ""
    triggered = (
        (datetime.fromisoformat(p.timestamp).timestamp(), p.durationMs)
        for p in query.recentProgress
    )
    batches = [(at, durations) for at, durations in triggered if first - 0.001 <= at <= done]
    if not batches:
        return ""
    totals: dict[str, int] = {}
    for _, durations in batches:
        for step, ms in durations.items():
            totals[step] = totals.get(step, 0) + ms
    steps = ", ".join(f"{step} {ms}" for step, ms in sorted(totals.items(), key=lambda i: -i[1]))
    last_at, last = batches[-1]
    after = (done - last_at) * 1000 - last.get("triggerExecution", 0)
    return (
        f"drain of {(done - first) * 1000:.0f} ms, Spark's batches triggered meanwhile: "
        f"{len(batches)} (ms summed: {steps}); the last output seen {after:.0f} ms after the "
        "last batch ended (less than 0: before it ended)"
    )


def spark_phases(query: StreamingQuery | None, since: float) -> str:
    """``"; Spark per batch (median ms over N): ..."`` for ``query``'s batches triggered
    at or after ``since`` (wall clock, s), or ``""``: where a batch's time went, Spark's own
    steps included."""
    if query is None:
        return ""
    batches = durations_since(query, since)
    if not batches:
        return ""
    steps = ", ".join(
        f"{step} {statistics.median(b.get(step, 0) for b in batches):.0f}" for step in SPARK_PHASES
    )
    return f"; Spark per batch (median ms over {len(batches)}): {steps}"


def stage_phases(handle: Handle, since: float, batches_before: int) -> str:
    """For a millstream row, or the floor's chain: :func:`computation_phases` of each of its
    queries' batches triggered at or after ``since`` (wall clock, s), and of the millstream
    batches recorded after the first ``batches_before`` (where a paced phase's batches
    spend their time); else ``""``."""
    recorded: list[BatchMetrics] = []
    if isinstance(handle, MillstreamHandle):
        queries = handle.running.queries
        recorded = handle.running.batches()[batches_before:]
    elif isinstance(handle, QueryHandle) and len(handle.chain) > 1:
        queries = {f"stage {n}": query for n, query in enumerate(handle.chain, start=1)}
    else:
        return ""
    triggers = {
        name: [d.get("triggerExecution", 0) for d in durations_since(query, since)]
        for name, query in queries.items()
    }
    return computation_phases(triggers, recorded)


def computation_phases(
    triggers: Mapping[str, Sequence[float]], batches: Sequence[BatchMetrics]
) -> str:
    """``"; per computation: ..."``: for each computation (by name), its micro-batches and
    their median ``triggerExecution`` (ms, Spark's; ``triggers``, as far as Spark's recent
    progress reaches back), the batches that ran a job (millstream's), and each step's mean
    ms a batch, summed over its tasks and intervals: where a stage of a pipeline spends the
    batches a record waits through. A batch that took :data:`STALL_FACTOR` times the median
    of those that ran a job, and at least :data:`STALL_SECONDS`, is named with its own steps:
    where a stall went, which the means hide."""
    parts = []
    for name in sorted(triggers):
        ran = [b for b in batches if b.computation == name]
        total = sum_steps(b.steps for b in ran)
        steps = ", ".join(
            f"{step} {total[step].seconds / len(ran) * 1_000:.0f}"
            for step in (ROUTING, *STEPS)
            if step in total and total[step].seconds / len(ran) >= 0.0005
        )
        spark = triggers[name]
        median = (
            f"median {statistics.median(spark):.0f} ms" if spark else "none in Spark's progress"
        )
        jobs = f", {len(ran)} ran a job" if batches else ""
        parts.append(
            f"{name}: {len(spark)} batches, {median}{jobs}"
            + (f" (steps, ms a batch: {steps})" if steps else "")
            + slowest_batch(ran)
        )
    return "; per computation: " + " | ".join(parts) if parts else ""


STALL_FACTOR: Final = 4.0
STALL_SECONDS: Final = 1.0


def slowest_batch(batches: Sequence[BatchMetrics]) -> str:
    """``", slowest: ..."``: the longest of ``batches`` (one computation's), its seconds
    (the handler's, report included), the steps it spent over 5 ms in (summed over its
    tasks and intervals) and its bookkeeping, if it took :data:`STALL_FACTOR` times their
    median and at least :data:`STALL_SECONDS`; else ``""``."""
    if not batches:
        return ""
    slowest = max(batches, key=lambda b: b.seconds)
    typical = statistics.median(b.seconds for b in batches)
    if slowest.seconds < max(STALL_SECONDS, STALL_FACTOR * typical):
        return ""
    steps = ", ".join(
        f"{step} {spent.seconds * 1_000:.0f}"
        for step, spent in sorted(slowest.steps.items(), key=lambda item: -item[1].seconds)
        if spent.seconds >= 0.005
    )
    return (
        f", slowest: batch {slowest.batch_id}, {slowest.seconds * 1_000:.0f} ms against a median "
        f"{typical * 1_000:.0f} (steps, ms: {steps or 'none'}; bookkeeping "
        f"{slowest.watermark_seconds * 1_000:.0f})"
    )


def check_outputs(
    system: System, messages: list[Any], records: int, key_of: Callable[[int], str]
) -> str:
    """ "ok", or what is wrong: each key of input ``0 .. records-1`` (``key_of``) counted
    1..n exactly once; for the floors, one output per input."""
    if system.name in ("kafka-loop", "spark-floor", FLOOR_STAGED, FLOOR_FUSED):
        values = {m.value for m in messages}
        if len(messages) == records and len(values) == records:
            return "ok"
        return f"{len(messages)} outputs ({len(values)} distinct) for {records} inputs"
    pairs: list[tuple[str, int]] = []
    for message in messages:
        if system.name.startswith("millstream"):
            record = decode_record(message.value)
            pairs.append((record.key, int(record.value)))
        else:
            pairs.append(((message.key or b"").decode(), int(message.value)))
    per_key = Counter(key_of(n) for n in range(records))
    expected = {(key, n) for key, count in per_key.items() for n in range(1, count + 1)}
    distinct = set(pairs)
    problems = []
    if len(pairs) > len(distinct):
        problems.append(f"{len(pairs) - len(distinct)} duplicates")
    if expected - distinct:
        problems.append(f"{len(expected - distinct)} missing")
    if distinct - expected:
        problems.append(f"{len(distinct - expected)} unexpected")
    return ", ".join(problems) or "ok"


# -- the large-state case --------------------------------------------------------------------


@dataclass
class LargeStateResult:
    keys: dict[str, int] = field(default_factory=dict)  # case → keys in the interval
    seconds: dict[str, list[float]] = field(default_factory=dict)  # case → per run
    batches: dict[str, list[int]] = field(default_factory=dict)  # case → per run
    preload_seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    error: str | None = None


def preload(session: Any, keyspace: str, computation: str, keys: int, dedup_ttl: int) -> None:
    """State (a count of 1) for keys k0..k<keys-1> in interval 0 of ``computation``."""
    store = CassandraIntervalStore(
        session, keyspace, SystemClock(), max_batch_bytes=PRELOAD_BATCH_BYTES
    )
    lease = store.acquire(computation, 0)
    one = IntCodec().encode(1)
    for start in range(0, keys, PRELOAD_CHUNK):
        changes = [
            KeyChanges(f"k{n}", state=one) for n in range(start, min(keys, start + PRELOAD_CHUNK))
        ]
        store.commit(lease, changes, dedup_ttl=dedup_ttl)


def large_state(bench: Bench) -> LargeStateResult:
    """Preload both intervals once, then per run: a fresh topology over the same computations
    (so their interval caches start cold, as in the first run), a warm-up batch, and the
    measured batch."""
    args = bench.args
    suffix = unique_suffix()
    config = replace(bench.config, kafka_watermark_topic=f"tp_watermarks_{suffix}")
    keyspace = f"tp_{suffix}"
    cases = {"small": SMALL_KEYS, "large": args.large_keys}
    names = {case: f"{case}_{suffix}" for case in cases}
    result = LargeStateResult(keys=dict(cases))
    # Per run, keys nobody touched before in the large case; all of them in the small one.
    sample = random.Random(7).sample(range(args.large_keys), LARGE_BATCH * args.runs)
    cluster, session = cassandra_connector.connect(config)
    try:
        cassandra_connector.create_keyspace(session, keyspace, config.cassandra_replication)
        create_schema(session, keyspace)
        started = time.monotonic()
        for case, keys in cases.items():
            preload(session, keyspace, names[case], keys, ComputationOptions().dedup_ttl)
        result.preload_seconds = time.monotonic() - started
        print(
            f"  preloaded {sum(cases.values()):,} keys in {result.preload_seconds:.0f} s",
            flush=True,
        )
        bench.spark()
        for run in range(args.runs):
            chosen = {
                "small": list(range(SMALL_KEYS)),
                "large": sample[run * LARGE_BATCH : (run + 1) * LARGE_BATCH],
            }
            large_state_run(bench, config, keyspace, names, chosen, f"{suffix}_{run}", result)
            print(
                "  run " + ", ".join(f"{case}: {result.seconds[case][-1]:.2f} s" for case in cases),
                flush=True,
            )
    except Exception as exc:
        result.error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}"
        print(f"  large-state failed: {result.error}", flush=True)
    finally:
        run_all(
            [
                lambda: delete_topics_containing(config, suffix),
                lambda: cassandra_connector.drop_keyspace(session, keyspace),
                cluster.shutdown,
            ]
        )
    return result


def large_state_run(
    bench: Bench,
    config: MillstreamConfig,
    keyspace: str,
    names: dict[str, str],
    chosen: dict[str, list[int]],
    tag: str,
    result: LargeStateResult,
) -> None:
    sources = {case: f"tp_in_{case}_{tag}" for case in names}
    topology = Topology(f"tp_{tag}", streams=list(sources.values()))
    for case, name in names.items():
        topology.add_computation(
            name,
            Count(f"tp_out_{case}_{tag}"),
            inputs=[sources[case]],
            outputs=[f"tp_out_{case}_{tag}"],
            options=ComputationOptions(key_intervals=1),
        )
    settings = replace(
        config.run,
        keyspace=keyspace,
        checkpoint_root=bench.root / f"large-{tag}",
        partitions=PARTITIONS,
    )
    running = run_topology(topology, config, settings, trigger=AvailableNow(), spark=bench.spark())
    try:
        for case in names:
            inject_events(
                config,
                sources[case],
                WARM_UP,
                None,
                keyspace=keyspace,
                key_of=lambda n: f"w{n}",
                value_of=no_value,
            )
        running.process_available()
        warmed = {case: len(running.batches(name)) for case, name in names.items()}
        for case, keys in chosen.items():

            def key_of(n: int, keys: list[int] = keys) -> str:
                return f"k{keys[n - WARM_UP]}"

            inject_events(
                config,
                sources[case],
                len(keys),
                None,
                keyspace=keyspace,
                first=WARM_UP,  # record IDs after the warm-up's, or they would be duplicates
                key_of=key_of,
                value_of=no_value,
            )
        running.process_available()
        for case, name in names.items():
            measured = [b for b in running.batches(name)[warmed[case] :] if b.inputs]
            result.seconds.setdefault(case, []).append(sum(b.seconds for b in measured))
            result.batches.setdefault(case, []).append(len(measured))
            result.notes.extend(
                f"{case} ({tag}): batch {b.batch_id}: {b.inputs} inputs, {b.seconds:.2f} s, "
                f"{b.rescans} rescans, cache hits {b.cache_hits}/{b.intervals}"
                for b in measured
            )
    finally:
        running.stop()


# -- plumbing --------------------------------------------------------------------------------


def run_all(steps: list[Callable[[], None]]) -> None:
    """Run every clean-up step even if some fail; report failures without raising."""
    for step in steps:
        try:
            step()
        except Exception as exc:
            print(f"  clean-up step failed: {type(exc).__name__}: {exc}", file=sys.stderr)


def output_size() -> int:
    """Bytes of a typical millstream output record of the count (what peers write)."""
    cause = injector_record_id("tp_in_00000000", 0, 12_345)
    record = Record(
        "k5000", b"2", time.time_ns() // 1_000, production_record_id("count_00000000", cause, 0)
    )
    return len(encode_record(record))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    names = [s.name for s in SYSTEMS] + [LARGE_STATE]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--records", type=int, default=20_000, help="backlog size")
    parser.add_argument("--keys", type=int, default=10_000, help="distinct keys of the backlog")
    parser.add_argument("--runs", type=int, default=1, help="runs of each row (median shown)")
    parser.add_argument(
        "--warmup",
        type=int,
        default=0,
        help="uncounted runs of the first row before the counted ones (a JVM warming up)",
    )
    parser.add_argument("--only", default="", help=f"comma-separated subset of: {', '.join(names)}")
    parser.add_argument(
        "--rates", default="200,2000", help="events/s of the latency phases ('' for none)"
    )
    parser.add_argument("--latency-seconds", type=float, default=5.0, help="length of each")
    parser.add_argument(
        "--large-keys", type=int, default=1_000_000, help="keys in the large-state interval"
    )
    parser.add_argument(
        "--key-intervals",
        type=int,
        help="key intervals of the millstream rows (default: ComputationOptions' default, one "
        "per core of the Spark job)",
    )
    parser.add_argument("--json", type=Path, help="write the figures to this JSON file")
    parser.add_argument("--plot", type=Path, help="write a PNG bar chart here")
    parser.add_argument("--quix-python", help="Python of a virtualenv with quixstreams 3")
    parser.add_argument(
        "--profile",
        type=Path,
        help="record the driver and every Spark Python worker of each Spark and millstream "
        "row with py-spy into this folder, and print their top functions (bench/profiling.py)",
    )
    parser.add_argument(
        "--profile-idle",
        action="store_true",
        help="with --profile: sample waiting threads too (shares of wall time, not of CPU)",
    )
    args = parser.parse_args(argv)
    args.rates = [float(r) for r in args.rates.split(",") if r.strip()]
    args.only = [n.strip() for n in args.only.split(",") if n.strip()] or names
    unknown = sorted(set(args.only) - set(names))
    if unknown:
        parser.error(f"unknown --only names {unknown}; choose from {names}")
    if args.warmup < 0:
        parser.error("--warmup must not be negative")
    if args.records < 1 or args.keys < 1 or args.runs < 1 or args.large_keys < LARGE_BATCH:
        parser.error(f"--records, --keys, --runs must be positive, --large-keys >= {LARGE_BATCH}")
    return args


def run_order(systems: Sequence[System], args: argparse.Namespace) -> list[tuple[int, System]]:
    """The rows' runs in the order they run, each with its number (0: a warm-up, not counted).

    Runs go round the rows (run 1 of every row, then run 2, ...): a drift in the shared
    machine's speed then spreads over every row alike, not over one row's runs. Even rounds go
    round backwards, so that no row always runs first, or always right after another one (whose
    leftovers, compactions and topic deletions, would land on it). ``--warmup`` first runs the
    first row that many times, uncounted: the first run in a fresh Spark session is slower
    (the JVM still compiling), and it would otherwise count against whichever row came first.
    """
    order: list[tuple[int, System]] = [(0, systems[0])] * args.warmup if systems else []
    for number in range(1, args.runs + 1):
        round_ = systems if number % 2 else list(reversed(systems))
        order.extend((number, system) for system in round_)
    return order


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    began = time.monotonic()
    config = load_config()
    bench = Bench(
        config, args, Path(tempfile.mkdtemp(prefix="millstream-throughput-")), output_size()
    )
    runs: dict[str, list[RunResult]] = {}
    large: LargeStateResult | None = None
    try:
        for number, system in run_order([s for s in SYSTEMS if s.name in args.only], args):
            label = "warm-up, not counted" if number == 0 else f"run {number}/{args.runs}"
            print(f"{system.name} ({label})", flush=True)
            result = measure(bench, system)
            if number > 0:
                runs.setdefault(system.name, []).append(result)
            if result.records_per_s is not None:
                print(
                    f"  {result.records_per_s:,.0f} records/s, startup "
                    f"{result.startup_s:.1f} s, check: {result.check}"
                    + "".join(f"; {note}" for note in result.notes),
                    flush=True,
                )
        if LARGE_STATE in args.only:
            print(
                f"{LARGE_STATE}: preloading {args.large_keys:,} + {SMALL_KEYS:,} keys", flush=True
            )
            large = large_state(bench)
    finally:
        run_all([bench.close, lambda: shutil.rmtree(bench.root, ignore_errors=True)])
    rows = report(args, runs, large)
    print(f"\n(whole run: {time.monotonic() - began:.0f} s)")
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
        print(f"wrote {args.json}")
    if args.plot is not None:
        plot(rows, args.plot)
        print(f"wrote {args.plot}")
    failed = [name for name, results in runs.items() if any(r.error for r in results)]
    return 1 if failed or (large is not None and large.error) else 0


# -- reporting -------------------------------------------------------------------------------


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def cpu_per_record(results: list[RunResult], records: int) -> list[float]:
    """Each run's CPU µs a record: what a row's records cost the machine (over the runs
    measured, it spread about as much as records/s)."""
    return [r.cpu_s / records * 1e6 for r in results if r.cpu_s is not None and not r.error]


def report(
    args: argparse.Namespace, runs: dict[str, list[RunResult]], large: LargeStateResult | None
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    throughput: dict[str, float] = {}
    for name, results in runs.items():
        system = BY_NAME[name]
        rates = [r.records_per_s for r in results if r.records_per_s is not None]
        value = median(rates)
        if value is not None:
            throughput[name] = value
        startups = [r.startup_s for r in results if r.startup_s is not None]
        cpu = cpu_per_record(results, args.records)
        rows.append(
            {
                "system": name,
                "what": system.what,
                "guarantee": system.guarantee,
                "records_per_s": value,
                "p50_ms": None,
                "p95_ms": None,
                "runs_records_per_s": rates,
                "cpu_us_per_record": median(cpu),
                "runs_cpu_us_per_record": cpu,
                "startup_s": median(startups),
                "check": "; ".join(sorted({r.check for r in results if r.check})) or None,
                "error": "; ".join(r.error for r in results if r.error) or None,
                "records": args.records,
                "keys": args.keys,
            }
        )
    if rows:
        print(
            f"\nthroughput: a backlog of {args.records:,} records over {args.keys:,} keys, "
            f"{PARTITIONS} partitions; median of {args.runs} run(s); "
            "x<peer> = records/s / the peer's; CPU µs/rec: CPU of everything the row ran on "
            "(services, driver, workers, peer) over the drain, start-up included, a record"
        )
        peers = [s for s in SYSTEMS if s.name in throughput]
        header = (
            f"{'system':<20} {'guarantee':<14} {'records/s':>10} {'startup s':>9} "
            f"{'CPU µs/rec':>10}  " + " ".join(f"{'x' + p.short:>10}" for p in peers) + "  check"
        )
        print(header)
        print("-" * len(header))
        for row in rows:
            value = row["records_per_s"]
            cells = " ".join(
                f"{value / throughput[p.name]:>10.2f}" if value is not None else f"{'-':>10}"
                for p in peers
            )
            startup = f"{row['startup_s']:>9.1f}" if row["startup_s"] is not None else f"{'-':>9}"
            shown = f"{value:>10,.0f}" if value is not None else f"{'failed':>10}"
            cost = row["cpu_us_per_record"]
            used = f"{cost:>10.1f}" if cost is not None else f"{'-':>10}"
            print(
                f"{row['system']:<20} {row['guarantee']:<14} {shown} {startup} {used}  {cells}  "
                f"{row['error'] or row['check']}"
            )
    rows.extend(latency_report(args, runs))
    rows.extend(view_cost_report(args, runs))
    if large is not None:
        rows.extend(large_report(args, large))
    rows.extend(goals_report(rows))
    return rows


def latency_report(
    args: argparse.Namespace, runs: dict[str, list[RunResult]]
) -> list[dict[str, Any]]:
    measured = [s for s in SYSTEMS if s.latency and s.name in runs]
    if not measured or not args.rates:
        return []
    rows: list[dict[str, Any]] = []
    print(
        f"\nlatency: injection → a read_committed reader receives the output (ms), "
        f"trigger {TRIGGER_SECONDS} s, "
        f"{args.latency_seconds:g} s at each rate"
    )
    print(f"{'events/s':>9} {'system':<21} {'p50':>8} {'p95':>8} {'n':>7}  p50 / floor p50")
    for rate in args.rates:
        floor_p50: float | None = None
        for system in measured:
            samples = [x for r in runs[system.name] for x in r.latency.get(rate, [])]
            p50 = percentile(samples, 50) if samples else None
            p95 = percentile(samples, 95) if samples else None
            ratio = None
            if system.name == "spark-floor":
                floor_p50 = p50
            elif floor_p50 and p50 is not None:
                ratio = p50 / floor_p50
            rows.append(
                {
                    "system": f"latency/{system.name}@{rate:g}",
                    "guarantee": system.guarantee,
                    "records_per_s": None,
                    "p50_ms": p50,
                    "p95_ms": p95,
                    "rate": rate,
                    "samples": len(samples),
                    "p50_ratio_to_floor": ratio,
                }
            )
            shown = (
                f"{p50:>8.0f} {p95:>8.0f}"
                if p50 is not None and p95 is not None
                else "      -        -"
            )
            print(
                f"{rate:>9g} {system.name:<21} {shown} {len(samples):>7}  "
                + (f"x{ratio:.2f}" if ratio is not None else "")
            )
        stages = {chained: stage_latency(rows, rate, chained) for chained in FURTHER_STAGE}
        floor_stage = stages[FLOOR_STAGED]
        for chained, stage in stages.items():
            if stage is None:
                continue
            rows.append(stage)
            one, name = FURTHER_STAGE[chained]
            than_floors = (
                f", x{stage['p50_ms'] / floor_stage['p50_ms']:.2f} the floor's further stage"
                if chained in (STAGED, STAGED_FUSED)
                and floor_stage is not None
                and floor_stage["p50_ms"] > 0
                else ""
            )
            print(
                f"{rate:>9g} {name.replace('-', ' '):<21} {stage['p50_ms']:>8.0f} "
                f"{stage['p95_ms']:>8.0f}  ({chained} less {one}, over {STAGES - 1}"
                f"{than_floors})"
            )
    return rows


def stage_latency(
    rows: Sequence[dict[str, Any]], rate: float, chained_system: str = STAGED
) -> dict[str, Any] | None:
    """What each stage past the first adds to the latency at ``rate``: the p50 and p95 of
    ``chained_system`` (one of FURTHER_STAGE) less its one-stage row's, over ``STAGES - 1``;
    None unless the run measured both."""
    one_stage, name = FURTHER_STAGE[chained_system]
    by_system = {row["system"]: row for row in rows}
    one = by_system.get(f"latency/{one_stage}@{rate:g}")
    chained = by_system.get(f"latency/{chained_system}@{rate:g}")
    if one is None or chained is None:
        return None
    added = {}
    for figure in ("p50_ms", "p95_ms"):
        if one[figure] is None or chained[figure] is None:
            return None
        added[figure] = (chained[figure] - one[figure]) / (STAGES - 1)
    return {
        "system": f"latency/{name}@{rate:g}",
        "guarantee": BY_NAME[chained_system].guarantee,
        "records_per_s": None,
        **added,
        "rate": rate,
    }


def view_cost_report(
    args: argparse.Namespace, runs: dict[str, list[RunResult]]
) -> list[dict[str, Any]]:
    """What the open pages cost: each of ``VIEWED`` against ``millstream-strong`` of the
    same run, throughput (median of runs, and each run's pair) and latency percentiles."""
    return [
        row
        for name in VIEWED
        for row in view_cost(
            args,
            f"{name} ({VIEW_PAGES} pages open) / millstream-strong (none)",
            runs.get("millstream-strong"),
            runs.get(name),
            system=f"view-cost {name}",
        )
    ]


def view_cost(
    args: argparse.Namespace,
    label: str,
    plain: list[RunResult] | None,
    viewed: list[RunResult] | None,
    *,
    system: str,
) -> list[dict[str, Any]]:
    """The ``viewed`` results' cost against the ``plain`` ones, paired in order (runs of two
    rows, or blocks of one run: bench/view_cost.py), printed under ``label`` and returned as
    a JSON row named ``system``."""
    if not plain or not viewed:
        return []
    print(f"\nthe live view's cost: {label}; the issue's bound: throughput ≥ 0.98, latency ≤ 1.02")
    row: dict[str, Any] = {"system": system}
    # The spread from run to run is larger than the bound: each ratio comes with a 90 %
    # interval, from resampling the pairs of runs (a bootstrap over runs, not samples).
    pairs = list(zip(plain, viewed, strict=False))
    resampled = _resample(pairs, VIEW_COST_ROUNDS)
    per_run = [
        v.records_per_s / p.records_per_s for p, v in pairs if p.records_per_s and v.records_per_s
    ]
    if per_run:
        ratio = _throughput_ratio(pairs)  # the statistic the interval resamples
        low, high = _interval(_throughput_ratio(sample) for sample in resampled)
        row["throughput_ratio"] = ratio
        row["throughput_ratio_interval"] = [low, high]
        row["throughput_ratio_per_run"] = per_run
        print(
            f"  throughput: x{ratio:.3f} (medians; 90 % interval x{low:.3f} to x{high:.3f}); "
            "pair by pair: " + ", ".join(f"x{pair:.3f}" for pair in per_run)
        )
    for rate in args.rates:
        plain_samples = [x for r in plain for x in r.latency.get(rate, [])]
        viewed_samples = [x for r in viewed for x in r.latency.get(rate, [])]
        if not plain_samples or not viewed_samples:
            continue
        intervals = _latency_intervals(resampled, rate)
        for q in (50, 95):
            viewed_ms, plain_ms = percentile(viewed_samples, q), percentile(plain_samples, q)
            ratio = viewed_ms / plain_ms
            low, high = intervals[q]
            row[f"p{q}_ratio@{rate:g}"] = ratio
            row[f"p{q}_ratio_interval@{rate:g}"] = [low, high]
            print(
                f"  latency p{q} at {rate:g} events/s: {viewed_ms:.0f} ms "
                f"against {plain_ms:.0f} ms, x{ratio:.3f} "
                f"(90 % interval x{low:.3f} to x{high:.3f})"
            )
    return [row]


VIEW_COST_ROUNDS = 400
RunPair = tuple["RunResult", "RunResult"]


def _resample(pairs: list[RunPair], rounds: int) -> list[list[RunPair]]:
    """``rounds`` resamples of ``pairs`` with replacement, the same for every ratio (seeded:
    a report prints the same intervals for the same runs)."""
    chooser = random.Random(0)
    return [[chooser.choice(pairs) for _ in pairs] for _ in range(rounds)]


def _interval(values: Iterator[float] | list[float]) -> tuple[float, float]:
    """The 5th and 95th percentiles of ``values`` (a bootstrap's statistics)."""
    ordered = sorted(values)
    return ordered[int(0.05 * (len(ordered) - 1))], ordered[int(0.95 * (len(ordered) - 1))]


def _throughput_ratio(pairs: list[RunPair]) -> float:
    plain = [p.records_per_s for p, _ in pairs if p.records_per_s]
    viewed = [v.records_per_s for _, v in pairs if v.records_per_s]
    return statistics.median(viewed) / statistics.median(plain) if plain and viewed else 1.0


def _latency_intervals(
    resampled: list[list[RunPair]], rate: float
) -> dict[int, tuple[float, float]]:
    """Per percentile (50, 95), the 90 % interval of the viewed/plain latency ratio at
    ``rate`` over the resamples (each pools its runs' samples, as the reported ratio does,
    thinned evenly to 1,000 a run: the interval in seconds, not minutes)."""
    ratios: dict[int, list[float]] = {50: [], 95: []}
    thinned: dict[int, list[float]] = {}  # by id(run): its samples, sorted, at most 1,000

    def samples(run: RunResult) -> list[float]:
        if id(run) not in thinned:
            ordered = sorted(run.latency.get(rate, []))
            step = max(1, len(ordered) // 1_000)  # evenly through the sorted samples
            thinned[id(run)] = ordered[::step]
        return thinned[id(run)]

    for sample in resampled:
        plain = [x for p, _ in sample for x in samples(p)]
        viewed = [x for _, v in sample for x in samples(v)]
        if len(plain) < 2 or len(viewed) < 2:
            continue
        plain_cuts = statistics.quantiles(plain, n=100, method="inclusive")
        viewed_cuts = statistics.quantiles(viewed, n=100, method="inclusive")
        for q in ratios:
            ratios[q].append(viewed_cuts[q - 1] / plain_cuts[q - 1])
    return {q: _interval(values) if values else (1.0, 1.0) for q, values in ratios.items()}


def large_report(args: argparse.Namespace, large: LargeStateResult) -> list[dict[str, Any]]:
    print(
        f"\nlarge state: a {LARGE_BATCH:,}-record batch on one key interval (strong productions, "
        f"exactly-once); median of {args.runs} run(s)"
    )
    if large.error is not None:
        print(f"  failed: {large.error}")
    rows: list[dict[str, Any]] = []
    small = median(large.seconds.get("small", []))
    for case in ("small", "large"):
        seconds = median(large.seconds.get(case, []))
        keys = large.keys.get(case, 0)
        ratio = seconds / small if case == "large" and seconds and small else None
        rows.append(
            {
                "system": f"large-state/{keys}-keys",
                "guarantee": "exactly-once",
                "records_per_s": LARGE_BATCH / seconds if seconds else None,
                "p50_ms": None,
                "p95_ms": None,
                "interval_keys": keys,
                "batch_records": LARGE_BATCH,
                "batch_seconds": seconds,
                "runs_batch_seconds": large.seconds.get(case, []),
                "batches_per_run": large.batches.get(case, []),
                "ratio_to_1000_keys": ratio,
                "preload_seconds": large.preload_seconds,
                "error": large.error,
            }
        )
        if seconds is not None:
            print(f"  interval holding {keys:>9,} keys: {seconds:6.2f} s per batch")
    large_seconds = median(large.seconds.get("large", []))
    if large_seconds and small:
        print(
            f"  ratio {large.keys['large']:,} keys / {SMALL_KEYS:,} keys: "
            f"x{large_seconds / small:.2f}"
        )
    print(f"  (preloading the state took {large.preload_seconds:.0f} s)")
    for note in large.notes:
        print(f"  {note}")
    return rows


@dataclass(frozen=True)
class Goal:
    """One of issue 24's goals: ``measured`` over ``against`` (two rows' figure), at least
    ``at_least`` or at most ``at_most``."""

    text: str
    measured: str
    against: str
    figure: str
    at_least: float | None = None
    at_most: float | None = None

    def met(self, ratio: float) -> bool:
        if self.at_least is not None:
            return ratio >= self.at_least
        assert self.at_most is not None
        return ratio <= self.at_most

    @property
    def bound(self) -> str:
        if self.at_least is not None:
            return f">= x{self.at_least:.2f}"
        return f"<= x{self.at_most:.2f}"


def goals(rows: Sequence[dict[str, Any]]) -> list[Goal]:
    """Issue 24's goals that the run whose ``rows`` these are can have measured: throughput
    against the peers, latency at each of its rates, and a large interval's batch against
    the small one's (:func:`large_report`)."""
    rates = sorted({row["rate"] for row in rows if "rate" in row})
    small = f"large-state/{SMALL_KEYS}-keys"
    listed = [
        Goal(
            "exactly-once at least as fast as Quix Streams' exactly-once",
            "millstream-strong",
            "quix",
            "records_per_s",
            at_least=1.0,
        ),
        Goal(
            "weak productions within 1.2x of the bare Spark floor",
            "millstream-weak",
            "spark-floor",
            "records_per_s",
            at_least=1 / 1.2,
        ),
    ]
    for rate in rates:
        for figure, bound in (("p50_ms", 1.3), ("p95_ms", 1.5)):
            listed.append(
                Goal(
                    f"latency {figure[:3]} at {rate:g} events/s within {bound}x of the floor's",
                    f"latency/millstream-strong@{rate:g}",
                    f"latency/spark-floor@{rate:g}",
                    figure,
                    at_most=bound,
                )
            )
        for chained, added in (
            (STAGED, "a-further-stage"),
            (STAGED_FUSED, "a-further-stage-in-one"),
        ):
            listed.append(
                Goal(
                    f"a further stage adds at most one floor batch at {rate:g} events/s (p50: "
                    f"{chained} less millstream-strong, over {STAGES - 1}, against the floor's)",
                    f"latency/{added}@{rate:g}",
                    f"latency/spark-floor@{rate:g}",
                    "p50_ms",
                    at_most=1.0,
                )
            )
    listed += [
        Goal(
            f"a {LARGE_BATCH:,}-record batch on {row['interval_keys']:,} keys within 1.5x of "
            f"one on {SMALL_KEYS:,}",
            row["system"],
            small,
            "batch_seconds",
            at_most=1.5,
        )
        for row in rows
        if row["system"].startswith("large-state/") and row["system"] != small
    ]
    return listed


def goals_report(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Issue 24's goals as this run measured them, each met or not, for those whose two rows
    the run has: a JSON row ``goals`` (none if the run measured no goal). A throughput goal
    is also given round by round (the rounds alternate, and the machine's speed moves
    between them more than between two rows of one round)."""
    by_system = {row["system"]: row for row in rows}
    verdicts: list[dict[str, Any]] = []
    for goal in goals(rows):
        measured, against = by_system.get(goal.measured), by_system.get(goal.against)
        if measured is None or against is None:
            continue
        mine, theirs = measured.get(goal.figure), against.get(goal.figure)
        if not mine or not theirs:
            continue
        ratio = mine / theirs
        rounds = [
            a / b
            for a, b in zip(
                measured.get("runs_records_per_s") or [],
                against.get("runs_records_per_s") or [],
                strict=False,
            )
            if a and b
        ]
        verdicts.append(
            {
                "goal": goal.text,
                "ratio": ratio,
                "bound": goal.bound,
                "met": goal.met(ratio),
                "rounds": rounds,
                "rounds_met": sum(goal.met(r) for r in rounds),
            }
        )
    if not verdicts:
        return []
    print("\nissue 24's goals, in this run (ratios of medians; x: of the peer's figure)")
    for verdict in verdicts:
        rounds = verdict["rounds"]
        by_round = (
            f"; rounds: {', '.join(f'x{r:.2f}' for r in rounds)} "
            f"({verdict['rounds_met']} of {len(rounds)} met)"
            if len(rounds) > 1
            else ""
        )
        print(
            f"  {'met    ' if verdict['met'] else 'not met'}  {verdict['goal']}: "
            f"x{verdict['ratio']:.2f} (goal {verdict['bound']}){by_round}"
        )
    return [{"system": "goals", "goals": verdicts}]


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Bar charts of whatever was measured: throughput, latency, large state."""
    matplotlib: Any = importlib.import_module("matplotlib")
    matplotlib.use("Agg")
    pyplot: Any = importlib.import_module("matplotlib.pyplot")
    throughput = [r for r in rows if r["system"] in BY_NAME and r["records_per_s"] is not None]
    latency = [r for r in rows if r["system"].startswith("latency/") and r["p50_ms"] is not None]
    large = [r for r in rows if r["system"].startswith("large-state/") and r["batch_seconds"]]
    panels = [(3, "throughput", throughput), (2, "latency", latency), (1, "large", large)]
    shown = [(width, kind, data) for width, kind, data in panels if data]
    if not shown:
        print("nothing to plot")
        return
    figure, axes = pyplot.subplots(
        1,
        len(shown),
        figsize=(5.5 * sum(w for w, _, _ in shown) / 2, 5),
        width_ratios=[w for w, _, _ in shown],
        squeeze=False,
    )
    for axis, (_, kind, data) in zip(axes[0], shown, strict=True):
        if kind == "throughput":
            values = [r["records_per_s"] for r in data]
            bars = axis.bar([f"{r['system']}\n({r['guarantee']})" for r in data], values)
            axis.bar_label(bars, labels=[f"{v:,.0f}" for v in values], fontsize=8)
            axis.set_ylabel("records/s")
            axis.set_title("keyed count: backlog drained")
            axis.tick_params(axis="x", labelrotation=30, labelsize=8)
        elif kind == "latency":
            positions = list(range(len(data)))
            axis.bar([p - 0.2 for p in positions], [r["p50_ms"] for r in data], 0.4, label="p50")
            axis.bar([p + 0.2 for p in positions], [r["p95_ms"] for r in data], 0.4, label="p95")
            labels = [r["system"].removeprefix("latency/").replace("@", "\n@ ") for r in data]
            axis.set_xticks(positions, labels, fontsize=8)
            axis.set_ylabel("ms, injection → read by a read_committed reader")
            axis.set_title("latency (events/s offered)")
            axis.legend()
        else:
            axis.bar(
                [f"{r['interval_keys']:,} keys" for r in data], [r["batch_seconds"] for r in data]
            )
            axis.set_ylabel(f"s per {LARGE_BATCH:,}-record batch")
            axis.set_title("one key interval's state")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    pyplot.close(figure)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
