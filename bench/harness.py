"""What the benchmarks share: injecting events, watching outputs, timing Spark queries.

Not a benchmark itself. The scripts in ``bench/`` run as ``python bench/<script>.py`` and import
this module as ``bench.harness`` (each puts the repository root on ``sys.path`` first).
Nothing in here runs on Spark executors: code that does lives in the scripts themselves, which
Spark ships by value, while this module would have to be importable on every executor.
"""

from __future__ import annotations

import json
import os
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final

from confluent_kafka import OFFSET_BEGINNING, Consumer, Message, TopicPartition

from millstream.connectors import cassandra as cassandra_connector
from millstream.connectors import kafka as kafka_connector
from millstream.devtools.local.stack import LocalStack
from millstream.engine.clock import Clock, SystemClock
from millstream.engine.config import MillstreamConfig
from millstream.engine.records import Record, decode_record, injector_record_id
from millstream.injectors import InjectorStats, Poll, Position, Source, SourceRecord
from millstream.injectors.connect import connect_injector
from millstream.injectors.process import InjectorOptions
from millstream.spark.session import kafka_options, kafka_stream

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

# Output topics timestamped by the broker, so a message's timestamp is its append time.
APPEND_TIME_TOPIC = {"message.timestamp.type": "LogAppendTime"}


def percentile(values: list[float], q: int) -> float:
    """The ``q``-th percentile (1..99) of ``values``, inclusive method."""
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def percentiles(values: list[float]) -> str:
    if not values:
        return "no samples"
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return f"p50 {cuts[49]:7.1f}  p95 {cuts[94]:7.1f}  p99 {cuts[98]:7.1f} ms (n={len(values)})"


def event_key(n: int) -> str:
    return f"e{n}"


def event_id_value(record_id: bytes) -> bytes:
    return record_id


# Events per poll of an unpaced injector: enough that the per-poll acknowledgement wait,
# checkpoint and report cost a backlog little next to building its records.
EVENTS_PER_POLL = 5_000


class GeneratedEvents(Source):
    """Events ``first`` up to ``first + count`` of injector ``injector``'s ``stream``.

    Event ``n`` is keyed ``key_of(n)``, valued ``value_of(its record ID)`` (origin: the
    stream, offset ``n``) and timestamped when a poll reads it (µs of ``clock``). With
    ``rate`` (events/s) they come due at that pace from the first poll on, and a poll returns
    those due, sleeping at most its timeout for the next one; without, all are due at once. A
    poll returns at most ``per_poll`` events. The position is the next number (a checkpoint
    past ``first`` resumes there), the watermark the newest timestamp + 1.

    The input is never *exhausted*: that would report the end of time, and the events that
    later phases of a benchmark inject into the same stream would all be late. A phase ends
    when :attr:`done`, and the next continues the numbering with ``first`` at this one's end.
    """

    def __init__(
        self,
        injector: str,
        stream: str,
        count: int,
        rate: float | None = None,
        *,
        first: int = 0,
        key_of: Callable[[int], str] = event_key,
        value_of: Callable[[bytes], bytes] = event_id_value,
        per_poll: int = EVENTS_PER_POLL,
        clock: Clock | None = None,
    ) -> None:
        if count < 0 or first < 0 or per_poll < 1 or (rate is not None and rate <= 0):
            raise ValueError("count and first must be non-negative, per_poll and rate positive")
        self.injector = injector
        self.stream = stream
        self.streams = (stream,)
        self.end = first + count
        self.rate = rate
        self.first = first
        self.key_of = key_of
        self.value_of = value_of
        self.per_poll = per_poll
        self.clock = clock or SystemClock()
        self.next = first
        self._pace: tuple[float, int] | None = None  # (monotonic s, number) of the first poll

    @property
    def done(self) -> bool:
        """Whether every event was read."""
        return self.next >= self.end

    def open(self, position: Position | None) -> None:
        self.next = self.first if position is None else max(self.first, int(position["next"]))
        self._pace = None

    def poll(self, timeout: float) -> Poll:
        end = min(self.end, self.next + self.per_poll)
        if self.rate is not None and end > self.next:
            if self._pace is None:
                self._pace = (time.monotonic(), self.next)
            since, base = self._pace
            wait = since + (self.next - base) / self.rate - time.monotonic()
            if wait > 0:
                time.sleep(min(wait, timeout))
            end = min(end, base + int((time.monotonic() - since) * self.rate) + 1)
        if end <= self.next:
            return Poll()
        now = self.clock.now()
        records = [
            SourceRecord(
                self.stream,
                self.key_of(n),
                self.value_of(injector_record_id(self.injector, self.stream, n)),
                now,
                self.stream,
                n,
            )
            for n in range(self.next, end)
        ]
        self.next = end
        return Poll(records, position={"next": end}, watermark=now + 1)


@dataclass(frozen=True, slots=True)
class Injection:
    """What :func:`inject_events` did: its first poll's ``time.monotonic()``, the seconds from
    then until Kafka acknowledged the last event, and the process's counters."""

    started: float
    seconds: float
    stats: InjectorStats

    @property
    def rate(self) -> float:
        """Events per second."""
        return self.stats.emitted / self.seconds if self.seconds > 0 else float("inf")


def inject_events(
    config: MillstreamConfig,
    stream: str,
    count: int,
    rate: float | None,
    *,
    keyspace: str,
    first: int = 0,
    name: str | None = None,
    key_of: Callable[[int], str] = event_key,
    value_of: Callable[[bytes], bytes] = event_id_value,
    options: InjectorOptions | None = None,
    on_start: Callable[[], None] | None = None,
) -> Injection:
    """Runs injector ``name`` (default: the stream's name) over :class:`GeneratedEvents`
    until Kafka acknowledged them all; its checkpoint lives in ``keyspace`` (created if
    missing) and its dead letters on ``<name>.dead-letters``. Like every injector it reports
    its watermark as it checkpoints (``options``, default :class:`InjectorOptions`'s):
    harmless to consumers that ignore the watermark topic (the floors and the peers), so every
    system reads input injected the same way. Calls for later phases of one stream continue
    the numbering (``first``) with the same ``name``. ``on_start`` is called once the
    injector has started, just before its first poll."""
    name = name or stream
    source = GeneratedEvents(
        name, stream, count, rate, first=first, key_of=key_of, value_of=value_of
    )
    settings = replace(config.run, keyspace=keyspace)
    with connect_injector(config, name, source, options, settings=settings) as injector:
        try:
            injector.start()
            if on_start is not None:
                on_start()
            started = time.monotonic()
            while not source.done:
                injector.step()
            injector.flush()  # the last polls' checkpoint and report: a later phase resumes there
            return Injection(started, time.monotonic() - started, injector.stats)
        finally:
            source.close()


def read_times(
    config: MillstreamConfig,
    topic: str,
    expect: int,
    timeout: float,
    time_of: Callable[[Message, Record], int],
) -> dict[bytes, int]:
    """For each distinct event named in ``topic``'s records: ``time_of`` its first record (ms).

    Every stage's value starts with the event's ID (the floor copies the envelope).
    """
    consumer = kafka_connector.consumer(config, "bench")
    consumer.subscribe([topic])
    times: dict[bytes, int] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(times) < expect and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None or message.error() is not None:
                continue
            value = message.value()
            assert value is not None
            record = decode_record(value)
            times.setdefault(record.value[:16], time_of(message, record))
    finally:
        consumer.close()
    return times


def append_time(message: Message, record: Record) -> int:
    """The message's Kafka timestamp (ms): a stage's output time. It is the broker's append
    time on topics created with :data:`APPEND_TIME_TOPIC`, else the producer's send time."""
    return int(message.timestamp()[1])


def injection_time(message: Message, record: Record) -> int:
    """The event time the injector stamped (ms): when the event entered the pipeline."""
    return record.timestamp // 1_000


def latencies(later: dict[bytes, int], earlier: dict[bytes, int]) -> list[float]:
    return [float(t - earlier[k]) for k, t in later.items() if k in earlier]


def wait_for(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {timeout} s")
        time.sleep(0.2)


@dataclass(frozen=True, slots=True)
class Output:
    """One message seen on an output topic."""

    key: bytes | None
    value: bytes
    timestamp: int  # ms: the append time on topics created with APPEND_TIME_TOPIC
    seen: float = 0.0  # ms: when the read_committed watcher received it (wall clock)


class OutputWatcher:
    """Reads an output topic from its beginning on a thread of its own, as a downstream
    consumer would (``read_committed``: a transactional writer's records count once its
    transaction commits), and notes when each count of messages was reached.

    The thread keeps the consumer's messages as they come and makes them :class:`Output`
    only when :attr:`messages` is read, after the measured drain: made as they came, they
    took the cores the measured row runs on (a 200,000-record drain's benchmark and driver
    CPU fell from 0.9 to 0.5 s with this, about 2 µs a message)."""

    def __init__(self, config: MillstreamConfig, topic: str, partitions: int) -> None:
        self._outputs: list[Output] = []
        self._arrived: list[tuple[list[Message], float]] = []  # not made Outputs yet
        self._count = 0
        self._seen: list[tuple[int, float]] = []  # (messages so far, wall time), growing
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._failure: BaseException | None = None
        settings: dict[str, str | int | bool] = {
            "isolation.level": "read_committed",
            "fetch.wait.max.ms": 10,
        }
        self._consumer = kafka_connector.consumer(config, "bench-watch", **settings)
        self._consumer.assign(
            [TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)]
        )
        self._thread = threading.Thread(target=self._run, name=f"watch-{topic}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                batch = self._consumer.consume(num_messages=10_000, timeout=0.05)
                now = time.time()
                fresh = [m for m in batch if m.error() is None]
                if fresh:
                    with self._lock:
                        self._arrived.append((fresh, now))
                        self._count += len(fresh)
                        self._seen.append((self._count, now))
        except BaseException as exc:
            self._failure = exc

    @property
    def messages(self) -> list[Output]:
        """Every message seen so far, in the order seen."""
        with self._lock:
            arrived, self._arrived = self._arrived, []
            for batch, now in arrived:
                self._outputs.extend(
                    Output(m.key(), m.value() or b"", int(m.timestamp()[1]), now * 1_000)
                    for m in batch
                )
            return self._outputs

    def count(self) -> int:
        with self._lock:
            return self._count

    def reached(self, count: int) -> float | None:
        """When (wall clock) the watcher had seen ``count`` messages; ``None``: not yet."""
        with self._lock:
            for seen, at in self._seen:
                if seen >= count:
                    return at
        return None

    def wait(self, count: int, timeout: float, check: Callable[[], None] | None = None) -> float:
        """Block until ``count`` messages were seen; returns when. ``check`` runs while
        waiting, to raise a failure of whatever is supposed to produce them."""
        deadline = time.monotonic() + timeout
        while True:
            at = self.reached(count)
            if at is not None:
                return at
            if self._failure is not None:
                raise RuntimeError("the output watcher failed") from self._failure
            if check is not None:
                check()
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"only {self.count()} of {count} output records arrived within {timeout} s"
                )
            time.sleep(0.02)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._consumer.close()


def create_topic_pair(
    config: MillstreamConfig, source: str, sink: str, partitions: int = 2
) -> None:
    """An input topic, and an output topic whose timestamps are append times."""
    kafka_connector.create_topics(config, [source], partitions=partitions)
    kafka_connector.create_topics(
        config, [sink], partitions=partitions, topic_config=APPEND_TIME_TOPIC
    )


def topics_containing(config: MillstreamConfig, fragment: str) -> list[str]:
    """Every topic whose name contains ``fragment`` (for cleaning up after a run)."""
    metadata = kafka_connector.admin_client(config).list_topics(timeout=30)
    return sorted(name for name in metadata.topics if fragment in name)


def delete_topics_containing(config: MillstreamConfig, fragment: str) -> None:
    kafka_connector.delete_topics(config, topics_containing(config, fragment))


def drop_keyspace(config: MillstreamConfig, keyspace: str) -> None:
    cluster, session = cassandra_connector.connect(config)
    try:
        cassandra_connector.drop_keyspace(session, keyspace)
    finally:
        cluster.shutdown()


def settle_compactions(
    config: MillstreamConfig, timeout: float = 60.0, quiet: float = 0.3
) -> float:
    """Wait until the Cassandra node has run no compaction for ``quiet`` seconds (its
    ``system_views.sstable_tasks`` empty), at most ``timeout``; the seconds waited.

    A measured run starts after it, so that none pays for what the one before left: a DROP
    flushes ``system.paxos``, whose Leveled compaction then rewrites the whole table on one
    of the two cores, for a second or more while the node has kept much Paxos state."""
    cluster, session = cassandra_connector.connect(config)
    began = time.monotonic()
    try:
        quiet_since: float | None = None
        while (now := time.monotonic()) - began < timeout:
            if session.execute("SELECT task_id FROM system_views.sstable_tasks").one() is None:
                quiet_since = now if quiet_since is None else quiet_since
                if now - quiet_since >= quiet:
                    break
            else:
                quiet_since = None
            time.sleep(0.05)
        return time.monotonic() - began
    finally:
        cluster.shutdown()


def unique_suffix() -> str:
    return uuid.uuid4().hex[:8]


# -- Spark queries ---------------------------------------------------------------------------


def floor_query(
    spark: SparkSession,
    config: MillstreamConfig,
    source: str,
    sink: str,
    checkpoint: str,
    trigger_seconds: float,
    *,
    further: Sequence[str] = (),
) -> StreamingQuery:
    """Spark alone: Kafka → ``foreachBatch`` → Kafka, copying each record's key and value and
    doing nothing else (no state, at-least-once).

    ``further`` topics make the query a pipeline of its own: it reads ``source`` and every
    topic of ``further`` but the last, and each batch forwards what it read of each to the
    next one (``source`` to ``further[0]``, and so on), in one write (the Kafka sink's
    ``topic`` column); the last of ``further`` is the pipeline's output, and ``sink`` is
    then its first stage's."""
    from pyspark.sql import functions as F  # noqa: N812  (pyspark's convention)

    connection = kafka_options(config)
    streams = [source, sink, *further]
    inputs = streams[:-1]

    def forward(batch: DataFrame, batch_id: int) -> None:
        if not further:
            batch.select("key", "value").write.format("kafka").options(**connection).option(
                "topic", sink
            ).save()
            return
        topic = F.lit(None).cast("string")
        for stage, stream in enumerate(inputs):
            topic = F.when(F.col("topic") == stream, F.lit(streams[stage + 1])).otherwise(topic)
        batch.select("key", "value", topic.alias("topic")).write.format("kafka").options(
            **connection
        ).save()

    return (
        kafka_stream(spark, config, inputs)
        .writeStream.foreachBatch(forward)
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime=f"{trigger_seconds} seconds")
        .start()
    )


def query_end_offsets(query: StreamingQuery) -> dict[str, dict[int, int]]:
    """The Kafka offsets up to which ``query`` has finished batches (its latest progress)."""
    progress = query.lastProgress
    ends: dict[str, dict[int, int]] = {}
    for source in progress.sources if progress is not None else []:
        end: Any = source.endOffset
        if isinstance(end, str):
            end = json.loads(end)
        for topic, partitions in (end or {}).items():
            ends.setdefault(topic, {}).update({int(p): int(o) for p, o in partitions.items()})
    return ends


def caught_up(query: StreamingQuery, reader: Consumer, topics: Iterable[str]) -> bool:
    """Whether ``query`` has processed everything ``topics`` hold (raises its failure)."""
    failure = query.exception() if not query.isActive else None
    if failure is not None:
        raise failure
    done = query_end_offsets(query)
    ends = kafka_connector.end_offsets(reader, list(topics))
    return all(
        done.get(topic, {}).get(p, 0) >= end
        for topic, partitions in ends.items()
        for p, end in partitions.items()
    )


def first_data_batch_start(query: StreamingQuery, topic: str | None = None) -> float | None:
    """When (wall clock, s) the query's first micro-batch that read any rows started: the
    trigger time of its progress report. ``None`` if no such batch is among the recent ones.

    With ``topic``, a batch read rows if its offsets of ``topic`` moved: millstream's tasks
    read their batch from Kafka themselves, so Spark counts no input rows for its queries."""
    for progress in query.recentProgress:
        moved = topic is not None and any(
            _offsets(source.startOffset, topic) != _offsets(source.endOffset, topic)
            for source in progress.sources
        )
        if progress.numInputRows > 0 or moved:
            return datetime.fromisoformat(progress.timestamp).timestamp()
    return None


def _offsets(offsets: Any, topic: str) -> dict[str, int]:
    """A source's offsets of ``topic`` from a progress report (JSON text, or parsed)."""
    if isinstance(offsets, str):
        offsets = json.loads(offsets)
    return dict((offsets or {}).get(topic, {}))


# One of these in the daemon's and its forked workers' command line: Spark's own daemon, or
# millstream's (millstream.spark.daemon), which a session of millstream's runs.
_PYTHON_WORKERS = (b"pyspark.daemon", b"millstream.spark.daemon")


def _python_worker(command: bytes) -> bool:
    # A whole argument (``-m <module>``): the JVM's command line names the daemon's module
    # too, inside ``spark.python.daemon.module=...`` among its ``--conf`` arguments.
    return any(module in _PYTHON_WORKERS for module in command.split(b"\0"))


def _descendants() -> dict[int, bytes]:
    """The command lines of this process's descendants, by pid (from /proc: Linux only;
    elsewhere the answer is empty)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", encoding="ascii") as stat:
                    parents[int(entry)] = int(stat.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue  # gone meanwhile
    descendants = {os.getpid()}
    grew = True
    while grew:
        found = {pid for pid, parent in parents.items() if parent in descendants}
        grew = not found <= descendants
        descendants |= found
    commands = {}
    for pid in descendants - {os.getpid()}:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as command:
                commands[pid] = command.read()
        except OSError:
            continue
    return commands


def python_workers() -> list[int]:
    """The pids of the Spark Python workers this process started (and of their daemon).

    Spark's Python workers are forked by its Python daemon (``pyspark.daemon``, or
    ``millstream.spark.daemon`` in millstream's session), a child of the JVM that pyspark
    started from this process; they are found among this process's descendants in /proc
    (Linux only; elsewhere the answer is empty). The JVM's own command line names pyspark
    too (its classpath), so they are told by the daemon's module name.
    """
    return [pid for pid, command in _descendants().items() if _python_worker(command)]


def process_cpu(pid: int) -> float | None:
    """CPU seconds (user + system) of ``pid`` so far; None if it is gone (or not Linux)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def python_worker_cpu() -> dict[int, float]:
    """CPU seconds (user + system) so far of each Spark Python worker this process started
    (:func:`python_workers`)."""
    cpu: dict[int, float] = {}
    for pid in python_workers():
        used = process_cpu(pid)
        if used is not None:
            cpu[pid] = used
    return cpu


CoreUse = dict[tuple[str, int], float]
"""CPU seconds so far of each process a row runs on, by (role, pid): :func:`core_use`."""

_DESCENDANT_ROLES: Final = ("Spark JVM", "Python workers", "others")


def stack_services(config: MillstreamConfig) -> dict[str, int]:
    """The pids of the local stack's nodes running for ``config`` (none if the services run
    elsewhere), by service name: what :func:`core_use` reads besides this process."""
    stack = LocalStack(config, lambda _: None)
    return {
        service.name: pid
        for service in stack.services
        if (pid := service.process.running_pid()) is not None
    }


def core_use(services: Mapping[str, int]) -> CoreUse:
    """CPU seconds so far of everything a row runs on, by role and pid: each of ``services``
    (name to pid: the local stack's Cassandra and Kafka), this process (the benchmark, and for
    Spark rows the driver's Python side), and its descendants: the Spark JVM, the Spark
    Python workers, and anything else (a peer's process, py-spy)."""
    use = {(name, pid): process_cpu(pid) or 0.0 for name, pid in services.items()}
    use["bench+driver", os.getpid()] = process_cpu(os.getpid()) or 0.0
    for pid, command in _descendants().items():
        role = (
            "Python workers"
            if _python_worker(command)
            else "Spark JVM"
            if command.split(b"\0", 1)[0].endswith(b"java")
            else "others"
        )
        use[role, pid] = process_cpu(pid) or 0.0
    return use


def role_use(before: CoreUse, after: CoreUse) -> dict[str, float]:
    """CPU seconds each role used between two readings of :func:`core_use`: a process counts
    from its first reading (from zero if it started since); one that ended between them is
    missed, never counted against its role."""
    used: dict[str, float] = {}
    for role, _ in after:
        if role not in _DESCENDANT_ROLES:
            used.setdefault(role, 0.0)
    used.update(dict.fromkeys(_DESCENDANT_ROLES, 0.0))
    for (role, pid), cpu in after.items():
        used[role] += cpu - before.get((role, pid), 0.0)
    return used


def core_note(before: CoreUse, after: CoreUse, seconds: float) -> str:
    """Where the machine's cores went in a window: each role's cores busy on average (CPU
    seconds over wall seconds), and what is left of the machine's cores."""
    busy = {role: cpu / seconds for role, cpu in role_use(before, after).items()}
    # A process that ended in the window is missed (a peer that exited), so "idle" can
    # overstate.
    parts = ", ".join(f"{role} {cores:.2f}" for role, cores in busy.items() if cores >= 0.005)
    idle = (os.cpu_count() or 1) - sum(busy.values())
    return f"cores busy over {seconds:.1f} s: {parts}; idle {max(idle, 0.0):.2f}"


def cpu_seconds(before: CoreUse, after: CoreUse) -> float:
    """The CPU seconds every process of :func:`core_use` used between two readings (see
    :func:`role_use`)."""
    return sum(role_use(before, after).values())


def cpu_note(before: dict[int, float], after: dict[int, float], seconds: float) -> str:
    """Per Python worker busy in a window: CPU seconds and share of the window's wall time."""
    used = {pid: after[pid] - before.get(pid, 0.0) for pid in after}
    busy = sorted(((cpu, pid) for pid, cpu in used.items() if cpu >= 0.05), reverse=True)
    if not busy:
        return "Python workers: no CPU measured"
    parts = ", ".join(f"{cpu:.1f} s ({cpu / seconds:.0%})" for cpu, _ in busy)
    return f"Python workers' CPU over {seconds:.1f} s: {parts}"
