"""The Spark runner on the real Kafka, Cassandra and Spark.

The pipeline is ``examples/search_pipeline.py``: stage 1 keys search events by user and
counts them, producing ``(query, 1)`` keyed by query; stage 2 keys those by query and counts
them, remembering every record ID it counted. Each test compares the state committed in
Cassandra with a fold over the distinct input.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import math
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, cast

import pytest

from millstream.connectors import kafka as kafka_connector
from millstream.connectors.kafka.stalls import stable_offsets
from millstream.connectors.stream_reader import read_messages
from millstream.devtools.local.hanging_transactions import write_hanging_transaction
from millstream.engine.clock import SystemClock
from millstream.engine.codecs import JsonCodec
from millstream.engine.computation import Computation
from millstream.engine.config import MillstreamConfig
from millstream.engine.context import Context
from millstream.engine.deadletters import decode_dead_letter, default_dead_letter_stream
from millstream.engine.errors import TopologyError
from millstream.engine.keys import key_interval
from millstream.engine.layout import IntervalLayout
from millstream.engine.records import (
    MAX_RECORD_BYTES,
    SINGLE_OBJECT_MARKER,
    Record,
    decode_record,
    encode_record,
    injector_record_id,
)
from millstream.engine.stores.cassandra import CassandraIntervalStore
from millstream.engine.stores.cassandra.schema import ANCHOR_KIND, TIMER_FLOOR_KIND
from millstream.engine.timers import TimeDomain, Timer
from millstream.engine.topology import ComputationOptions, Topology
from millstream.engine.watermarks import WatermarkReport, computation_source, injector_source
from millstream.spark.batch import WORKER_POOL_VARIABLE
from millstream.spark.checkpoint import initial_offsets
from millstream.spark.runner import (
    AvailableNow,
    ProcessingTime,
    RunningTopology,
    Trigger,
    run_topology,
)
from tests.admin_timeouts import AdminTimeouts
from tests.forwarding import LateService
from tests.waiting import InBackground, wait_until

if TYPE_CHECKING:
    from cassandra.cluster import Session
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.integration

JSON = JsonCodec()
INTERVALS = 4
BASE_TIME = 1_700_000_000_000_000
USERS = [f"user-{n}" for n in range(7)]
QUERIES = ["weather", "football", "eclipse", "flu", "tickets"]
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _load_example() -> ModuleType:
    # examples/ is not a package; load the package under its own name, as `millstream run`
    # does from that directory.
    spec = importlib.util.spec_from_file_location(
        "search_pipeline", EXAMPLES / "search_pipeline" / "__init__.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["search_pipeline"] = module
    spec.loader.exec_module(module)
    return module


search_pipeline = _load_example()


@dataclass
class Pipeline:
    """One test's names: streams, computations, keyspace and checkpoint root."""

    suffix: str
    keyspace: str
    checkpoints: Path

    def __getattr__(self, name: str) -> str:
        names: dict[str, str] = search_pipeline.names(self.suffix)
        try:
            return names[name]
        except KeyError:
            raise AttributeError(name) from None

    def topology(self) -> Topology:
        topology: Topology = search_pipeline.pipeline_topology(
            self.suffix, ComputationOptions(key_intervals=INTERVALS)
        )
        return topology


def register_by_value(module: ModuleType) -> None:
    """Ship ``module``'s code with each task: executors cannot import test modules."""
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(module)  # type: ignore[no-untyped-call]


@pytest.fixture
def pipeline(
    services: MillstreamConfig,
    unique: Callable[[str], str],
    cassandra_keyspace: Callable[[], str],
    tmp_path: Path,
    spark: SparkSession,
) -> Iterator[Pipeline]:
    register_by_value(search_pipeline)
    register_by_value(sys.modules[__name__])
    made = Pipeline(unique("p").removeprefix("p_"), cassandra_keyspace(), tmp_path / "checkpoints")
    yield made
    kafka_connector.delete_topics(services, sorted(made.topology().streams()))


def events(count: int, seed: int = 0) -> list[Record]:
    """Search events with IDs from their position; users and queries cycle co-prime."""
    return [
        Record(
            key=f"session-{n % 3}",
            value=json.dumps({"user": USERS[n % 7], "query": QUERIES[(n * 3 + seed) % 5]}).encode(),
            timestamp=BASE_TIME + n,
            record_id=injector_record_id("searches", seed, n),
        )
        for n in range(count)
    ]


def produce(config: MillstreamConfig, topic: str, messages: list[bytes], **settings: Any) -> None:
    producer = kafka_connector.producer(config, **settings)
    for number, message in enumerate(messages):
        producer.produce(topic, key=str(number % 5).encode(), value=message)
    assert producer.flush(30) == 0


def states(session: Session, keyspace: str, computation: str) -> dict[str, Any]:
    """Committed state per key of ``computation``, decoded as JSON, from every interval."""
    found: dict[str, Any] = {}
    for interval in range(INTERVALS):
        rows = session.execute(
            f"SELECT key, value FROM {keyspace}.intervals "
            "WHERE computation = %s AND interval = %s AND kind = 'state'",
            (computation, interval),
        )
        for row in rows:
            assert key_interval(row.key, INTERVALS) == interval
            found[row.key] = JSON.decode(row.value)
    return found


def assert_results(session: Session, pipeline: Pipeline, counted_events: list[Record]) -> None:
    """Both stages' state equals a fold over ``counted_events`` (distinct, all countable)."""
    per_user: Counter[str] = Counter()
    per_query: Counter[str] = Counter()
    for record in counted_events:
        event = json.loads(record.value)
        per_user[event["user"]] += 1
        per_query[event["query"]] += 1
    assert states(session, pipeline.keyspace, pipeline.per_user) == dict(per_user)
    counted = states(session, pipeline.keyspace, pipeline.per_query)
    assert {query: state["count"] for query, state in counted.items()} == dict(per_query)
    ids = [record_id for state in counted.values() for record_id in state["ids"]]
    assert len(ids) == len(set(ids)) == len(counted_events)


def read_topic(config: MillstreamConfig, topic: str) -> list[tuple[int, int, bytes]]:
    """Every committed message of ``topic`` as (partition, offset, value), to its end now
    (offsets have gaps where transaction markers are)."""
    return [
        (message.partition, message.offset, message.value or b"")
        for message in read_messages(config, topic)
    ]


def start(
    pipeline: Pipeline,
    config: MillstreamConfig,
    spark: SparkSession,
    topology: Topology | None = None,
    trigger: Trigger | None = None,
    **settings: Any,
) -> RunningTopology:
    """Run the pipeline's topology in its keyspace; ``settings`` change more RunSettings."""
    run = replace(
        config.run,
        keyspace=pipeline.keyspace,
        checkpoint_root=pipeline.checkpoints,
        create_keyspace=False,
        **settings,
    )
    return run_topology(
        topology or pipeline.topology(), config, run, trigger=trigger or AvailableNow(), spark=spark
    )


def test_two_stages_keyed_differently_count_each_distinct_event_once(
    services: MillstreamConfig, spark: SparkSession, cassandra: Session, pipeline: Pipeline
) -> None:
    distinct = events(300)
    # Every fifth event is delivered twice, as a retrying injector would: some in the same
    # batch, some in a later one.
    repeated = distinct + distinct[::5]
    kafka_connector.create_topics(services, [pipeline.searches], partitions=2)
    produce(services, pipeline.searches, [encode_record(r) for r in repeated[:200]])

    running = start(pipeline, services, spark, max_offsets_per_trigger=120)
    try:
        running.process_available(timeout=300)
        produce(services, pipeline.searches, [encode_record(r) for r in repeated[200:]])
        running.process_available(timeout=300)

        assert_results(cassandra, pipeline, distinct)
        metrics = running.metrics()
        first, second = metrics[pipeline.per_user], metrics[pipeline.per_query]
        assert first.inputs == len(repeated)
        assert (first.processed, first.duplicates) == (len(distinct), len(distinct[::5]))
        assert (first.dead_letters, first.failed_attempts) == (0, 0)
        assert second.processed == len(distinct)
        assert second.duplicates == second.inputs - len(distinct)
        assert first.batches >= 3
        assert first.intervals == first.rescans + first.cache_hits
        # The first batch started where Spark's source started the query (from the
        # checkpoint, not a question to Kafka): the topic's first offsets.
        checkpoint = pipeline.checkpoints / pipeline.topology().name / pipeline.per_user
        assert initial_offsets(checkpoint)[pipeline.searches] == {0: 0, 1: 0}
        # Downstream, deduplicating by record ID, sees one production per distinct event.
        hits = [decode_record(value) for _, _, value in read_topic(services, pipeline.hits)]
        assert len({r.record_id for r in hits}) == len(distinct)
        # The latest report says the same on the watermark topic (the live view reads it
        # there): how far the input was read, and this driver's totals.
        report = latest_report(
            services, computation_source(pipeline.topology().name, pipeline.per_user)
        )
        reader = kafka_connector.consumer(services, "test-ends")
        try:
            ends = kafka_connector.end_offsets(reader, [pipeline.searches])
        finally:
            reader.close()
        assert report.consumed == ends
        assert report.driver
        assert {k: report.stats[k] for k in ("inputs", "processed", "duplicates", "pending")} == {
            "inputs": first.inputs,
            "processed": first.processed,
            "duplicates": first.duplicates,
            "pending": first.pending,  # a level, as of the latest batch: not a sum
        }
        assert report.stats["batches"] == first.batches
        # Every interval's owner: the Python worker of this machine that ran it last.
        owned = sorted(i for intervals in report.workers.values() for i in intervals)
        assert owned == list(range(INTERVALS))
        for worker in report.workers:
            host, pid = worker.rsplit(":", 1)
            assert (host, pid.isdigit()) == (socket.gethostname(), True), worker
    finally:
        running.stop()


def latest_report(config: MillstreamConfig, source: str) -> WatermarkReport:
    """``source``'s latest report on the session's watermark topic."""
    reader = kafka_connector.KafkaWatermarkTopic(config, create=False)
    try:
        found = [m for key, m in reader.read() if key == source]
    finally:
        reader.close()
    reports = [m for m in found if isinstance(m, WatermarkReport)]
    assert reports, f"no report of {source}"
    return max(reports, key=lambda r: r.sequence)


def test_the_driver_aborts_a_transaction_hanging_on_a_stream_its_computations_write(
    services: MillstreamConfig,
    spark: SparkSession,
    pipeline: Pipeline,
    kafka_topic: Callable[..., str],
) -> None:
    running = start(pipeline, services, spark)  # provisions the streams, runs no batch
    try:
        foreign = kafka_topic()
        _, hanging = write_hanging_transaction(services, pipeline.hits, 0)
        write_hanging_transaction(services, foreign, 0)
        [aborted] = running.abort_hanging_transactions()
        assert (aborted.topic, aborted.partition, aborted.start_offset) == (
            pipeline.hits,
            0,
            hanging,
        )
        admin = kafka_connector.admin_client(services)
        offsets = stable_offsets(admin, [pipeline.hits, foreign])
        # Its readers go on past it; a topic none of its computations writes is not its
        # business, and what hangs there stays.
        assert offsets[(pipeline.hits, 0)] == (hanging + 2, hanging + 2)
        assert offsets[(foreign, 0)] == (0, 1)
    finally:
        running.stop()


def test_input_behind_an_open_transaction_is_not_idle_until_the_transaction_ends(
    services: MillstreamConfig, spark: SparkSession, cassandra: Session, pipeline: Pipeline
) -> None:
    """Found by the proving ground: a producer that died mid-transaction on a stream holds
    back what other producers committed there after it (a read_committed reader stops at the
    last stable offset), and a driver that called its input processed then ended a run
    without those records."""
    lots = events(60)
    kafka_connector.create_topics(services, [pipeline.searches], partitions=2)
    settings: dict[str, str | int | bool] = {
        "transactional.id": f"test-open-{pipeline.suffix}",
        "linger.ms": 0,
    }
    dying = kafka_connector.producer(services, **settings)
    dying.init_transactions(30)
    dying.begin_transaction()
    for partition in (0, 1):
        dying.produce(pipeline.searches, value=encode_record(lots[partition]), partition=partition)
    assert dying.flush(30) == 0
    # Committed after the open transaction began: on both partitions, behind it.
    produce(services, pipeline.searches, [encode_record(r) for r in lots[2:]])
    running = start(pipeline, services, spark, trigger=ProcessingTime(0.3))
    try:
        with pytest.raises(TimeoutError):
            running.await_idle(timeout=10)
        assert states(cassandra, pipeline.keyspace, pipeline.per_user) == {}
        dying.commit_transaction(30)
        running.await_idle(timeout=120)
        assert_results(cassandra, pipeline, lots)
    finally:
        running.stop()


def test_bad_input_lands_in_dead_letters_with_its_origin(
    services: MillstreamConfig, spark: SparkSession, cassandra: Session, pipeline: Pipeline
) -> None:
    good = events(60)
    absurd = Record("s", json.dumps({"user": "u", "query": "q"}).encode(), 2**62, b"a" * 16)
    failing = Record(
        "s", json.dumps({"user": "u", "query": "q", "fail": True}).encode(), 5, b"f" * 16
    )
    unkeyable = Record("s", json.dumps({"query": "q"}).encode(), 5, b"k" * 16)
    oversized = Record("s", b"x" * MAX_RECORD_BYTES, 5, b"o" * 16)
    bad = {
        b"not avro at all": "MalformedRecordError",
        SINGLE_OBJECT_MARKER + b"\x01" * 8 + b"\x02body": "UnknownSchemaError",
        encode_record(oversized): "OversizedRecordError",
        encode_record(absurd): "AbsurdTimestampError",
        encode_record(failing): "ValueError",
        encode_record(unkeyable): "KeyError",
    }
    # The failing record is delivered twice: its dead letter is committed with its dedup ID,
    # so the second delivery is a counted duplicate, not a second dead letter.
    messages = [encode_record(r) for r in good[:30]]
    messages += [*bad, encode_record(failing)]
    messages += [encode_record(r) for r in good[30:]]
    kafka_connector.create_topics(
        services, [pipeline.searches], partitions=2, topic_config={"max.message.bytes": "2000000"}
    )
    produce(services, pipeline.searches, messages, **{"message.max.bytes": 2_000_000})

    running = start(pipeline, services, spark)
    try:
        running.process_available(timeout=300)

        assert_results(cassandra, pipeline, good)
        positions: dict[bytes, tuple[int, int]] = {}
        for partition, offset, value in read_topic(services, pipeline.searches):
            positions.setdefault(value, (partition, offset))  # a duplicate's first delivery
        letters = {}
        for _, _, value in read_topic(services, f"{pipeline.per_user}.dead-letters"):
            envelope = decode_record(value)
            letters[envelope.record_id] = decode_dead_letter(envelope.value)
        assert len(letters) == len(bad)
        by_error = {letter.error_type: letter for letter in letters.values()}
        assert set(by_error) == set(bad.values())
        for raw, error_type in bad.items():
            letter = by_error[error_type]
            assert letter.computation == pipeline.per_user
            assert letter.origin.stream == pipeline.searches
            assert (letter.origin.partition, letter.origin.offset) == positions[raw]
            assert letter.raw_size == len(raw)
            assert raw.startswith(letter.raw)
            assert letter.raw == raw or error_type == "OversizedRecordError"
            assert letter.error_message
        assert by_error["ValueError"].origin.record_id == failing.record_id
        assert by_error["KeyError"].origin.record_id == unkeyable.record_id

        first = running.metrics()[pipeline.per_user]
        assert first.inputs == len(messages)
        assert first.rejected == 4  # malformed, unknown schema, oversized, unkeyable
        assert first.duplicates == 1
        assert first.dead_letters == len(bad)
        assert first.inputs == first.processed + first.rejected + first.duplicates
        # Its productions and dead letters went out in committed transactions: nothing left open
        # behind a last stable offset when the driver looked after a batch.
        assert first.transactions > 0
        assert first.stalls == 0
        assert all(b.unstable_messages == 0 for b in running.batches(pipeline.per_user))
    finally:
        running.stop()


def test_a_driver_killed_mid_run_loses_and_duplicates_nothing(
    services: MillstreamConfig, cassandra: Session, pipeline: Pipeline
) -> None:
    distinct = events(360, seed=1)
    kafka_connector.create_topics(services, [pipeline.searches], partitions=2)
    produce(services, pipeline.searches, [encode_record(r) for r in distinct + distinct[::4]])
    command = [
        sys.executable,
        "-m",
        "millstream.cli",
        "run",
        "search_pipeline:topology",
        "--available-now",
        "--max-offsets-per-trigger=40",
        f"--keyspace={pipeline.keyspace}",
        f"--checkpoint-root={pipeline.checkpoints}",
        "--no-create-keyspace",
        "--verbose",  # each batch's log line on stderr, where the kill waits for it
    ]
    env = {
        **os.environ,
        "SEARCH_PIPELINE_SUFFIX": pipeline.suffix,
        "SEARCH_PIPELINE_INTERVALS": str(INTERVALS),
    }

    # First run: killed with SIGKILL right after stage 1 committed its second batch.
    crashed = subprocess.Popen(
        command,
        cwd=EXAMPLES,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: the JVM and Python workers too
    )
    try:
        assert crashed.stderr is not None
        marker = f"computation '{pipeline.per_user}' batch 1:"
        log: list[str] = []
        deadline = time.monotonic() + 180
        for line in crashed.stderr:
            log.append(line)
            if marker in line:
                time.sleep(0.3)  # into the next batch's commits
                os.kill(crashed.pid, signal.SIGKILL)
                break
            assert time.monotonic() < deadline, "".join(log[-30:])
        assert crashed.wait(60) == -signal.SIGKILL, "".join(log[-30:])
    finally:
        # The driver is dead; its JVM and Python workers share its process group.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(crashed.pid, signal.SIGKILL)
        crashed.wait(60)
    counted = sum(states(cassandra, pipeline.keyspace, pipeline.per_user).values())
    assert 0 < counted < len(distinct), "the kill did not land mid-run"

    # Second run: restarts from the same checkpoints and finishes. Spark replays the batch the
    # kill interrupted with the offsets it had planned; the small cap above only served to
    # kill the first run mid-run, so the rest is read in batches as large as they come.
    resumed = [arg for arg in command if not arg.startswith("--max-offsets-per-trigger")]
    finished = subprocess.run(
        resumed, cwd=EXAMPLES, env=env, capture_output=True, text=True, timeout=300
    )
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert_results(cassandra, pipeline, distinct)


class Gate(Computation):
    """Blocks its first call until the test opens the gate, then records who committed."""

    def __init__(self, directory: str, output: str) -> None:
        self.directory = directory
        self.output = output

    def process_record(self, ctx: Context, record: Record) -> None:
        gate = Path(self.directory, "gate")
        first = not gate.exists()
        if first:
            Path(self.directory, "entered").touch()
            deadline = time.monotonic() + 120
            while not gate.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        attempt = "fenced attempt" if first else "retry"
        ctx.state(JSON).set(attempt)
        ctx.produce(self.output, attempt.encode(), record.timestamp)


def test_a_task_whose_interval_was_taken_commits_nothing(
    services: MillstreamConfig,
    spark: SparkSession,
    cassandra: Session,
    pipeline: Pipeline,
    tmp_path: Path,
) -> None:
    topology = Topology(f"zombie_{pipeline.suffix}", streams=[pipeline.searches])
    name = pipeline.per_user
    topology.add_computation(
        name,
        Gate(str(tmp_path), pipeline.hits),
        inputs=[pipeline.searches],
        outputs=[pipeline.hits],
        options=ComputationOptions(key_intervals=1),
    )
    kafka_connector.create_topics(services, [pipeline.searches], partitions=1)
    produce(services, pipeline.searches, [encode_record(events(1)[0])])
    running = start(pipeline, services, spark, topology=topology)
    try:
        worker = InBackground("the batch", lambda: running.process_available(timeout=240))
        try:
            deadline = time.monotonic() + 120
            while not (tmp_path / "entered").exists():
                assert time.monotonic() < deadline, "the task never reached user code"
                running_batch = worker.alive()
                worker.check()
                assert running_batch, "the batch ended before its task reached user code"
                time.sleep(0.1)
            # The task holds sequencer 1 and runs user code; a newer owner takes the interval.
            store = CassandraIntervalStore(cassandra, pipeline.keyspace, SystemClock())
            assert store.acquire(name, 0).token == 2
        finally:
            (tmp_path / "gate").touch()
            worker.join(240)
        assert not worker.alive()
        worker.check()

        (batch,) = running.batches(name)
        assert len(batch.failed_attempts) == 1
        assert "FencedError" in batch.failed_attempts[0]
        assert batch.processed == 1
        # Only the retry (sequencer 3) committed: state and productions are its alone.
        assert store.sequencer(name, 0) == 3
        rows = cassandra.execute(
            f"SELECT key, value FROM {pipeline.keyspace}.intervals "
            "WHERE computation = %s AND interval = 0 AND kind = 'state'",
            (name,),
        )
        assert [JSON.decode(row.value) for row in rows] == ["retry"]
        produced = [decode_record(v).value for _, _, v in read_topic(services, pipeline.hits)]
        assert produced == [b"retry"]
    finally:
        running.stop()


def wait_counted(
    running: RunningTopology, session: Session, pipeline: Pipeline, count: int
) -> None:
    """Supervise ``running`` until stage 1 counted ``count`` events, then until idle."""
    deadline = time.monotonic() + 180
    while sum(states(session, pipeline.keyspace, pipeline.per_user).values()) < count:
        assert time.monotonic() < deadline, f"stage 1 had not counted {count} events"
        running.raise_failure()
        time.sleep(0.2)
    running.await_idle(timeout=120)


@pytest.mark.parametrize("one_query", [False, True], ids=["query-each", "one-query"])
def test_a_driver_takes_its_checkpoint_back_from_a_zombie_and_a_superseded_driver_stops(
    services: MillstreamConfig,
    spark: SparkSession,
    cassandra: Session,
    pipeline: Pipeline,
    one_query: bool,
) -> None:
    """Found by the proving ground: a driver stopped for long (a zombie) came back after its
    successor started and wrote the next entry of a query's offset log first; Spark then
    failed the successor's query, and the successor exited. The driver that holds the
    checkpoint restarts its query instead; a driver whose checkpoint was claimed stops. The
    same holds for a topology run as one query (``one_query``)."""
    from millstream.engine.errors import FencedError
    from millstream.spark.checkpoint import claim_checkpoint

    lots = events(120, seed=2)
    kafka_connector.create_topics(services, [pipeline.searches], partitions=2)
    running = start(pipeline, services, spark, trigger=ProcessingTime(0.5), one_query=one_query)
    try:
        produce(services, pipeline.searches, [encode_record(r) for r in lots[:40]])
        wait_counted(running, cassandra, pipeline, 40)
        checkpoint = running.checkpoint(pipeline.per_user)
        logged = [int(p.name) for p in (checkpoint / "offsets").iterdir() if p.name.isdigit()]
        latest = max(logged)
        assert (checkpoint / "commits" / str(latest)).exists()
        # The zombie resumes and logs the next batch before this driver does.
        zombie = checkpoint / "offsets" / ".zombie"
        zombie.write_bytes((checkpoint / "offsets" / str(latest)).read_bytes())
        os.replace(zombie, checkpoint / "offsets" / str(latest + 1))
        query = running.queries[pipeline.per_user].runId

        produce(services, pipeline.searches, [encode_record(r) for r in lots[40:80]])
        wait_counted(running, cassandra, pipeline, 80)
        assert running.queries[pipeline.per_user].runId != query, "the query never lost a race"
        assert_results(cassandra, pipeline, lots[:80])

        # A successor claims the checkpoint: this driver is the zombie now, and stops.
        claim_checkpoint(checkpoint, "elsewhere:1:successor")
        produce(services, pipeline.searches, [encode_record(r) for r in lots[80:]])
        with pytest.raises(FencedError) as caught:
            running.await_idle(timeout=120)  # stage 1 never catches up: its query stopped
        # It names what stopped: the computation, or every one of a topology's one query.
        stopped, _, rest = str(caught.value).partition(" stopped: ")
        assert rest.startswith("driver elsewhere:1:successor took the query over")
        if one_query:
            assert len(running.topology.computations) > 1
            names = stopped.removeprefix("computations ").removesuffix(
                " (the topology's one query)"
            )
            assert sorted(names.split(", ")) == sorted(map(repr, running.topology.computations))
        else:
            assert stopped == f"computation {pipeline.per_user!r}"
        assert sum(states(cassandra, pipeline.keyspace, pipeline.per_user).values()) == 80
    finally:
        running.stop()


def test_a_topology_in_one_query_counts_each_event_once_and_a_record_passes_every_stage_in_a_batch(
    services: MillstreamConfig, spark: SparkSession, cassandra: Session, pipeline: Pipeline
) -> None:
    """Issue 24: with a query per computation, a record waits for the batch the next query
    is running, then for one of its own; in the topology's one query, each batch works every
    computation, upstream first, and a consumer reads what its upstream just committed in
    the same batch (read ahead of the batch's planned end), not in the next one."""
    distinct = events(300, seed=3)
    repeated = distinct + distinct[::5]
    kafka_connector.create_topics(services, [pipeline.searches], partitions=2)
    produce(services, pipeline.searches, [encode_record(r) for r in repeated[:200]])
    topology = pipeline.topology()
    running = start(pipeline, services, spark, trigger=ProcessingTime(0.2), one_query=True)
    try:
        running.await_idle(timeout=300)
        queries = running.queries
        assert set(queries) == {pipeline.per_user, pipeline.per_query}
        assert len({query.id for query in queries.values()}) == 1
        first_input = {
            name: min(batch.batch_id for batch in running.batches(name) if batch.inputs)
            for name in queries
        }
        assert first_input[pipeline.per_query] == first_input[pipeline.per_user]
        # A batch is one Spark job, whichever of the computations had work in it (its
        # TopologyJob): a job each made a batch as many waves of tasks. A batch whose input
        # was all read ahead by the batch before runs its job and records nothing (no
        # interval was left with work), so the batches that recorded work bound the jobs
        # from below, and the query's batches from above.
        worked = {batch.batch_id for name in queries for batch in running.batches(name)}
        query = next(iter(queries.values()))
        batches = {progress["batchId"] for progress in query.recentProgress}
        jobs = spark.sparkContext.statusTracker().getJobIdsForGroup(str(query.runId))
        assert 1 <= len(worked) <= len(jobs) <= len(batches), (worked, jobs, batches)
        # Its set of computations is the query's: no change while it runs.
        with pytest.raises(TopologyError, match="run in one query"):
            running.remove_computation(pipeline.per_query)
        assert running.active_computations == sorted(queries)
    finally:
        running.stop()
    shared = pipeline.checkpoints / topology.name / "@topology"
    assert running.checkpoint(pipeline.per_user) == shared
    assert (shared / "offsets").is_dir()
    for name in queries:
        assert not (pipeline.checkpoints / topology.name / name / "offsets").exists()

    # A query per computation would start the input again from its beginning: refused.
    with pytest.raises(TopologyError, match="ran in the topology's one query"):
        start(pipeline, services, spark, trigger=ProcessingTime(0.2))
    # Started again as it ran (here on what the topics hold: AvailableNow), it goes on where
    # it stopped, each event counted once.
    produce(services, pipeline.searches, [encode_record(r) for r in repeated[200:]])
    running = start(pipeline, services, spark, one_query=True)
    try:
        running.process_available(timeout=300)
        assert_results(cassandra, pipeline, distinct)
        totals = running.metrics()[pipeline.per_user]
        assert totals.inputs == len(repeated) - 200  # this run read only what came since
    finally:
        running.stop()


def test_computations_are_added_and_removed_while_the_others_keep_running(
    services: MillstreamConfig, spark: SparkSession, cassandra: Session, pipeline: Pipeline
) -> None:
    first, second = events(80), events(60, seed=1)
    kafka_connector.create_topics(services, [pipeline.searches], partitions=2)
    produce(services, pipeline.searches, [encode_record(r) for r in first])
    running = start(pipeline, services, spark, trigger=ProcessingTime(0.5))
    try:
        running.await_idle(timeout=180)
        assert running.active_computations == sorted([pipeline.per_user, pipeline.per_query])

        # Add a third computation (a second consumer of `hits`): it starts from the earliest
        # offsets while the others keep their queries.
        copy = f"{pipeline.per_query}_copy"
        queries_before = running.queries
        running.add_computation(
            copy,
            search_pipeline.CountPerQuery(),
            inputs=[pipeline.hits],
            options=ComputationOptions(key_intervals=INTERVALS),
        )
        running.await_idle(timeout=180)
        assert running.active_computations == sorted([pipeline.per_user, pipeline.per_query, copy])
        for name, query in queries_before.items():
            assert running.queries[name] is query, f"{name} was restarted"
            assert query.isActive
        assert_counts_equal(cassandra, pipeline.keyspace, copy, pipeline.per_query)

        # Remove it again: the others go on with new input, the removed one stops where it was.
        running.remove_computation(copy)
        copy_batches = len(running.batches(copy))
        produce(services, pipeline.searches, [encode_record(r) for r in second])
        running.await_idle(timeout=180)
        assert running.active_computations == sorted([pipeline.per_user, pipeline.per_query])
        assert len(running.batches(copy)) == copy_batches
        assert_results(cassandra, pipeline, first + second)
        copied = states(cassandra, pipeline.keyspace, copy)
        assert sum(state["count"] for state in copied.values()) == len(first)
    finally:
        running.stop()
        # The removed computation's dead-letter stream, which the topology no longer names.
        copied_letters = default_dead_letter_stream(f"{pipeline.per_query}_copy")
        kafka_connector.delete_topics(services, [copied_letters])


class WhereCounted(Computation):
    """Keeps, per key, the Python worker pools and processes its records were processed in,
    and when the first was; passes each record on to ``output`` if given."""

    def __init__(self, output: str | None = None) -> None:
        self.output = output

    def process_record(self, ctx: Context, record: Record) -> None:
        seen = ctx.state(JSON)
        where: dict[str, Any] = seen.get({"pools": [], "pids": []})
        where["pools"] = sorted({*where["pools"], os.environ.get(WORKER_POOL_VARIABLE)})
        where["pids"] = sorted({*where["pids"], os.getpid()})
        where["first"] = min(where.get("first", math.inf), time.time())  # wall time, seconds
        seen.set(where)
        if self.output is not None:
            ctx.produce(self.output, record.value, record.timestamp)


def where_counted_topology(pipeline: Pipeline, prefix: str) -> Topology:
    """Searches counted per user, whose hits are counted per query, each where counted."""
    topology = Topology(f"{prefix}_{pipeline.suffix}", streams=[pipeline.searches])
    options = ComputationOptions(key_intervals=INTERVALS)
    by_user = {pipeline.searches: lambda record: json.loads(record.value)["user"]}
    topology.add_computation(
        pipeline.per_user, WhereCounted(pipeline.hits), inputs=by_user, outputs=[pipeline.hits],
        options=options,
    )  # fmt: skip
    topology.add_computation(
        pipeline.per_query,
        WhereCounted(),
        inputs={pipeline.hits: lambda record: json.loads(record.value)["query"]},
        options=options,
    )
    return topology


def test_each_computation_runs_in_python_workers_of_its_own(
    services: MillstreamConfig, spark: SparkSession, cassandra: Session, pipeline: Pipeline
) -> None:
    topology = where_counted_topology(pipeline, "pools")
    kafka_connector.create_topics(services, [pipeline.searches], partitions=2)
    produce(services, pipeline.searches, [encode_record(r) for r in events(40)])
    running = start(pipeline, services, spark, topology=topology)
    try:
        running.process_available(timeout=300)
    finally:
        running.stop()

    def where(computation: str) -> tuple[set[str | None], set[int]]:
        found = states(cassandra, pipeline.keyspace, computation).values()
        assert found, f"{computation} processed nothing"
        return {p for f in found for p in f["pools"]}, {p for f in found for p in f["pids"]}

    first_pools, first_processes = where(pipeline.per_user)
    second_pools, second_processes = where(pipeline.per_query)
    # Numbered in the topology's order (the first in Spark's default workers), and never a
    # process of the other computation's.
    assert (first_pools, second_pools) == ({None}, {"1"})
    assert not first_processes & second_processes
    assert WORKER_POOL_VARIABLE not in spark.sparkContext.environment


def test_each_computations_first_batch_runs_in_the_python_workers_warmed_as_it_started(
    services: MillstreamConfig,
    spark: SparkSession,
    cassandra: Session,
    pipeline: Pipeline,
    caplog: pytest.LogCaptureFixture,
) -> None:
    topology = where_counted_topology(pipeline, "warmed")
    kafka_connector.create_topics(services, [pipeline.searches], partitions=2)
    produce(services, pipeline.searches, [encode_record(r) for r in events(40)])
    caplog.set_level(logging.INFO, logger="millstream.spark.runner")
    running = start(pipeline, services, spark, topology=topology, trigger=ProcessingTime(0.2))
    try:
        running.await_idle(timeout=180)
    finally:
        running.stop()

    warmed: dict[str, tuple[float, set[int], dict[int, int]]] = {}
    for record in caplog.records:
        if record.name == "millstream.spark.runner" and "warmed in" in record.getMessage():
            name, workers, _, taken = cast(
                "tuple[str, str, float, dict[str, tuple[int, ...]]]", record.args
            )
            pids = {int(worker.rsplit(":", 1)[1]) for worker in workers.split(", ")}
            takers = {i: int(w.rsplit(":", 1)[1]) for w, took in taken.items() for i in took}
            warmed[name] = (record.created, pids, takers)
    assert sorted(warmed) == sorted([pipeline.per_user, pipeline.per_query])
    tasks = min(INTERVALS, spark.sparkContext.defaultParallelism)
    layout = IntervalLayout.initial(INTERVALS)
    store = CassandraIntervalStore(cassandra, pipeline.keyspace, SystemClock())
    for name, (at, pids, takers) in warmed.items():
        # A process a task (they met) before any record, and every record in one of them.
        assert len(pids) == tasks, name
        found = states(cassandra, pipeline.keyspace, name)
        assert found, f"{name} processed nothing"
        assert at < min(where["first"] for where in found.values()), name
        assert {pid for where in found.values() for pid in where["pids"]} <= pids, name
        # Each interval taken by one of them as the query started, its records processed
        # there, under the lease taken then: no batch acquired it again.
        assert sorted(takers) == list(layout.ids), name
        for key, where in found.items():
            assert where["pids"] == [takers[layout.interval_of(key)]], (name, key)
        assert [store.sequencer(name, i) for i in layout.ids] == [1] * INTERVALS, name


def assert_counts_equal(session: Session, keyspace: str, left: str, right: str) -> None:
    counts = [
        {key: state["count"] for key, state in states(session, keyspace, name).items()}
        for name in (left, right)
    ]
    assert counts[0] == counts[1]
    assert counts[0]


# -- low watermarks and timers ---------------------------------------------------------------

WINDOW = 1_000_000  # one second of event time
WINDOW_BASE = (BASE_TIME // WINDOW) * WINDOW


def window_start(window: int) -> int:
    return WINDOW_BASE + window * WINDOW


class WindowCounts(Computation):
    """Stage 1: counts a query's searches per event-time window; once the input low
    watermark passes a window's end, produces its count and forgets it."""

    def __init__(self, output: str) -> None:
        self.output = output

    def process_record(self, ctx: Context, record: Record) -> None:
        window = (record.timestamp - WINDOW_BASE) // WINDOW
        counts = ctx.state(JSON)
        current: dict[str, int] = counts.get({})
        current[str(window)] = current.get(str(window), 0) + 1
        counts.set(current)
        ctx.set_timer(f"w{window}", window_start(window + 1) - 1)

    def process_timer(self, ctx: Context, timer: Timer) -> None:
        window = int(timer.tag.removeprefix("w"))
        counts = ctx.state(JSON)
        current: dict[str, int] = counts.get({})
        count = current.pop(str(window), 0)
        counts.set(current)
        value = {"query": ctx.key, "window": window, "count": count}
        ctx.produce(self.output, json.dumps(value).encode(), timer.timestamp, key=str(window))


def window_of(record: Record) -> str:
    return str(json.loads(record.value)["window"])


class WindowTotals(Computation):
    """Stage 2, keyed by window: sums the per-query counts and produces the window's total
    once its own input low watermark (stage 1's) passes the window's end."""

    def __init__(self, output: str) -> None:
        self.output = output

    def process_record(self, ctx: Context, record: Record) -> None:
        total = ctx.state(JSON)
        total.set(total.get(0) + json.loads(record.value)["count"])
        ctx.set_timer("end", window_start(int(ctx.key) + 1) - 1)

    def process_timer(self, ctx: Context, timer: Timer) -> None:
        total = ctx.state(JSON)
        value = {"window": int(ctx.key), "total": total.get(0), "seen": ctx.input_low_watermark}
        total.clear()
        ctx.produce(self.output, json.dumps(value).encode(), timer.timestamp)


def windowed_topology(pipeline: Pipeline) -> Topology:
    topology = Topology(f"windows_{pipeline.suffix}", streams=[pipeline.searches])
    options = ComputationOptions(key_intervals=INTERVALS)
    topology.add_computation(
        pipeline.per_query,
        WindowCounts(pipeline.hits),
        inputs={pipeline.searches: lambda record: json.loads(record.value)["query"]},
        outputs=[pipeline.hits],
        options=options,
    )
    topology.add_computation(
        pipeline.per_user,
        WindowTotals(f"totals_{pipeline.suffix}"),
        inputs={pipeline.hits: window_of},
        outputs=[f"totals_{pipeline.suffix}"],
        options=options,
    )
    return topology


def search(n: int, window: int) -> Record:
    """A search in ``window``; ``n`` picks its query and makes its ID."""
    value = json.dumps({"user": USERS[n % 7], "query": QUERIES[n % 5]}).encode()
    return Record(f"s{n}", value, window_start(window) + n, injector_record_id("w", 0, n))


def window_counts(events: list[Record]) -> dict[tuple[str, int], int]:
    counts: Counter[tuple[str, int]] = Counter()
    for event in {e.record_id: e for e in events}.values():
        counts[(json.loads(event.value)["query"], (event.timestamp - WINDOW_BASE) // WINDOW)] += 1
    return dict(counts)


def emitted(config: MillstreamConfig, topic: str) -> list[Any]:
    """The values produced to ``topic``, once per record ID (consumers deduplicate)."""
    by_id: dict[bytes, Any] = {}
    for _, _, value in read_topic(config, topic):
        record = decode_record(value)
        by_id[record.record_id] = json.loads(record.value)
    return list(by_id.values())


@dataclass
class WindowsInjector:
    """The injector of the windowed tests' searches: reports their low watermark."""

    source: str
    stream: str
    publisher: kafka_connector.KafkaWatermarkTopic
    offsets: Any

    def report(
        self, watermark: int, sequence: int, *, source: str = "", records: int | None = None
    ) -> None:
        self.publisher.report_streams(
            self.offsets,
            source or self.source,
            [self.stream],
            watermark,
            sequence,
            records=records,
        )

    def retire(self) -> None:
        self.publisher.retire(self.source)


@pytest.fixture
def windows_injector(services: MillstreamConfig, pipeline: Pipeline) -> Iterator[WindowsInjector]:
    """The searches topic (2 partitions) and its injector; removes the totals topic after."""
    kafka_connector.create_topics(services, [pipeline.searches], partitions=2)
    publisher = kafka_connector.KafkaWatermarkTopic(services)
    offsets = kafka_connector.consumer(services, "test-offsets")
    try:
        yield WindowsInjector(
            injector_source(f"test-{pipeline.suffix}"), pipeline.searches, publisher, offsets
        )
    finally:
        offsets.close()
        publisher.close()
        kafka_connector.delete_topics(services, [f"totals_{pipeline.suffix}"])


def test_event_time_timers_fire_as_the_low_watermark_passes_them(
    services: MillstreamConfig,
    spark: SparkSession,
    pipeline: Pipeline,
    windows_injector: WindowsInjector,
) -> None:
    totals = f"totals_{pipeline.suffix}"
    # Windows 0-2, every fourth search delivered twice; the injector then promises
    # nothing older than window 2's start: windows 0 and 1 are complete.
    first = [search(n, n % 3) for n in range(60)]
    produce(services, pipeline.searches, [encode_record(r) for r in first + first[::4]])
    windows_injector.report(window_start(2), 1)

    running = start(pipeline, services, spark, topology=windowed_topology(pipeline))
    running.process_available(timeout=300)

    expected = window_counts(first)
    counted = {(v["query"], v["window"]): v["count"] for v in emitted(services, pipeline.hits)}
    assert counted == {k: n for k, n in expected.items() if k[1] < 2}
    window_totals = {v["window"]: v for v in emitted(services, totals)}
    assert {w: v["total"] for w, v in window_totals.items()} == {0: 20, 1: 20}
    # Stage 2 fired on stage 1's watermark, which its pending window-2 timers held.
    assert all(v["seen"] == window_start(2) for v in window_totals.values())
    assert running.input_watermark(pipeline.per_query) == window_start(2)
    assert running.input_watermark(pipeline.per_user) == window_start(2)
    (hold,) = running.holds(pipeline.per_user)
    assert hold.source == computation_source(f"windows_{pipeline.suffix}", pipeline.per_query)
    assert running.metrics()[pipeline.per_query].late == 0

    # Window 3 arrives with a straggler for window 0, which is now late; the injector
    # then moves past everything.
    second = [search(n, 3) for n in range(60, 75)]
    straggler = search(75, 0)
    produce(services, pipeline.searches, [encode_record(r) for r in [*second, straggler]])
    windows_injector.report(window_start(4), 2)
    running.process_available(timeout=300)

    counted_again = [
        (v["query"], v["window"], v["count"]) for v in emitted(services, pipeline.hits)
    ]
    expected = window_counts(first + second)
    on_time = sorted((q, w, n) for (q, w), n in expected.items())
    late = (json.loads(straggler.value)["query"], 0, 1)
    assert sorted(counted_again) == sorted([*on_time, late])
    assert running.metrics()[pipeline.per_query].late == 1
    assert running.input_watermark(pipeline.per_user) == window_start(4)
    running.stop()

    # Restart after the injector retired: nobody reports `searches` now, yet the input
    # low watermark does not go back (the computation's own last report restores it).
    windows_injector.retire()
    produce(services, pipeline.searches, [encode_record(search(76, 4))])
    restarted = start(pipeline, services, spark, topology=windowed_topology(pipeline))
    restarted.process_available(timeout=300)
    assert restarted.input_watermark(pipeline.per_query) == window_start(4)
    (hold,) = restarted.holds(pipeline.per_query)
    assert hold.reason == "no source reports this stream"
    assert restarted.metrics()[pipeline.per_query].late == 0
    restarted.stop()


def test_a_percentile_watermark_fires_past_a_straggler_whose_records_go_to_a_late_stream(
    services: MillstreamConfig,
    spark: SparkSession,
    pipeline: Pipeline,
    windows_injector: WindowsInjector,
) -> None:
    late_stream = f"late_{pipeline.suffix}"
    topology = Topology(f"percentile_{pipeline.suffix}", streams=[pipeline.searches])
    topology.add_computation(
        pipeline.per_query,
        WindowCounts(pipeline.hits),
        inputs={pipeline.searches: lambda record: json.loads(record.value)["query"]},
        outputs=[pipeline.hits],
        options=ComputationOptions(
            key_intervals=INTERVALS, watermark_percentile=99.0, late_stream=late_stream
        ),
    )
    straggler = f"{windows_injector.source}-straggler"
    first = [search(n, n % 3) for n in range(60)]
    produce(services, pipeline.searches, [encode_record(r) for r in first])
    # The straggler, with 0.1 % of the records, still at window 0; the others past window 1.
    windows_injector.report(window_start(0), 1, source=straggler, records=10)
    windows_injector.report(window_start(2), 1, records=10_000)
    try:
        running = start(pipeline, services, spark, topology=topology)
        running.process_available(timeout=300)
        # The exact watermark waits for the straggler; the 99th percentile does not.
        assert running.input_watermark(pipeline.per_query) == window_start(0)
        counted = {(v["query"], v["window"]): v["count"] for v in emitted(services, pipeline.hits)}
        assert counted == {k: n for k, n in window_counts(first).items() if k[1] < 2}

        # The straggler's record for window 0 is late: it goes to the late stream as it came,
        # exactly once, and (process_late) is counted again in a window of its own.
        behind = search(75, 0)
        produce(services, pipeline.searches, [encode_record(behind)] * 2)
        windows_injector.report(window_start(2), 2, source=straggler, records=11)
        running.process_available(timeout=300)
        late_topic = kafka_connector.stream_topic(late_stream)
        late = [decode_record(value) for _, _, value in read_topic(services, late_topic)]
        assert {r.record_id: r for r in late} == {behind.record_id: behind}
        assert running.metrics()[pipeline.per_query].late == 1
        late_count = (json.loads(behind.value)["query"], 0, 1)
        hits = [(v["query"], v["window"], v["count"]) for v in emitted(services, pipeline.hits)]
        assert late_count in hits
        running.stop()
    finally:
        windows_injector.publisher.retire(straggler)
        kafka_connector.delete_topics(services, [kafka_connector.stream_topic(late_stream)])


class QueryTally(Computation):
    """Counts searches per query in state, with no timer of its own."""

    def process_record(self, ctx: Context, record: Record) -> None:
        count = ctx.state(JSON)
        count.set(count.get(0) + 1)


def test_state_expires_by_event_time_and_leaves_no_row_of_the_key(
    services: MillstreamConfig,
    spark: SparkSession,
    cassandra: Session,
    pipeline: Pipeline,
    windows_injector: WindowsInjector,
) -> None:
    topology = Topology(f"ttl_{pipeline.suffix}", streams=[pipeline.searches])
    topology.add_computation(
        pipeline.per_query,
        QueryTally(),
        inputs={pipeline.searches: lambda record: json.loads(record.value)["query"]},
        outputs=[],
        options=ComputationOptions(key_intervals=INTERVALS, state_ttl=WINDOW),
    )
    # Window 0 for every query; then window 2 for two of them, which renews theirs.
    first = [search(n, 0) for n in range(10)]
    produce(services, pipeline.searches, [encode_record(r) for r in first])
    windows_injector.report(window_start(1), 1)
    running = start(pipeline, services, spark, topology=topology)
    running.process_available(timeout=300)
    assert states(cassandra, pipeline.keyspace, pipeline.per_query) == dict.fromkeys(QUERIES, 2)

    renewed = [search(n, 2) for n in (10, 11)]  # weather, football
    produce(services, pipeline.searches, [encode_record(r) for r in renewed])
    windows_injector.report(window_start(2) + 100, 2)  # past window 0's updates + TTL
    running.process_available(timeout=300)
    assert states(cassandra, pipeline.keyspace, pipeline.per_query) == {
        "weather": 3,
        "football": 3,
    }
    assert running.metrics()[pipeline.per_query].expired == 3

    windows_injector.report(window_start(4), 3)
    running.process_available(timeout=300)
    running.stop()
    # Nothing of any key is left: no state, no timer, no index entry (dedup IDs age out);
    # only the partition's anchor row and the timer floor its commits kept, no key's.
    for interval in range(INTERVALS):
        rows = cassandra.execute(
            f"SELECT kind, key FROM {pipeline.keyspace}.intervals "
            "WHERE computation = %s AND interval = %s",
            (pipeline.per_query, interval),
        )
        kept = [(r.kind, r.key) for r in rows if not r.kind.startswith("dedup")]
        assert kept in ([(ANCHOR_KIND, "")], [(ANCHOR_KIND, ""), (TIMER_FLOOR_KIND, "")])


def test_a_hot_interval_splits_between_batches_and_every_key_keeps_its_exact_count(
    services: MillstreamConfig, spark: SparkSession, cassandra: Session, pipeline: Pipeline
) -> None:
    from millstream.engine.keys import key_interval
    from millstream.engine.rebalance import RebalancePolicy
    from millstream.engine.stores.cassandra import CassandraIntervalStore

    topology = Topology(f"skew_{pipeline.suffix}", streams=[pipeline.searches])
    policy = RebalancePolicy(split_records=60, max_intervals=6)
    topology.add_computation(
        pipeline.per_user,
        QueryTally(),
        inputs=[pipeline.searches],
        outputs=[],
        options=ComputationOptions(key_intervals=2, rebalance=policy),
    )
    # Skewed: 9 of 10 records on keys of interval 0's hash range, the rest on interval 1's.
    hot = [k for k in (f"hot-{n}" for n in range(400)) if key_interval(k, 2) == 0][:40]
    cold = [k for k in (f"cold-{n}" for n in range(400)) if key_interval(k, 2) == 1][:5]
    records = [
        Record(
            hot[n % 40] if n % 10 else cold[n % 5],
            b"",
            BASE_TIME + n,
            injector_record_id("skew", 0, n),
        )
        for n in range(1_200)
    ]
    kafka_connector.create_topics(services, [pipeline.searches], partitions=2)
    running = start(pipeline, services, spark, topology=topology, max_offsets_per_trigger=150)
    for chunk in range(4):
        part = records[chunk * 300 : (chunk + 1) * 300]
        # Every seventh record twice: the repeats of split intervals' keys are dropped too.
        produce(services, pipeline.searches, [encode_record(r) for r in part + part[::7]])
        running.process_available(timeout=300)
    metrics = running.metrics()[pipeline.per_user]
    live = running.layout(pipeline.per_user)
    running.stop()

    store = CassandraIntervalStore(cassandra, pipeline.keyspace, SystemClock())
    layout = store.read_layout(pipeline.per_user)
    assert layout is not None
    assert layout.change is None
    assert live == layout
    assert len(layout.ids) > 2  # the hot interval split (maybe more than once)
    assert 0 not in layout.ids  # the hot one is retired
    counted: dict[str, int] = {}
    for interval in layout.ids:
        rows = cassandra.execute(
            f"SELECT key, value FROM {pipeline.keyspace}.intervals "
            "WHERE computation = %s AND interval = %s AND kind = 'state'",
            (pipeline.per_user, interval),
        )
        for row in rows:
            assert layout.interval_of(row.key) == interval
            counted[row.key] = JSON.decode(row.value)
    assert counted == dict(Counter(r.key for r in records))
    assert metrics.duplicates == sum(len(records[c * 300 : (c + 1) * 300][::7]) for c in range(4))


def test_a_report_alone_wakes_the_consumers_of_its_streams_and_no_other_query(
    services: MillstreamConfig,
    spark: SparkSession,
    pipeline: Pipeline,
    windows_injector: WindowsInjector,
) -> None:
    totals = f"totals_{pipeline.suffix}"
    topology = windowed_topology(pipeline)
    running = start(pipeline, services, spark, topology=topology, trigger=ProcessingTime(0.3))
    try:
        first = [search(n, n % 2) for n in range(40)]
        produce(services, pipeline.searches, [encode_record(r) for r in first])
        running.await_idle(timeout=120)
        assert emitted(services, pipeline.hits) == []  # no report yet: no window is complete

        # Input is idle now; only the injector's report comes, and it alone must start the
        # batches that fire the timers of both stages.
        windows_injector.report(window_start(2), 1)
        deadline = time.monotonic() + 90
        while len(emitted(services, totals)) < 2:
            running.raise_failure()
            assert time.monotonic() < deadline, "the report did not wake the idle queries"
            time.sleep(0.5)
        assert {v["window"]: v["total"] for v in emitted(services, totals)} == {0: 20, 1: 20}

        # Each query reads its data topics and the wake-ups of its inputs and its alarms:
        # neither the watermark topic nor the wake topics of its own outputs.
        for spec in topology.computations.values():
            progress = running.queries[spec.name].lastProgress
            assert progress is not None
            (source,) = progress["sources"]
            read = source["description"]
            assert services.kafka_watermark_topic + "," not in read + ","
            for output in spec.outputs:
                assert kafka_connector.wake_topic(services, output) not in read
            for stream in spec.inputs:
                assert kafka_connector.wake_topic(services, stream.stream) in read
    finally:
        running.stop()


def searches_to_hits(
    pipeline: Pipeline, name: str, computation: Computation, options: ComputationOptions
) -> Topology:
    """Topology ``<name>_<suffix>``: ``computation`` as ``pipeline.per_user``, from the
    searches to the hits."""
    topology = Topology(f"{name}_{pipeline.suffix}", streams=[pipeline.searches])
    topology.add_computation(
        pipeline.per_user,
        computation,
        inputs=[pipeline.searches],
        outputs=[pipeline.hits],
        options=options,
    )
    return topology


class WallClockReminder(Computation):
    """Sets a wall-time timer a moment ahead; produces when it fires."""

    def __init__(self, output: str) -> None:
        self.output = output

    def process_record(self, ctx: Context, record: Record) -> None:
        # Far enough ahead that the batches this record starts are over by then.
        ctx.set_timer("remind", ctx.clock.now() + 6_000_000, TimeDomain.WALL_TIME)

    def process_timer(self, ctx: Context, timer: Timer) -> None:
        ctx.produce(self.output, b'"reminded"', BASE_TIME)


def test_a_wall_time_timer_fires_without_further_input(
    services: MillstreamConfig, spark: SparkSession, pipeline: Pipeline
) -> None:
    topology = searches_to_hits(
        pipeline, "alarm", WallClockReminder(pipeline.hits), ComputationOptions(key_intervals=2)
    )
    kafka_connector.create_topics(services, [pipeline.searches], partitions=1)
    running = start(pipeline, services, spark, topology, trigger=ProcessingTime(0.5))
    try:
        produce(services, pipeline.searches, [encode_record(events(1)[0])])
        deadline = time.monotonic() + 60
        while not sum(b.fired_timers for b in running.batches()):
            running.raise_failure()
            assert time.monotonic() < deadline, "the wall-time timer never fired"
            time.sleep(0.5)
        assert emitted(services, pipeline.hits) == ["reminded"]
        assert sum(b.fired_timers for b in running.batches()) == 1
    finally:
        running.stop()


class SlowCount(Computation):
    """Spends a while on each record, so that a batch is still running when the run stops."""

    def __init__(self, output: str) -> None:
        self.output = output

    def process_record(self, ctx: Context, record: Record) -> None:
        time.sleep(0.05)
        ctx.produce(self.output, b"counted", record.timestamp)


@pytest.mark.parametrize("one_query", [False, True], ids=["query-each", "one-query"])
def test_a_run_stopped_mid_batch_does_not_retry_the_cancelled_batch(
    services: MillstreamConfig,
    spark: SparkSession,
    pipeline: Pipeline,
    caplog: pytest.LogCaptureFixture,
    one_query: bool,
) -> None:
    options = ComputationOptions(key_intervals=2)
    topology = searches_to_hits(pipeline, "slow", SlowCount(pipeline.hits), options)
    if one_query:
        # Two computations: the query's batch runs their jobs from threads of its own.
        topology.add_computation(
            pipeline.per_query,
            SlowCount(pipeline.hits),
            inputs=[pipeline.searches],
            outputs=[pipeline.hits],
            options=options,
        )
    kafka_connector.create_topics(services, [pipeline.searches], partitions=1)
    produce(services, pipeline.searches, [encode_record(event) for event in events(200)])
    running = start(
        pipeline, services, spark, topology, trigger=ProcessingTime(0.5), one_query=one_query
    )
    try:
        # 200 records at 50 ms each keep the first batch's interval tasks busy for seconds.
        queries = list({id(q): q for q in running.queries.values()}.values())
        tracker = spark.sparkContext.statusTracker()

        def batch_jobs() -> set[int]:
            """The queries' jobs running now (a query's run ID is its jobs' group), not
            the job warming the Python workers as a query starts."""
            groups = {j for q in queries for j in tracker.getJobIdsForGroup(str(q.runId))}
            return groups & set(tracker.getActiveJobsIds())

        deadline = time.monotonic() + 60
        while not batch_jobs():
            running.raise_failure()
            assert time.monotonic() < deadline, "the first batch never started its job"
            time.sleep(0.1)
        time.sleep(1.0)
        assert not running.batches(), "the first batch ended before the stop"
    finally:
        with caplog.at_level(logging.INFO, logger="millstream.spark.batch"):
            running.stop()
    # Spark cancelled the batch's jobs as the query stopped (those its threads ran too): no
    # attempt was retried, and no computation finished the batch.
    retried = [r.getMessage() for r in caplog.records if "retrying" in r.getMessage()]
    assert retried == []
    assert running.batches() == []
    assert spark.sparkContext.statusTracker().getActiveJobsIds() == []
    # And Spark took the batch's failure for the stop it was: a query whose failure it does
    # not recognise as an interruption keeps its last status (its check of a cancelled job's
    # whole Py4J error overflowed the stack of the query's thread).
    assert [(q.status["message"], q.exception()) for q in queries] == [("Stopped", None)] * len(
        queries
    )


class ManyWindows(Computation):
    """One timer per record's window; each firing produces the window's number."""

    def __init__(self, output: str) -> None:
        self.output = output

    def process_record(self, ctx: Context, record: Record) -> None:
        window = (record.timestamp - WINDOW_BASE) // WINDOW
        ctx.set_timer(f"w{window}", window_start(window + 1) - 1)

    def process_timer(self, ctx: Context, timer: Timer) -> None:
        ctx.produce(self.output, timer.tag.removeprefix("w").encode(), timer.timestamp)


def test_due_timers_beyond_one_batchs_firing_cap_fire_without_further_input(
    services: MillstreamConfig,
    spark: SparkSession,
    pipeline: Pipeline,
    windows_injector: WindowsInjector,
) -> None:
    """A key with more due timers than ``max_timer_firings_per_key`` fires them over several
    batches, though no input or report comes after the first (regression: the rest waited
    for input that a finished replay never sends)."""
    topology = searches_to_hits(
        pipeline,
        "capped",
        ManyWindows(pipeline.hits),
        ComputationOptions(key_intervals=1, max_timer_firings_per_key=3),
    )
    one_key = [
        Record("q", b"", window_start(w), injector_record_id("capped", 0, w)) for w in range(10)
    ]
    produce(services, pipeline.searches, [encode_record(r) for r in one_key])
    windows_injector.report(window_start(20), 1)
    running = start(pipeline, services, spark, topology, trigger=ProcessingTime(0.5))
    try:
        deadline = time.monotonic() + 120
        while sum(b.fired_timers for b in running.batches()) < 10:
            running.raise_failure()
            assert time.monotonic() < deadline, (
                f"fired {sum(b.fired_timers for b in running.batches())} of 10 timers"
            )
            time.sleep(0.5)
        assert max(b.fired_timers for b in running.batches()) <= 3
        windows = sorted(
            int(decode_record(v).value) for _, _, v in read_topic(services, pipeline.hits)
        )
        assert windows == list(range(10))
    finally:
        running.stop()


def test_millstream_run_serves_prometheus_metrics_of_computations_and_injectors(
    services: MillstreamConfig,
    pipeline: Pipeline,
    windows_injector: WindowsInjector,
    tmp_path: Path,
) -> None:
    from tests.connectors.test_prometheus import Samples, free_port, scrape

    distinct = events(120, seed=2)
    repeated = distinct + distinct[::4]
    produce(services, pipeline.searches, [encode_record(r) for r in repeated])
    promised = BASE_TIME + 10_000  # after every event
    windows_injector.report(promised, 1)
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "millstream.cli",
        "run",
        "search_pipeline:topology",
        "--processing-time=0.5",
        f"--metrics-port={port}",
        f"--keyspace={pipeline.keyspace}",
        f"--checkpoint-root={pipeline.checkpoints}",
        "--no-create-keyspace",
    ]
    env = {
        **os.environ,
        "SEARCH_PIPELINE_SUFFIX": pipeline.suffix,
        "SEARCH_PIPELINE_INTERVALS": str(INTERVALS),
    }
    topology = pipeline.topology().name
    per_user = {"topology": topology, "computation": pipeline.per_user}
    per_query = {"topology": topology, "computation": pipeline.per_query}
    injector = {"topology": topology, "injector": f"test-{pipeline.suffix}", "process": "0"}
    log = tmp_path / "driver.log"
    with log.open("w") as stderr:
        driver = subprocess.Popen(
            command,
            cwd=EXAMPLES,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,  # its own process group: the JVM and Python workers too
        )
    try:
        samples: Samples | None = None
        deadline = time.monotonic() + 240
        while not (
            samples is not None
            and samples.get("millstream_records_processed_total", **per_query) == len(distinct)
            and samples.get("millstream_watermark_lag_seconds", **per_query) is not None
            and samples.get("millstream_injector_watermark_timestamp_seconds", **injector)
        ):
            assert driver.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
            with contextlib.suppress(OSError):  # not serving yet: the driver is starting
                samples = scrape(f"http://127.0.0.1:{port}/metrics")
        now = SystemClock().now()
        assert samples is not None

        assert samples["millstream_records_in_total", per_user] == len(repeated)
        assert samples["millstream_records_processed_total", per_user] == len(distinct)
        assert samples["millstream_duplicates_total", per_user] == len(repeated) - len(distinct)
        assert samples["millstream_dead_letters_total", per_user] == 0
        in_second = samples["millstream_records_in_total", per_query]
        assert in_second - samples["millstream_duplicates_total", per_query] == len(distinct)
        for labels in (per_user, per_query):
            assert samples["millstream_batch_seconds_count", labels] >= 1
            assert samples["millstream_batches_total", labels] >= 1
            assert 0 <= samples["millstream_cache_hit_ratio", labels] <= 1
            # Where the batches' time went, step by step, from the tasks' own clocks.
            for step in ("routing", "reads", "user_code", "commit"):
                assert samples["millstream_step_seconds_total", {**labels, "step": step}] > 0
                assert samples["millstream_step_cpu_seconds_total", {**labels, "step": step}] > 0
        assert samples["millstream_input_watermark_timestamp_seconds", per_user] == promised / 1e6
        lag = samples["millstream_watermark_lag_seconds", per_user]
        assert lag == pytest.approx((now - promised) / 1e6, abs=60)
        assert samples["millstream_injector_watermark_timestamp_seconds", injector] == (
            promised / 1e6
        )
        assert samples["millstream_injector_watermark_lag_seconds", injector] == pytest.approx(
            lag, abs=60
        )

        os.kill(driver.pid, signal.SIGINT)
        assert driver.wait(120) == 130, log.read_text()[-3000:]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(driver.pid, signal.SIGKILL)
        driver.wait(60)


class Idle(Computation):
    def process_record(self, ctx: Context, record: Record) -> None:
        pass


class Echo(Computation):
    """Produces each record's key."""

    def __init__(self, output: str) -> None:
        self.output = output

    def process_record(self, ctx: Context, record: Record) -> None:
        ctx.produce(self.output, ctx.key.encode(), record.timestamp)


def test_a_computation_without_a_count_runs_an_interval_per_core_of_the_job(
    services: MillstreamConfig, spark: SparkSession, cassandra: Session, pipeline: Pipeline
) -> None:
    cores = spark.sparkContext.defaultParallelism
    topology = searches_to_hits(pipeline, "cores", Echo(pipeline.hits), ComputationOptions())
    sent = events(40)
    kafka_connector.create_topics(services, [pipeline.searches], partitions=2)
    produce(services, pipeline.searches, [encode_record(r) for r in sent])
    running = start(pipeline, services, spark, topology=topology)
    try:
        assert running.layout(pipeline.per_user) == IntervalLayout.initial(cores)  # not run yet
        running.process_available(timeout=300)
        assert running.layout(pipeline.per_user) == IntervalLayout.initial(cores)
    finally:
        running.stop()
    store = CassandraIntervalStore(cassandra, pipeline.keyspace, SystemClock())
    assert store.read_layout(pipeline.per_user) == IntervalLayout.initial(cores)
    produced = Counter(decode_record(v).value for _, _, v in read_topic(services, pipeline.hits))
    assert produced == Counter(r.key.encode() for r in sent)


def test_a_topology_started_while_cassandra_does_not_answer_starts_once_it_does(
    services: MillstreamConfig,
    spark: SparkSession,
    cassandra: Session,
    cassandra_keyspace: Callable[[], str],
    unique: Callable[[str], str],
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
) -> None:
    """As a supervisor restarts a driver while Cassandra restarts too: its start waits,
    saying where it looked for Cassandra, and provisions once Cassandra answers."""
    name = unique("late")
    topology = Topology(name, streams=[f"{name}-in"])
    topology.add_computation("c", Idle(), inputs=[f"{name}-in"], outputs=[f"{name}-out"])
    caplog.set_level("WARNING", logger="millstream.engine.outages")
    try:
        with LateService((services.cassandra_hosts[0], services.cassandra_port)) as late:
            config = replace(services, cassandra_port=late.port)
            settings = replace(
                config.run, keyspace=cassandra_keyspace(), checkpoint_root=tmp_path / "c"
            )
            running = RunningTopology(
                topology, config, settings, trigger=AvailableNow(), spark=spark
            )

            def waits() -> list[str]:
                return [m for m in caplog.messages if f"{name!r} starting: waiting" in m]

            starting = InBackground("the start", running.start)
            try:
                wait_until(
                    "the start to wait for Cassandra",
                    lambda: len(waits()) >= 2,
                    30.0,
                    meanwhile=starting.check,
                )
                assert starting.alive()
                late.open()
                starting.join(60)
                assert not starting.alive(), "the start did not end once Cassandra answered"
                starting.check()
            finally:
                running.stop()
        assert f"Cassandra at 127.0.0.1:{late.port} (connection refused)" in waits()[0]
        # Provisioned once Cassandra answered: its table and the streams' topics.
        tables = cassandra.execute(
            "SELECT table_name FROM system_schema.tables WHERE keyspace_name = %s",
            [settings.keyspace],
        )
        assert settings.table in {row.table_name for row in tables}
        topics = kafka_connector.admin_client(services).list_topics(timeout=10).topics
        assert {f"{name}-in", f"{name}-out"} <= set(topics)
    finally:
        kafka_connector.delete_topics(services, sorted(topology.streams()))


def test_a_driver_whose_kafka_stops_answering_after_provisioning_starts_once_it_answers(
    services: MillstreamConfig,
    spark: SparkSession,
    cassandra_keyspace: Callable[[], str],
    unique: Callable[[str], str],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
) -> None:
    """As a supervisor restarts a driver while a broker dies: provisioning went through, then
    Kafka's admin requests time out as the query starts (its wake topics). The start waits
    them out, saying it waits for Kafka, instead of failing."""
    name = unique("admin")
    topology = Topology(name, streams=[f"{name}-in"])
    topology.add_computation("c", Idle(), inputs=[f"{name}-in"], outputs=[f"{name}-out"])
    timeouts = AdminTimeouts(monkeypatch, "millstream.spark.runner")
    caplog.set_level("WARNING", logger="millstream.engine.outages")
    settings = replace(services.run, keyspace=cassandra_keyspace(), checkpoint_root=tmp_path / "c")
    try:
        with RunningTopology(
            topology, services, settings, trigger=ProcessingTime(0.2), spark=spark
        ) as running:
            running.start()
            assert running.active_computations == ["c"]
        assert timeouts.left == 0
        waits = [m for m in caplog.messages if "computation 'c' starting: waiting for Kafka (" in m]
        assert len(waits) == 2, caplog.messages
    finally:
        kafka_connector.delete_topics(services, sorted(topology.streams()))
