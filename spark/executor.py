"""The executor side of the Spark runner: reading and routing a micro-batch, and working its
key intervals.

:mod:`millstream.spark.batch` runs each batch as one Spark job of one stage,
``sparkContext.parallelize(range(tasks), tasks).mapPartitionsWithIndex(``
:func:`batch_task` ``)``: task ``n`` (one per core, partition ``n``)

1. reads the batch's offset ranges straight from Kafka
   (:func:`~millstream.connectors.stream_reader.read_ranges`, this process's consumer), never
   through the batch's DataFrame: a shuffle of routed rows cost a second stage and two
   crossings between the JVM and Python per record;
2. routes every message (:func:`message_router`): decodes it, applies the consumer's key
   extractor *of the stream (topic) the message came from*, and finds its key interval. A
   message that cannot be made a delivery (oversized, undecodable, unknown schema, failing
   or non-``str`` key extractor, a tombstone the computation does not take) becomes a
   :class:`~millstream.engine.protocol.Rejected` in the interval of the empty key, with its
   raw bytes and the genuine exception; a tombstone the computation takes
   (``ComputationOptions.tombstones``) becomes the deletion of its Kafka message key;
3. keeps the messages of the intervals that are its share (:class:`IntervalSlots`: whole
   intervals, spread evenly or as the driver assigned them; in local mode the share its
   process worked last, :func:`claim_slot`), adds its share of the batch's
   *ticks* (intervals that run without input, for their due timers and unacknowledged
   productions), and runs each interval's :class:`~millstream.engine.protocol.IntervalWorker`
   on its inputs in (stream, partition, offset) order, ``config.executor_interval_threads``
   at once, against a :class:`~millstream.engine.stores.cassandra.CassandraIntervalStore`
   and a :class:`~millstream.connectors.kafka.KafkaProductionSink`.

Every task decodes the whole batch to find its share (a key extractor is user code: only it
says where a record goes). It returns one row of counts per interval, which the driver
collects as the batch's metrics, with what the interval has left to do (its
:class:`~millstream.engine.watermarks.IntervalProgress`), which the driver needs for
watermarks.

**Per-process cache.** Spark reuses Python worker processes across tasks
(``spark.python.worker.reuse``, on by default), so each process keeps, at module level, one
Cassandra session, one store, one Kafka producer per set of endpoints, and the
``IntervalWorker`` of every (computation run, interval) it has worked on (a
:class:`~millstream.engine.worker_pool.WorkerPool`), sharing one
:class:`~millstream.engine.cache.StateCache` bounded by ``config.executor_cache_bytes``. A
worker's soft state (cached key state and timers, pending productions) is reused exactly when
the sequencer says nobody else acquired the interval since this process's last batch on it
(``BatchResult.rescanned`` is false); a batch of the interval that ran in another process, or
a retried task, makes the next batch here start over, reading only what it touches. Workers
are keyed by the computation's *run token* (fresh whenever a runner adds the computation, kept
across restarts of its query), so a computation removed and declared again never reuses
workers of the earlier declaration.

**Garbage collection.** A worker keeps many long-lived objects (its connections, the state
cache, the dedup filters) and makes several short-lived ones per record (records,
productions, statement rows). With Python's default thresholds the cyclic collector ran every
700 net allocations and scanned them: about a sixth of a worker's CPU on a keyed count. The
first task of a process freezes what it holds by then (its imported modules and classes: no
later collection scans them) and sets the youngest generation's threshold to
``config.executor_gc_threshold`` (:func:`tune_collector`).

**A pipeline in one query.** In a topology's one query (``RunSettings.one_query``) a batch is
one Spark job whose task ``n`` works share ``n`` of every computation
(:func:`topology_task`), upstream first: the computations whose inputs no other computation of
the job writes run first, all at once, then those they write to, and so on. A part that runs
after a part of the same task that wrote to its input topics reads those topics past the
batch's planned end, up to what is committed at that moment (their last stable offsets,
:func:`committed_ends_from_kafka`): the records its upstream just made, in this task and in
any other whose transaction has committed. Before it reads, it waits up to
:data:`SETTLE_SECONDS` for the transactions open on those topics as it asks (most often the
upstream's, in the tasks still running it) to be decided (:func:`settled_ends`), so that it
takes their records too rather than leave them to the next batch. So a pipeline's record
passes every stage in the batch that read it, as MillWheel hands a production to its
consumer, where it would otherwise wait a batch a stage. Each interval that ran remembers,
in its process, how far it read ahead (by the computation's run token, interval and stream
partition: an interval ID never changes its key range); the next batch's planned ranges hold
those records again, and each interval leaves out the ones below its mark, running only if
something is left (or it has a tick). Nothing depends on the marks for exactly-once: a
record read again elsewhere (a retried task, another process, a restarted driver) is a
duplicate its dedup ID drops.

**Failures.** Whatever the worker raises (``FencedError``, an unresolved unknown outcome, a
store or Kafka outage) fails the task: the interval's commit either applied completely for a
key or not at all, the worker forgets its soft state, and the driver re-runs the batch
(see :mod:`millstream.spark.runner`). A quarantined message
(:mod:`millstream.spark.quarantine`) is rejected undecoded, with its
:class:`~millstream.engine.errors.PoisonRecordError`. The fault points ``executor.task`` and
``executor.record`` (:mod:`millstream.engine.fault_points`) cost one test per task and one
per interval unset.
"""

from __future__ import annotations

import gc
import os
import socket
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence, Set
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from millstream.connectors.kafka import stream_topic
from millstream.connectors.stream_reader import (
    InputMessage,
    learn_topics,
    range_reader,
    read_ranges,
)
from millstream.engine.cache import StateCache
from millstream.engine.clock import SystemClock
from millstream.engine.config import MillstreamConfig
from millstream.engine.deadletters import Origin, stream_origin
from millstream.engine.errors import FencedError, PoisonRecordError
from millstream.engine.fault_points import armed_faults, fault_point
from millstream.engine.layout import IntervalLayout
from millstream.engine.protocol import (
    Delivery,
    Rejected,
    make_delivery,
    thread_step_clock,
)
from millstream.engine.records import envelope_key, envelope_key_bytes
from millstream.engine.routing import (
    decode_delivery,
    decode_tombstone,
    interval_of,
    rejected_interval,
)
from millstream.engine.topology import ComputationSpec, record_key
from millstream.engine.worker_pool import WorkerPool
from millstream.spark.isolation import OffsetRange, Position, count
from millstream.spark.metrics import RESULT_SCHEMA, ROUTING, ResultRow, interval_counts

if TYPE_CHECKING:
    from millstream.connectors.kafka import KafkaProductionSink, KafkaTransactionalSink

__all__ = [
    "HAND_OFF_MOST_OFFSETS",
    "KEPT_ENDPOINTS",
    "RESULT_SCHEMA",
    "SETTLE_SECONDS",
    "WARM_MEET_SECONDS",
    "BatchInput",
    "BatchTask",
    "EndOffsets",
    "IntervalSlots",
    "Reader",
    "Routed",
    "Skip",
    "TaskSettings",
    "WarmTask",
    "batch_task",
    "claim_slot",
    "clear_process_cache",
    "committed_ends_from_kafka",
    "decode_delivery",
    "meet_workers",
    "message_router",
    "read_from_kafka",
    "route_task",
    "settled_ends",
    "topology_task",
    "tune_collector",
    "upstream_first",
]


class IntervalSlots:
    """Which of a batch's ``tasks`` works each key interval: ``assignment[i]``, else
    ``i mod tasks``, whole intervals."""

    def __init__(self, tasks: int, assignment: Mapping[int, int] | None = None) -> None:
        self.tasks = tasks
        self.assignment = dict(assignment or {})

    def task_of(self, interval: int) -> int:
        return self.assignment.get(interval, interval % self.tasks)


@dataclass(frozen=True, slots=True)
class BatchInput:
    """What the tasks of a batch (or of a sub-run of it) read and run: the offset ranges of
    its data topics, the intervals that run even without input (``ticks``: due timers,
    unacknowledged productions), which task works each interval, and the quarantined
    messages (:mod:`millstream.spark.quarantine`) by position, each with its
    :class:`~millstream.engine.errors.PoisonRecordError` message."""

    ranges: tuple[OffsetRange, ...]
    ticks: tuple[int, ...]
    slots: IntervalSlots
    quarantine: Mapping[Position, str]
    claims: str | None = None
    """A directory of this job's own that every task sees (local mode: one machine), where
    each task claims the share its process worked in the computation's last batch
    (:func:`claim_slot`); ``None``: task ``n`` works share ``n``."""
    ends: Mapping[tuple[str, int], int] = field(default_factory=dict)
    """The batch's planned end of every partition of the computation's data topics, by
    (topic, partition), empty ranges included: where a read ahead of the batch begins."""


_HOST: Final = socket.gethostname()


@dataclass(frozen=True, slots=True)
class TaskSettings:
    """What an executor needs besides the computation: endpoints, store table, run token."""

    config: MillstreamConfig
    keyspace: str
    table: str
    run_token: str
    transaction_namespace: str  # connectors.kafka.store_namespace, resolved by the driver

    @property
    def endpoints(self) -> tuple[str, tuple[str, ...], int, str, str]:
        config = self.config
        return (
            config.kafka_bootstrap,
            config.cassandra_hosts,
            config.cassandra_port,
            self.keyspace,
            self.table,
        )


@dataclass
class _Resources:
    """One process's connections to one set of endpoints, its interval workers, and the
    threads that work a task's intervals at once."""

    cluster: Any
    sink: KafkaProductionSink
    transactions: KafkaTransactionalSink
    workers: WorkerPool
    threads: ThreadPoolExecutor
    reader: Any = None  # the consumer of the batches' ranges, made at the first read
    admin: Any = None  # the Kafka admin client of read-ahead's end offsets, made at first use
    # How far each interval read its topics past a batch's planned end (see the module
    # docstring): (run token, computation, interval) -> {(stream, partition): end offset}.
    read_ahead: dict[tuple[str, str, int], dict[tuple[str, int], int]] = field(default_factory=dict)
    # The topics whose metadata the reader asked for (read_ranges's known_topics).
    reader_topics: set[str] = field(default_factory=set)
    # Per partition, a last stable offset a read-ahead gave up waiting at (settled_ends).
    stuck_at: dict[tuple[str, int], int] = field(default_factory=dict)


WARM_MEET_SECONDS: Final = 5.0
"""How long a task of the job that warms a computation's Python workers (:class:`WarmTask`)
waits for the job's other tasks to run in processes of their own."""

_READ_TIMEOUT: Final = 30.0
"""Seconds a task's read of its batch may make no progress before Kafka counts as down."""

SETTLE_SECONDS: Final = 0.1
"""How long a read-ahead waits at most for the transactions open on its topics as it looks
(:func:`settled_ends`). Those are most often its upstream's in the job's other tasks, still
committing what they made: in the benchmark's three-stage pipeline in one query at 200
events/s on 2 cores, two read-aheads in five found one open and waited 5 to 20 ms for it,
where without the wait its records waited a batch; a further stage's p95 was 194 to 260 ms
against 271 to 394 without (p50 within the runs' spread). A transaction left open longer is
waited for once per process and partition."""
_SETTLE_POLL: Final = 0.005
"""Seconds between two asks for the last stable offsets while a read-ahead waits."""

_CACHE: dict[tuple[str, tuple[str, ...], int, str, str], _Resources] = {}
"""By endpoints, the most recently used last."""

KEPT_ENDPOINTS: Final = 2
"""How many sets of endpoints (a store table, with its Kafka and Cassandra) a process keeps
connections and workers for: the table it serves and the one before. A Python worker
outlives the topologies it serves; kept for every table it ever served, their Cassandra
sessions, caches, producers and threads added up and each batch ran slower than the last (a
benchmark making a keyspace per run fell from 25,700 to 15,100 records/s in ten runs; with
four kept it settled near 21,000, with two or one near 26,000)."""


_COLLECTOR_TUNED = False


def tune_collector(threshold: int) -> bool:
    """In this process, once: freeze the objects it holds and collect the youngest generation
    every ``threshold`` net allocations (the older ones as often as before, relative to it).
    ``0`` leaves Python's collector as it is. Whether this call changed it."""
    global _COLLECTOR_TUNED
    if _COLLECTOR_TUNED or threshold == 0:
        return False
    _COLLECTOR_TUNED = True
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(threshold, older, oldest)
    return True


def clear_process_cache() -> None:
    """Drop this process's cached workers and close its connections (tests, shutdown)."""
    while _CACHE:
        _close(_CACHE.popitem()[1])


def _close(resources: _Resources) -> None:
    resources.threads.shutdown()
    if resources.reader is not None:
        resources.reader.close()
    resources.transactions.close()
    resources.sink.close()
    resources.cluster.shutdown()


def _resources(settings: TaskSettings) -> _Resources:
    """This process's connections and workers for ``settings``' endpoints: made at first
    use, kept for the :data:`KEPT_ENDPOINTS` most recently used endpoints. Those least
    recently used beyond are closed; a Python worker runs one task at a time, so none of them
    is in use."""
    resources = _CACHE.pop(settings.endpoints, None)
    if resources is not None:
        _CACHE[settings.endpoints] = resources  # now the most recently used
    else:
        while len(_CACHE) >= KEPT_ENDPOINTS:
            _close(_CACHE.pop(next(iter(_CACHE))))
        # Imported here: the driver imports this module without needing the drivers loaded.
        from millstream.connectors.cassandra import connect
        from millstream.connectors.kafka import KafkaProductionSink, KafkaTransactionalSink
        from millstream.engine.stores.cassandra import CassandraIntervalStore

        tune_collector(settings.config.executor_gc_threshold)
        cluster, session = connect(settings.config)
        try:
            store = CassandraIntervalStore(
                session, settings.keyspace, SystemClock(), table=settings.table
            )
            sink = KafkaProductionSink(settings.config)
            transactions = KafkaTransactionalSink(settings.config, settings.transaction_namespace)
        except BaseException:
            cluster.shutdown()
            raise
        workers = WorkerPool(
            store,
            sink,
            SystemClock(),
            cache=StateCache(settings.config.executor_cache_bytes),
            # Held while user code runs: one computation call at a time per process.
            user_code=threading.Lock(),
            transactions=transactions,
        )
        resources = _Resources(
            cluster,
            sink,
            transactions,
            workers,
            ThreadPoolExecutor(
                settings.config.executor_interval_threads, thread_name_prefix="millstream-interval"
            ),
        )
        _CACHE[settings.endpoints] = resources
    return resources


# Per computation run token: the share of the intervals this process worked last.
_LAST_SLOT: dict[str, int] = {}
# Per computation run token and share: the intervals this process ran in its last batch,
# whose leases its next batch checks while it reads its input (_lease_checks).
_LAST_RAN: dict[tuple[str, int], frozenset[int]] = {}


def claim_slot(claims: str, task: int, slots: int, run_token: str) -> int:
    """The share of a batch's intervals (its slot) task ``task`` works, claimed in the job's
    directory ``claims``: the slot this process worked in the computation's last batch if no
    other task claimed it first, else the lowest free one; a second attempt of the task
    takes the slot its first attempt claimed.

    Spark hands a batch's tasks to whichever of its Python workers is idle, so with slot
    ``n`` for task ``n`` an interval moved to the other process in about half the batches,
    where it found its cache invalid and its transactional producer fenced: a rescan and a
    reopen, 100 ms and more. A claim is a file made with ``O_EXCL``, so two tasks never hold
    one slot, and as there are as many slots as tasks, every slot is claimed."""
    os.makedirs(claims, exist_ok=True)
    mine = str(task)
    for name in sorted(os.listdir(claims)):
        with open(os.path.join(claims, name)) as claimed:
            if claimed.read() == mine:
                return int(name)
    for slot in chain((_LAST_SLOT.get(run_token, task % slots),), range(slots)):
        if _made(os.path.join(claims, str(slot)), mine):
            _LAST_SLOT[run_token] = slot
            return slot
    raise RuntimeError(
        f"task {task} found all {slots} slots of {claims} claimed: more tasks than slots"
    )


def _made(path: str, content: str) -> bool:
    """Whether this call made the file ``path`` (with ``content``); false if it existed."""
    try:
        with open(path, "x") as made:  # exclusive creation: O_CREAT | O_EXCL
            made.write(content)
    except FileExistsError:
        return False
    return True


Routed = tuple[int, Delivery | Rejected]
"""A message routed: its key interval and what the interval's worker takes of it."""


def message_router(
    spec: ComputationSpec,
    layout: IntervalLayout | None = None,
    quarantine: Mapping[Position, str] | None = None,
) -> Callable[[InputMessage], Routed]:
    """The function that decodes, keys and routes each message of ``spec``'s input to an
    interval of ``layout`` (default: those the computation starts with).

    Every message yields one input: a :class:`Delivery` (a record under the consumer's key,
    or the deletion a tombstone the computation takes names), or a :class:`Rejected`
    (oversized, undecodable, unknown schema, failing or non-``str`` key extractor, a
    tombstone the computation does not take), carrying its raw bytes and the genuine
    exception. ``quarantine`` maps the (topic, partition, offset) of each quarantined message
    to its :class:`~millstream.engine.errors.PoisonRecordError` message: such a message is
    rejected as it is, before anything decodes it.

    A rejected message goes to the interval of the empty key, unless its stream is keyed by
    the record's own key and the message begins as an envelope whose key can be read
    (:func:`~millstream.engine.records.envelope_key`): then to that key's interval, under
    that key (its dead letter says so), which is where :func:`batch_task` finds it without
    decoding it.
    """
    layout = layout or IntervalLayout.initial(spec.options.starting_intervals())
    interval_of_key = layout.interval_lookup()
    reject_interval = rejected_interval(spec, layout)
    streams = _streams_by_topic(spec)
    by_record_key = _keyed_by_record_key(spec)
    quarantined = dict(quarantine or {})
    takes_tombstones = spec.options.tombstones == "deliver"
    extractors = {topic: spec.key_extractor(stream) for topic, stream in streams.items()}

    def rejected(
        origin: Origin, topic: str, value: bytes | None, error: Exception, timestamp: int
    ) -> Routed:
        key = envelope_key(value) if value is not None and topic in by_record_key else None
        if key is not None:
            origin = replace(origin, key=key)
        item = Rejected(origin, value or b"", error, timestamp)
        return interval_of(spec, item, layout), item

    def route(message: InputMessage) -> Routed:
        topic, partition, offset, kafka_ts, message_key, value = message
        stream = streams[topic]
        origin = stream_origin(stream, partition, offset)
        # One test per message when nothing is quarantined.
        poison = quarantined.get(Position(topic, partition, offset)) if quarantined else None
        if poison is not None:
            # Never decoded again (that may be what crashes); located by position.
            return rejected(origin, topic, value, PoisonRecordError(poison), kafka_ts)
        if value is None and takes_tombstones:
            deletion, refused = decode_tombstone(
                spec, stream, message_key, partition, offset, kafka_ts
            )
            if deletion is None:
                assert refused is not None
                return reject_interval, Rejected(origin, b"", refused, kafka_ts)
            return interval_of_key(deletion.key), Delivery(deletion.key, deletion, origin)
        record, key, error = decode_delivery(spec, stream, value, extractors[topic])
        if error is None:
            assert record is not None
            assert key is not None
            return interval_of_key(key), make_delivery(key, record, origin)
        if record is None:
            return rejected(origin, topic, value, error, kafka_ts)
        # Decoded, but the key extractor failed: the dead letter names the record.
        located = Origin(stream, partition, offset, record_id=record.record_id)
        return reject_interval, Rejected(located, value or b"", error, record.timestamp)

    return route


def _keyed_by_record_key(spec: ComputationSpec) -> frozenset[str]:
    """The topics of ``spec``'s input streams it keys by the record's own key."""
    return frozenset(stream_topic(i.stream) for i in spec.inputs if i.key_extractor is record_key)


def _streams_by_topic(spec: ComputationSpec) -> dict[str, str]:
    return {stream_topic(i.stream): i.stream for i in spec.inputs}


Skip = Callable[[str, bytes | None], bool]
"""Whether a message (its topic and value) is surely another task's: a reader need not
yield it (:func:`~millstream.connectors.stream_reader.read_ranges`'s ``skip``)."""

Reader = Callable[[TaskSettings, Sequence[OffsetRange], Skip], Iterable[InputMessage]]
"""How a task reads its batch's ranges but the messages ``skip`` answers true for:
:func:`read_from_kafka`, or a test's own."""

EndOffsets = Callable[[TaskSettings, Sequence[tuple[str, int]]], Mapping[tuple[str, int], int]]
"""The offsets up to which topic partitions hold committed records now, by (topic,
partition): :func:`committed_ends_from_kafka`, or a test's own."""


def read_from_kafka(
    settings: TaskSettings, ranges: Sequence[OffsetRange], skip: Skip
) -> Iterator[InputMessage]:
    """The messages of ``ranges`` but those ``skip`` refuses, read with this process's
    consumer."""
    resources = _resources(settings)
    return read_ranges(
        _batch_reader(resources, settings),
        ranges,
        _READ_TIMEOUT,
        skip=skip,
        known_topics=resources.reader_topics,
    )


def _batch_reader(resources: _Resources, settings: TaskSettings) -> Any:
    """``resources``' consumer of the batches' ranges, made at its first use."""
    if resources.reader is None:
        resources.reader = range_reader(settings.config)
    return resources.reader


def committed_ends_from_kafka(
    settings: TaskSettings, places: Sequence[tuple[str, int]]
) -> Mapping[tuple[str, int], int]:
    """The last stable offset of each (topic, partition) of ``places``: below it every
    transaction is decided, so a ``read_committed`` read up to it is whole; once the
    transactions open as it is first asked are decided, or :data:`SETTLE_SECONDS` have
    passed (:func:`settled_ends`, with this process's admin client)."""
    from confluent_kafka import IsolationLevel

    from millstream.connectors.kafka.stalls import latest_offsets

    resources = _resources(settings)
    admin = _end_offsets_admin(resources, settings, {topic for topic, _ in places})
    return settled_ends(
        lambda: latest_offsets(admin, places, IsolationLevel.READ_COMMITTED, _READ_TIMEOUT),
        lambda: latest_offsets(admin, places, IsolationLevel.READ_UNCOMMITTED, _READ_TIMEOUT),
        resources.stuck_at,
    )


def _end_offsets_admin(resources: _Resources, settings: TaskSettings, topics: Set[str]) -> Any:
    """The process's Kafka admin client of read-ahead's end offsets
    (:func:`committed_ends_from_kafka`), made at first use and asked then for the metadata of
    ``topics``, before any end offset.

    A fresh librdkafka client (2.16) sends its first lookup of a topic's leaders, the one an
    end offsets request makes, on its bootstrap connection, which it closes as soon as it
    learns the broker's own address; the lookup is lost with it ("Broker handle destroyed
    without termination" in its debug log), the learnt broker is connected a second later and
    the topic asked again two seconds after that. On two busy cores 10 of 48 fresh clients
    answered their first end offsets after 1 or 3 s, and a topology's downstream part in one
    query made its client at its first read-ahead: the first batch of paced input after a
    backlog took 3.1 s instead of 0.2 (``bench/throughput.py``, ``millstream-3-in-one`` at
    200 events/s). A metadata request of its own (``list_topics``) is not lost so: asked
    first, it took about 50 ms and the end offsets then none (0 of 64)."""
    if resources.admin is None:
        from millstream.connectors.kafka.topics import admin_client

        admin = admin_client(settings.config)
        learn_topics(admin, topics, None, _READ_TIMEOUT)
        resources.admin = admin
    return resources.admin


def settled_ends(
    stable: Callable[[], Mapping[tuple[str, int], int]],
    high: Callable[[], Mapping[tuple[str, int], int]],
    stuck_at: dict[tuple[str, int], int],
    *,
    seconds: float = SETTLE_SECONDS,
    poll: float = _SETTLE_POLL,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Mapping[tuple[str, int], int]:
    """The partitions' last stable offsets (``stable()``), asked again every ``poll``
    seconds until each has reached the high watermark it had when first asked (``high()``):
    until every transaction open then is decided; at most ``seconds``.

    ``stuck_at``: per partition, the last stable offset a wait before gave up at. A partition
    still there is not waited for again (a transaction left open: the driver's stall watch
    reports it, :mod:`millstream.connectors.kafka.stalls`); one that moved is forgotten, and
    one this wait gives up on is added."""
    found = stable()
    for place in [p for p, offset in stuck_at.items() if p in found and found[p] != offset]:
        del stuck_at[place]  # it moved: wait for it again
    waiting = [p for p in found if p not in stuck_at]
    if not waiting:
        return found
    tops = high()
    deadline = clock() + seconds
    while (waiting := [p for p in waiting if found[p] < tops.get(p, 0)]) and clock() < deadline:
        sleep(poll)
        found = stable()
    for place in waiting:
        stuck_at[place] = found[place]
    return found


def batch_task(
    spec: ComputationSpec,
    settings: TaskSettings,
    watermark: int,
    timer_watermark: int,
    layout: IntervalLayout,
    batch: BatchInput,
    read: Reader = read_from_kafka,
    ends: EndOffsets = committed_ends_from_kafka,
) -> BatchTask:
    """The ``mapPartitionsWithIndex`` function of a batch's one Spark stage
    (:class:`BatchTask`)."""
    return BatchTask(spec, settings, watermark, timer_watermark, layout, batch, read, ends)


@dataclass(frozen=True, slots=True)
class BatchTask:
    """The ``mapPartitionsWithIndex`` function of a batch's one Spark stage: partition ``n``
    (of ``range(tasks)``, whose elements it ignores) is task ``n``, which reads the batch's
    ranges straight from Kafka, routes every message (:func:`message_router`) and keeps those
    of the intervals ``batch.slots`` gives it, then runs each of them (and its ticks)
    through the interval's worker, in (stream, partition, offset) order; records under the
    input low watermark before the batch (``watermark``), event-time timers under the one
    after it (see :meth:`IntervalWorker.process`). One :data:`RESULT_SCHEMA` row (by column
    name) per interval. Raises whatever a worker raises (a fence before any other), failing
    the task; see the module docstring. In a topology's job a task may read past the batch
    (:meth:`start`'s ``upstream``), to the offsets ``ends`` gives.

    A plain RDD job, not a DataFrame's: Spark plans, compiles and converts nothing for it (a
    ``mapInArrow`` over ``spark.range`` cost about 60 ms more per batch in planning, Arrow
    conversions and the collect).
    """

    spec: ComputationSpec
    settings: TaskSettings
    watermark: int
    timer_watermark: int
    layout: IntervalLayout
    batch: BatchInput
    read: Reader = read_from_kafka
    ends: EndOffsets = committed_ends_from_kafka

    def __call__(self, index: int, _elements: Iterable[object]) -> Iterator[dict[str, Any]]:
        yield from self.start(index)()

    def start(
        self, index: int, upstream: Set[str] = frozenset()
    ) -> Callable[[], list[dict[str, Any]]]:
        """Task ``index`` until its intervals run: its share claimed, its messages read and
        routed, each interval's work handed to the process's interval threads. The function
        returned waits for them and gives the rows (or raises).

        ``upstream``: topics that parts of this task's job, run before this one in this
        task, wrote to; those of its input topics are read past the batch's planned end, up
        to what is committed now (see the module docstring)."""
        spec, settings, batch = self.spec, self.settings, self.batch
        ranges: Sequence[OffsetRange] = batch.ranges
        ahead: dict[tuple[str, int], int] = {}
        if upstream:
            ranges, ahead = _read_ahead(settings, spec, batch, upstream, self.ends)
        tasks = {index}
        if batch.claims is not None:
            # The shares this process worked before, where their caches and producers are.
            tasks = {
                claim_slot(batch.claims, n, batch.slots.tasks, settings.run_token) for n in tasks
            }
        fault_point("executor.task", spec.name)
        faults = armed_faults("executor.record", spec.name)
        held = _lease_checks(_CACHE.get(settings.endpoints), spec, settings.run_token, batch, tasks)
        routing_started, routing_cpu = thread_step_clock()
        by_interval = route_task(
            spec,
            self.layout,
            batch,
            tasks,
            lambda skip: self.read(settings, ranges, skip),
        )
        resources = _resources(settings)
        marks = resources.read_ahead
        if marks:
            _leave_out_read_ahead(by_interval, marks, settings.run_token, spec.name, batch.ticks)
        routed, routed_cpu = thread_step_clock()
        routing = [routed - routing_started, routed_cpu - routing_cpu]
        for slot in tasks:
            _LAST_RAN[settings.run_token, slot] = frozenset(
                i for i in by_interval if batch.slots.task_of(i) == slot
            )
        # The intervals' round trips to Cassandra and Kafka overlap on the pool's threads.
        futures = [
            resources.threads.submit(
                _run_interval,
                spec,
                settings.run_token,
                resources.workers,
                interval,
                inputs,
                self.watermark,
                self.timer_watermark,
                self.layout,
                faults,
                held.get(interval),
            )
            for interval, inputs in sorted(by_interval.items())
        ]

        intervals = sorted(by_interval)

        def rows() -> list[dict[str, Any]]:
            wait(futures)
            if ahead:
                for interval, future in zip(intervals, futures, strict=True):
                    if future.exception() is None:  # committed: below its ends, all done
                        if len(marks) >= _MARKS_KEPT:
                            marks.clear()  # a bound, not a loss: a mark only saves work
                        key = (settings.run_token, spec.name, interval)
                        marks.setdefault(key, {}).update(ahead)
            # A fence is raised before any other interval's failure: it says this process's
            # work was taken over, and the other failure may be one the same stop caused (a
            # request timed out while the process was stopped), which would hide it.
            for future in futures:
                if isinstance(future.exception(), FencedError):
                    future.result()
            done = [future.result() for future in futures]  # raises the first failure
            if done:
                done[0]["steps"][ROUTING] = routing  # once a task, not once an interval
            return done

        return rows


@dataclass(frozen=True, slots=True)
class WarmTask:
    """The ``mapPartitionsWithIndex`` function of the job that warms a computation's Python
    workers as its query starts (:meth:`.batch.BatchHandler.warm`): each task makes what the
    first batch's task would otherwise make first, in its process, for ``settings``'
    endpoints: the Cassandra session and its prepared statements, the Kafka clients
    (:func:`_resources`) and the batch reader, which asks for the metadata of ``topics``;
    unpickling it imports the computation's module (``spec``). Yields its worker's
    ``(host, pid, intervals)``, ``intervals`` those it took (below); a process that has
    them already only answers.

    On 2 cores a 20,000-record first batch spent about a fifth of its tasks' reading and
    routing making them (``bench/throughput.py --profile``).

    In local mode (``meet``), given the computation's ``layout`` and ``slots``, a task of a
    computation with strong productions also takes the intervals of the share its process
    will work (:meth:`IntervalWorker.take`, on the interval threads): the share becomes its
    process's last (:func:`claim_slot`), so the first batch's task in that process claims
    it and finds the leases held and the soft state made, as a later batch does. Every
    interval runs in a query's first batch (its start wakes it), which otherwise began
    with their acquires, pending productions, key listings and Bloom filters: about 45 ms
    of lease and 60 ms of reads an interval in a 20,000-record first batch."""

    spec: ComputationSpec
    settings: TaskSettings
    topics: tuple[str, ...]
    meet: str | None = None
    """Local mode: a directory of this job's own where each task leaves its process's
    name and, done, waits up to :data:`WARM_MEET_SECONDS` for the job's other tasks to have
    left theirs. Spark hands a task the Python worker idle longest: tasks that did not wait
    could run one after another in one process, leaving the batch's other task a cold one."""
    tasks: int = 1
    layout: IntervalLayout | None = None
    slots: IntervalSlots | None = None
    upstream: tuple[str, ...] = ()
    """Those of ``topics`` another computation of the same query writes to: a batch reads
    ahead in them (:func:`topology_task`), with an admin client this makes
    (:func:`_end_offsets_admin`)."""

    def __call__(
        self, index: int, _elements: Iterable[object]
    ) -> Iterator[tuple[str, int, tuple[int, ...]]]:
        resources = _resources(self.settings)
        reader = _batch_reader(resources, self.settings)
        learn_topics(reader, set(self.topics), resources.reader_topics, _READ_TIMEOUT)
        if self.upstream:
            _end_offsets_admin(resources, self.settings, set(self.upstream))
        taken: tuple[int, ...] = ()
        if self.meet is not None and self.spec.options.strong_productions:
            taken = self._take(resources, index)
        if self.meet is not None:
            meet_workers(Path(self.meet), f"{_HOST}:{os.getpid()}", self.tasks, WARM_MEET_SECONDS)
        yield _HOST, os.getpid(), taken

    def _take(self, resources: _Resources, index: int) -> tuple[int, ...]:
        """Take the intervals of this process's share, task ``index``'s unless the process
        worked another in this run before; returns them."""
        layout, slots, run = self.layout, self.slots, self.settings.run_token
        if layout is None or slots is None:
            return ()
        slot = _LAST_SLOT.setdefault(run, index)
        intervals = tuple(i for i in layout.ids if slots.task_of(i) == slot)
        workers = [resources.workers.worker(self.spec, i, layout, run=run)[0] for i in intervals]
        taking = [resources.threads.submit(worker.take) for worker in workers]
        wait(taking)
        for future in taking:
            future.result()  # raises the first failure: the warm-up fails, and says so
        return intervals


def meet_workers(directory: Path, worker: str, tasks: int, seconds: float) -> int:
    """Leave ``worker``'s name in ``directory`` and wait up to ``seconds`` until ``tasks``
    names are there (:class:`WarmTask`); return how many were."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / worker).touch()
    deadline = time.monotonic() + seconds
    while (met := len(os.listdir(directory))) < tasks and time.monotonic() < deadline:
        time.sleep(0.005)
    return met


def topology_task(
    parts: Sequence[tuple[int, BatchTask]],
) -> Callable[
    [int, Iterable[object]],
    Iterator[tuple[int, int, list[dict[str, Any]] | None, str | None]],
]:
    """The ``mapPartitionsWithIndex`` function of a topology's batch as one job
    (:class:`~millstream.spark.batch.TopologyJob`): task ``n`` runs task ``n`` of each part
    (its number of tasks and its :class:`BatchTask`) that has one, and yields per part
    ``(part, n, rows, None)``, or ``(part, n, None, traceback)`` for a part that raised: its
    computation's attempt failed, not the others'.

    A batch in which no part plans more than :data:`HAND_OFF_MOST_OFFSETS` offsets runs its
    parts in the levels of :func:`upstream_first`, a level once the one before has ended in
    this task: a part that writes to another's input runs before it, and the later part
    reads past the batch what the earlier ones wrote (:meth:`BatchTask.start`'s
    ``upstream``: the topics of the parts that succeeded before it in this task). A larger
    batch runs its parts all at once, reading their planned ranges alone. Within a level the
    parts read and route one after another (a Python worker has one Kafka reader), and their
    intervals run at once, on the process's interval threads, so that the computations'
    round trips to Cassandra and Kafka overlap."""
    # Per part, not summed: once records are handed on, a later stage's planned ranges are
    # what it read ahead in the batch before (left out again), so a sum counts a pipeline's
    # records once a stage; the largest part is the most any stage may have to work.
    largest = max((count(task.batch.ranges) for _, task in parts), default=0)
    if largest <= HAND_OFF_MOST_OFFSETS:
        levels = upstream_first([task.spec for _, task in parts])
    else:
        levels = [list(range(len(parts)))]

    def run(
        index: int, _elements: Iterable[object]
    ) -> Iterator[tuple[int, int, list[dict[str, Any]] | None, str | None]]:
        written: set[str] = set()  # topics this task's parts that ran wrote to
        for level in levels:
            started: list[tuple[int, Callable[[], list[dict[str, Any]]] | None, str | None]] = []
            for number in level:
                tasks, task = parts[number]
                if index >= tasks:
                    continue
                try:
                    started.append((number, task.start(index, written), None))
                except Exception:
                    started.append((number, None, traceback.format_exc()))
            for number, rows, error in started:
                if rows is None:
                    yield number, index, None, error
                    continue
                try:
                    done = rows()
                except Exception:
                    yield number, index, None, traceback.format_exc()
                else:
                    produced = parts[number][1].spec.produced_streams
                    written.update(stream_topic(s) for s in produced)
                    yield number, index, done, None

    return run


def upstream_first(specs: Sequence[ComputationSpec]) -> list[list[int]]:
    """The positions of ``specs`` in levels: each computation in a level after every other
    computation among them that writes to one of its input streams. The computations of a
    cycle (each upstream of another) share the level where it is found."""
    upstream = [
        {
            other
            for other, writer in enumerate(specs)
            if other != number and {i.stream for i in spec.inputs} & set(writer.produced_streams)
        }
        for number, spec in enumerate(specs)
    ]
    left = set(range(len(specs)))
    levels: list[list[int]] = []
    while left:
        level = sorted(number for number in left if not upstream[number] & left) or sorted(left)
        levels.append(level)
        left.difference_update(level)
    return levels


def _read_ahead(
    settings: TaskSettings,
    spec: ComputationSpec,
    batch: BatchInput,
    upstream: Set[str],
    ends: EndOffsets,
) -> tuple[Sequence[OffsetRange], dict[tuple[str, int], int]]:
    """``batch``'s ranges with, for each partition of its data topics among
    ``upstream``, a range from the batch's planned end to what is committed now; and each
    such partition's new end, by (stream, partition). With ``max_offsets_per_trigger``
    (``[run]``), the ranges added hold at most that many offsets, shared evenly: a batch's
    bound holds for what it reads ahead too (the rest waits for the next batch)."""
    ranges = batch.ranges
    planned = {place: end for place, end in batch.ends.items() if place[0] in upstream}
    for r in ranges:
        if r.topic in upstream:
            planned[(r.topic, r.partition)] = max(r.end, planned.get((r.topic, r.partition), 0))
    if not planned:
        return ranges, {}
    committed = ends(settings, sorted(planned))
    cap = settings.config.run.max_offsets_per_trigger
    share = None if cap is None else max(1, cap // len(planned))
    streams = _streams_by_topic(spec)
    grown = list(ranges)
    ahead: dict[tuple[str, int], int] = {}
    for (topic, partition), end in planned.items():
        now = committed.get((topic, partition), end)
        if share is not None:
            now = min(now, end + share)  # below the last stable offset: still whole
        if now > end:
            grown.append(OffsetRange(topic, partition, end, now))
            ahead[(streams[topic], partition)] = now
    return grown, ahead


def _leave_out_read_ahead(
    by_interval: dict[int, list[Delivery | Rejected]],
    marks: Mapping[tuple[str, str, int], Mapping[tuple[str, int], int]],
    run_token: str,
    computation: str,
    ticks: Sequence[int],
) -> None:
    """Leave out of each interval's inputs those below its marks (an earlier batch of this
    process read them ahead and committed them); an interval left with nothing to do (no
    input, no tick) does not run."""
    for interval in list(by_interval):
        mark = marks.get((run_token, computation, interval))
        if not mark:
            continue
        kept = [
            item
            for item in by_interval[interval]
            if (origin := item.origin).offset is None
            or origin.offset >= mark.get((origin.stream or "", origin.partition or 0), -1)
        ]
        if kept or interval in ticks:
            by_interval[interval] = kept
        else:
            del by_interval[interval]


def route_task(
    spec: ComputationSpec,
    layout: IntervalLayout,
    batch: BatchInput,
    tasks: Set[int],
    read: Callable[[Skip], Iterable[InputMessage]],
) -> dict[int, list[Delivery | Rejected]]:
    """The inputs of each interval of ``tasks`` (every interval of the batch's ticks among
    them) among the messages ``read`` gives: routed (:func:`message_router`), in the order
    read. ``read`` is told what to leave out: another task's records, when their envelope's
    key says so (each task would otherwise decode the whole batch)."""
    task_of = batch.slots.task_of
    by_interval: dict[int, list[Delivery | Rejected]] = {
        interval: [] for interval in batch.ticks if task_of(interval) in tasks
    }
    route = message_router(spec, layout, batch.quarantine)
    keyed = _KeyedIntervals(spec, layout, lambda interval: task_of(interval) in tasks)
    for message in read(keyed.foreign):
        interval, item = route(message)
        if task_of(interval) in tasks:
            by_interval.setdefault(interval, []).append(item)
        elif (known := keyed.interval_of(message.topic, message.value)) is not None:
            # Kept for its envelope's key, which the other tasks skipped it for.
            raise RuntimeError(
                f"{message.topic}/{message.partition}@{message.offset} was routed to "
                f"interval {interval}, another task's, not to {known}, that of its "
                "envelope's key: a bug"
            )
    return by_interval


class _KeyedIntervals:
    """A task's view of a message's record told from its envelope's key bytes, undecoded,
    in the topics keyed by the record's own key: its interval, and whether another task
    works it (:meth:`foreign`, remembered by those bytes for up to :data:`_KEYS_REMEMBERED`
    keys). ``owned``: whether this task works an interval."""

    def __init__(
        self, spec: ComputationSpec, layout: IntervalLayout, owned: Callable[[int], bool]
    ) -> None:
        self._topics = _keyed_by_record_key(spec)
        self._interval_of_key = layout.interval_lookup()
        self._owned = owned
        self._foreign: dict[bytes, bool] = {}

    def interval_of(self, topic: str, value: bytes | None) -> int | None:
        """The interval of the record's key; ``None`` in another topic, or when the value
        does not begin as an envelope with a key (routing says what it is then)."""
        if value is None or topic not in self._topics:
            return None
        key = envelope_key_bytes(value)
        return None if key is None else self._key_interval(key)

    def foreign(self, topic: str, value: bytes | None) -> bool:
        """The reader's ``skip``: the message is surely another task's."""
        if value is None or topic not in self._topics:
            return False
        key = envelope_key_bytes(value)
        if key is None:
            return False
        foreign = self._foreign.get(key)
        if foreign is None:
            interval = self._key_interval(key)
            foreign = interval is not None and not self._owned(interval)
            if len(self._foreign) >= _KEYS_REMEMBERED:
                self._foreign.clear()
            self._foreign[key] = foreign
        return foreign

    def _key_interval(self, key: bytes) -> int | None:
        try:
            text = key.decode("utf-8")
        except UnicodeDecodeError:
            return None  # no record's key: routing rejects the message
        return self._interval_of_key(text)


_KEYS_REMEMBERED: Final = 1 << 16
HAND_OFF_MOST_OFFSETS: Final = 2_000
"""The most offsets any computation of a topology's batch may plan for its stages to run one
after another, each reading what the one before just wrote (:func:`topology_task`). Handing
a record on within the batch takes a stage's latency from a batch to the time the stage's
work takes, but the stages' work no longer overlaps. At 2,000 events/s (a three-stage
pipeline's stages plan some 500 to 1,100 offsets each a batch) a further stage then cost
0.87 and 0.93 of a floor batch, against 2.0 and 2.5 with the stages at once (the bound was
500 offsets summed over the stages until 2026-12-07, which such batches passed); the
batches ran about a fifth longer. A larger batch (a backlog) runs its stages at once, for
their overlap: so does the batch after one, whose later stages plan what the earlier ones
wrote meanwhile."""
_MARKS_KEPT: Final = 10_000
"""At most this many intervals' read-ahead marks a process keeps (then it starts afresh)."""


def _run_interval(
    spec: ComputationSpec,
    run_token: str,
    workers: WorkerPool,
    interval: int,
    inputs: list[Delivery | Rejected],
    watermark: int,
    timer_watermark: int,
    layout: IntervalLayout | None,
    faults: frozenset[str] = frozenset(),
    held: Future[bool] | None = None,
) -> dict[str, Any]:
    """Run one interval's inputs; its :data:`RESULT_SCHEMA` row (:meth:`ResultRow.columns`).
    ``faults``: record IDs (hex) a fault harness armed (:mod:`~millstream.engine.fault_points`);
    ``held``: its lease check, made as the task began (:func:`_lease_checks`)."""
    started, cpu_started = time.monotonic(), time.thread_time()
    # Partitions interleave as they are read; each partition's messages come in order.
    inputs.sort(key=_position)
    if faults:
        _inject_faults(spec, inputs, faults)
    worker, cached = workers.worker(spec, interval, layout, run=run_token)
    result = worker.process(inputs, watermark, timer_watermark=timer_watermark, held=held)
    rejected = sum(isinstance(item, Rejected) for item in inputs)
    return ResultRow(
        computation=spec.name,
        interval=interval,
        counts=interval_counts(len(inputs), rejected, result, cached),
        host=_HOST,
        pid=os.getpid(),
        seconds=time.monotonic() - started,
        cpu_seconds=time.thread_time() - cpu_started,
        progress=result.progress,
        steps=result.steps,
    ).columns()


def _lease_checks(
    resources: _Resources | None,
    spec: ComputationSpec,
    run_token: str,
    batch: BatchInput,
    tasks: Set[int],
) -> dict[int, Future[bool]]:
    """Begun on the interval threads as a task starts, for each interval of its shares that
    this process ran in its last batch and whose worker keeps its lease: the read that tells
    whether it still holds it (:meth:`IntervalWorker.lease_check`), which then overlaps the
    task's reading and routing instead of starting the interval's work (about 8 to 14 ms an
    interval at 2,000 events/s). An interval that turns out to have nothing to run wasted
    one read; one idle in the last batch is not checked ahead. ``resources``: the process's
    for the task's endpoints (``None``: it has none, so no worker either)."""
    checks: dict[int, Future[bool]] = {}
    if resources is None:
        return checks
    for slot in sorted(tasks):
        for interval in sorted(_LAST_RAN.get((run_token, slot), ())):
            if batch.slots.task_of(interval) != slot:
                continue  # the intervals were spread anew since
            worker = resources.workers.existing(spec, interval, run=run_token)
            if worker is not None and (check := worker.lease_check()) is not None:
                checks[interval] = resources.threads.submit(check)
    return checks


def _position(item: Delivery | Rejected) -> tuple[str, int, int]:
    origin = item.origin
    return (origin.stream or "", origin.partition or 0, origin.offset or 0)


def _inject_faults(
    spec: ComputationSpec, inputs: list[Delivery | Rejected], faults: frozenset[str]
) -> None:
    for item in inputs:
        if isinstance(item, Delivery):
            fault_point("executor.record", spec.name, item.record.record_id.hex(), faults)
