"""Run computations in-process, without Kafka, Spark or Cassandra: helpers for users' tests.

The helpers drive the real per-key protocol (:mod:`millstream.engine.protocol`) over the
in-memory store, with a hand-advanced clock and input low watermark::

    from millstream.engine.testing import Watermark, record, run_computation

    run = run_computation(
        WindowCounter(),  # counts records per key and window, emits at the window's end
        [record("cat", b"", 10), record("cat", b"", 20), Watermark(1_000_000)],
        outputs=["counts"],
    )
    assert [IntCodec().decode(v) for v in run.values("counts")] == [2]
    assert run.state == {}  # the window's state was cleared when it fired

Steps are records (or ``(stream, record)`` pairs for topologies), tombstones
(:func:`tombstone`: Kafka messages with no value, as a compacted topic or a CDC source writes
for a delete; routed as on Spark, a dead letter or a deletion for a computation that takes
them), :class:`Watermark` to move the injectors' low watermark, and :class:`AdvanceClock` to
move wall time. Consecutive records form one batch; a watermark or clock step first runs
everything up to then to completion, timers included, then moves time. Productions flow to the
consumers of their stream (routed and keyed by :mod:`millstream.engine.routing`, as on Spark),
and each round is a batch of every computation, run by the batch cycle the Spark runtime runs
(:class:`~millstream.engine.driver.ComputationDriver`): a computation reads the reports of its
producers (and of the test's injector) from an in-memory watermark topic, applies one only
once it has consumed the input the report covers, runs its intervals with input or work due,
splits and merges them (``ComputationOptions.rebalance``), and reports its own watermark, held
by its oldest pending work (timers, unacknowledged productions), after every round.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field

from millstream.engine.authority import WatermarkAuthority
from millstream.engine.clock import ManualClock
from millstream.engine.computation import Computation
from millstream.engine.deadletters import DeadLetter, Origin, decode_dead_letter
from millstream.engine.driver import ComputationDriver, IntervalOutcome
from millstream.engine.errors import TopologyError
from millstream.engine.layout import IntervalLayout
from millstream.engine.productions import (
    CommitTag,
    DeliveryOutcome,
    Production,
    TransactionUnavailableError,
)
from millstream.engine.protocol import Delivery, Rejected
from millstream.engine.records import (
    MAX_EVENT_TIME,
    MIN_EVENT_TIME,
    Record,
    injector_record_id,
)
from millstream.engine.routing import deliver, deliver_tombstone, split_by_interval
from millstream.engine.stores.memory.store import InjectedCrash, MemoryIntervalStore
from millstream.engine.timers import Timer
from millstream.engine.topology import (
    ComputationOptions,
    KeyExtractor,
    Topology,
)
from millstream.engine.watermark_topic import MemoryWatermarkTopic
from millstream.engine.watermarks import (
    ComputationWatermarks,
    Offsets,
    WatermarkReport,
    injector_source,
)
from millstream.engine.worker_pool import WorkerPool

__all__ = [
    "END_OF_TIME",
    "AdvanceClock",
    "ComputationRun",
    "SendOutcome",
    "Step",
    "TestingSink",
    "TestingTransactions",
    "Tombstone",
    "TopologyHarness",
    "TransactionFault",
    "Watermark",
    "record",
    "run_computation",
    "run_topology",
    "tombstone",
]

END_OF_TIME = MAX_EVENT_TIME + 1
"""A watermark past every valid event time: every event-time timer fires (but one at exactly
``MAX_EVENT_TIME``, which no watermark report can pass, here as on the real runtime)."""

_INJECTOR = "millstream.testing"

_INPUT_STREAM = "input"
_COMPUTATION = "computation"
_record_numbers = itertools.count()


@dataclass(frozen=True, slots=True)
class Watermark:
    """Move the low watermark of the injected streams to ``timestamp`` (never backwards).

    Several injector processes: each ``process`` reports on its own and holds the streams
    at its last report once it reported (as :class:`~millstream.engine.watermarks.
    ExpectedSet` processes do); ``records`` is the weight its report carries for percentile
    watermarks (``ComputationOptions.watermark_percentile``), the records it wrote.
    """

    timestamp: int
    process: str = "0"
    records: int | None = None


@dataclass(frozen=True, slots=True)
class AdvanceClock:
    """Move the wall clock forward by ``micros``."""

    micros: int


@dataclass(frozen=True, slots=True)
class Tombstone:
    """A Kafka message with ``key`` (bytes, or ``None``: no key) and no value, with Kafka
    timestamp ``timestamp`` (µs); see :func:`tombstone`."""

    key: bytes | None
    timestamp: int


Step = Record | Tombstone | tuple[str, Record | Tombstone] | Watermark | AdvanceClock


def record(key: str, value: bytes, timestamp: int, record_id: bytes | None = None) -> Record:
    """A test record; without ``record_id`` it gets a fresh one, unique in this process."""
    if record_id is None:
        record_id = injector_record_id("millstream.testing", 0, next(_record_numbers))
    return Record(key, value, timestamp, record_id)


def tombstone(key: str | bytes | None, timestamp: int) -> Tombstone:
    """A tombstone of ``key`` (a ``str`` is UTF-8 encoded; bytes are kept as they are, valid
    UTF-8 or not; ``None``: a message without a key) at Kafka timestamp ``timestamp``.

    A computation that takes tombstones (``ComputationOptions(tombstones="deliver")``) gets
    it in ``process_deletion``; any other makes it a dead letter. Its position on the stream
    (the harness's streams have one partition) is its identity, as on Kafka.
    """
    return Tombstone(key.encode("utf-8") if isinstance(key, str) else key, timestamp)


class SendOutcome(enum.Enum):
    """What happens to one production sent to a :class:`TestingSink`."""

    ACKNOWLEDGED = "acknowledged"
    UNACKNOWLEDGED = "unacknowledged"
    """Delivered, but the acknowledgement does not come in time (a slow broker)."""
    LOST = "lost"
    """Neither delivered nor acknowledged (a failed send)."""


class TestingSink:
    """A production sink that keeps what it delivers, in order, like one big topic.

    ``outcome`` decides per production what a send does (default: acknowledge everything).
    :attr:`sent` holds every delivered copy, resends included; :meth:`delivered` is what a
    consumer deduplicating by record ID sees.
    """

    __test__ = False  # not a pytest test class

    def __init__(self, outcome: Callable[[Production], SendOutcome] | None = None) -> None:
        self.outcome = outcome or (lambda _: SendOutcome.ACKNOWLEDGED)
        self.sent: list[Production] = []
        self._crash_after: int | None = None

    def send(self, productions: Sequence[Production], timeout: float) -> Set[bytes]:
        acked: set[bytes] = set()
        for number, production in enumerate(productions):
            if self._crash_after is not None and number >= self._crash_after:
                self._crash_after = None
                raise InjectedCrash(f"injected crash after sending {number} productions")
            outcome = self.outcome(production)
            if outcome is not SendOutcome.LOST:
                self.sent.append(production)
            if outcome is SendOutcome.ACKNOWLEDGED:
                acked.add(production.record_id)
        return acked

    def crash_next_send(self, after: int = 0) -> None:
        """Make the next send deliver ``after`` productions, then crash (if it has more)."""
        self._crash_after = after

    def clear_faults(self) -> None:
        self._crash_after = None

    def delivered(self, stream: str | None = None) -> list[Production]:
        """Productions in first-sent order, each record ID once."""
        seen: set[bytes] = set()
        unique = []
        for production in self.sent:
            if production.record_id not in seen and stream in (None, production.stream):
                seen.add(production.record_id)
                unique.append(production)
        return unique


class TransactionFault(enum.Enum):
    """What goes wrong with the next transaction a :class:`TestingTransactions` delivers."""

    ABORTED = "aborted"
    """Aborted (nothing delivered); the producer says the outcome is unknown."""
    COMMITTED_UNACKNOWLEDGED = "committed-unacknowledged"
    """Committed, but the commit's answer is lost: the outcome is unknown to the producer."""
    CRASH_BEFORE_COMMIT = "crash-before-commit"
    """The process dies with the transaction open (:class:`InjectedCrash`)."""
    CRASH_AFTER_COMMIT = "crash-after-commit"
    """The process dies as the commit returns (:class:`InjectedCrash`)."""
    COMMIT_UNDONE = "commit-undone"
    """The commit is answered, but the transaction is aborted after all (a Kafka broker
    restarted as it completed skipped its markers, and the sweep of hanging transactions
    aborted it): nothing delivered, the marker not moved."""
    UNSETTLED = "unsettled"
    """Committed and answered, but the marker is not readable right after (the read that
    settles the commit times out once)."""


@dataclass
class _TransactionLog:
    """The broker side of :class:`TestingTransactions`: producer epochs and markers per
    interval, and the committed productions, in commit order."""

    epochs: dict[tuple[str, int], int] = field(default_factory=dict)
    markers: dict[tuple[str, int], CommitTag] = field(default_factory=dict)
    committed: list[Production] = field(default_factory=list)
    opens: int = 0
    prepares: int = 0
    staged: int = 0
    aborted: int = 0
    settles: int = 0


class TestingTransactions:
    """A :class:`~millstream.engine.productions.TransactionalSink` over an in-memory
    transaction log, for unit tests of transactional productions.

    One instance stands for one process's producers; :meth:`client` gives another process's,
    over the same log, so that a zombie and its successor can fence each other.
    :meth:`read_committed` is what a plain ``read_committed`` consumer reads: every committed
    copy, duplicates included. :meth:`fail_next` injects faults, :meth:`before_next_open`
    races; ``unavailable`` makes opens fail as with an unreachable coordinator;
    ``prepared_ready`` makes prepared opens finish before the batch's commit.
    """

    __test__ = False  # not a pytest test class

    def __init__(self, log: _TransactionLog | None = None) -> None:
        self._log = log if log is not None else _TransactionLog()
        self._epochs: dict[tuple[str, int], int] = {}
        self._faults: list[TransactionFault] = []
        self._before_open: list[Callable[[], object]] = []
        self._prepared: set[tuple[str, int, int]] = set()
        # Intervals whose marker the next settling read does not read (UNSETTLED).
        self._unreadable: set[tuple[str, int]] = set()
        self.unavailable = False
        self.prepared_ready = False
        """Whether an open prepared for a lease counts as finished (ready) by the batch's
        commit, as a fast one does on Kafka: a takeover then opens before its commit."""

    def client(self) -> TestingTransactions:
        """Another process's producers over the same transaction log."""
        return TestingTransactions(self._log)

    def fail_next(self, *faults: TransactionFault) -> None:
        """Make the next transactions (one per fault, in order) go wrong so."""
        self._faults.extend(faults)

    def before_next_open(self, action: Callable[[], object]) -> None:
        """Run ``action`` as the next open begins (another worker's step, in a race)."""
        self._before_open.append(action)

    @property
    def opens(self) -> int:
        """How many times any client opened an interval's producer."""
        return self._log.opens

    def marker(self, computation: str, interval: int) -> CommitTag | None:
        return self._log.markers.get((computation, interval))

    def read_committed(self, stream: str | None = None) -> list[Production]:
        """Every committed production (of ``stream``), in commit order, copies included."""
        return [p for p in self._log.committed if stream in (None, p.stream)]

    def prepare(self, computation: str, interval: int, timeout: float, token: int) -> None:
        # The open happens when it is taken (open), as if the background one were slow,
        # unless ``prepared_ready`` says it finished in time (ready).
        self._log.prepares += 1
        self._prepared.add((computation, interval, token))

    def ready(self, computation: str, interval: int, token: int) -> bool:
        return self.prepared_ready and (computation, interval, token) in self._prepared

    @property
    def prepares(self) -> int:
        """How many times any client began an open in the background."""
        return self._log.prepares

    def open(
        self, computation: str, interval: int, timeout: float, token: int | None = None
    ) -> CommitTag | None:
        if self._before_open:
            self._before_open.pop(0)()
        if self.unavailable:
            raise TransactionUnavailableError("the testing transaction coordinator is down")
        key = (computation, interval)
        log = self._log
        log.epochs[key] = log.epochs.get(key, 0) + 1
        log.opens += 1
        self._epochs[key] = log.epochs[key]
        return log.markers.get(key)

    def deliver(
        self,
        computation: str,
        interval: int,
        productions: Sequence[Production],
        marker: CommitTag,
        timeout: float,
    ) -> DeliveryOutcome:
        key = (computation, interval)
        if key not in self._epochs:
            raise RuntimeError(f"interval {interval} of {computation!r} was never opened here")
        if self._epochs[key] != self._log.epochs[key]:
            return DeliveryOutcome.FENCED
        fault = self._faults.pop(0) if self._faults else None
        if fault is TransactionFault.CRASH_BEFORE_COMMIT:
            raise InjectedCrash("injected crash with a transaction open")
        if fault is TransactionFault.ABORTED:
            return DeliveryOutcome.UNKNOWN
        if fault is TransactionFault.COMMIT_UNDONE:
            return DeliveryOutcome.COMMITTED
        if fault is TransactionFault.UNSETTLED:
            self._unreadable.add(key)
        self._log.committed.extend(productions)
        self._log.markers[key] = marker
        if fault is TransactionFault.CRASH_AFTER_COMMIT:
            raise InjectedCrash("injected crash as a transaction committed")
        if fault is TransactionFault.COMMITTED_UNACKNOWLEDGED:
            return DeliveryOutcome.UNKNOWN
        return DeliveryOutcome.COMMITTED

    def settled(self, computation: str, interval: int, marker: CommitTag, timeout: float) -> bool:
        key = (computation, interval)
        self._log.settles += 1
        if key in self._unreadable:
            self._unreadable.discard(key)
            return False
        found = self._log.markers.get(key)
        return found is not None and found >= marker

    @property
    def settles(self) -> int:
        """How many times any client read a commit's marker back to settle it."""
        return self._log.settles

    def stage(
        self,
        computation: str,
        interval: int,
        productions: Sequence[Production],
        marker: CommitTag,
        timeout: float,
    ) -> _TestingStaged:
        if (computation, interval) not in self._epochs:
            raise RuntimeError(f"interval {interval} of {computation!r} was never opened here")
        self._log.staged += 1
        # What the commit decides (fenced since, a fault) is decided when it is committed.
        return _TestingStaged(
            lambda: self.deliver(computation, interval, productions, marker, timeout),
            self._log,
        )

    @property
    def staged(self) -> int:
        """How many transactions any client staged ahead of its store commit."""
        return self._log.staged

    @property
    def aborted(self) -> int:
        """How many staged transactions were aborted (their store commit failed)."""
        return self._log.aborted


class _TestingStaged:
    """A transaction :meth:`TestingTransactions.stage` staged: invisible until committed."""

    def __init__(self, deliver: Callable[[], DeliveryOutcome], log: _TransactionLog) -> None:
        self._deliver = deliver
        self._log = log

    def commit(self) -> DeliveryOutcome:
        return self._deliver()

    def abort(self) -> None:
        self._log.aborted += 1


@dataclass
class ComputationRun:
    """What a computation did in a test run."""

    name: str
    productions: dict[str, list[Record]] = field(default_factory=dict)
    state: dict[str, bytes] = field(default_factory=dict)
    fired_timers: list[Timer] = field(default_factory=list)
    pending_timers: list[Timer] = field(default_factory=list)
    dead_letters: list[DeadLetter] = field(default_factory=list)

    def records(self, stream: str) -> list[Record]:
        """Records produced to ``stream``, deduplicated, in production order."""
        return self.productions.get(stream, [])

    def values(self, stream: str) -> list[bytes]:
        return [r.value for r in self.records(stream)]


class TopologyHarness:
    """Drives a topology step by step over the memory store; see the module docstring."""

    def __init__(
        self,
        topology: Topology,
        *,
        clock: ManualClock | None = None,
        sink: TestingSink | None = None,
        max_rounds: int = 10_000,
    ) -> None:
        topology.validate()
        self.topology = topology
        self.clock = clock or ManualClock()
        self.store = MemoryIntervalStore(self.clock)
        self.sink = sink or TestingSink()
        self.watermark = MIN_EVENT_TIME
        self.process_watermarks: dict[str, int] = {}
        self._sequence = 0
        self.max_rounds = max_rounds
        self._specs = dict(topology.computations)
        self._queues: dict[str, list[Delivery | Rejected]] = {name: [] for name in self._specs}
        self._workers = WorkerPool(self.store, self.sink, self.clock)
        # Messages written per stream, and consumed per computation and stream: the offsets
        # that reports cover and that decide when a consumer applies them.
        self._written: dict[str, int] = {}
        self._consumed: dict[str, dict[str, int]] = {name: {} for name in self._specs}
        self.watermark_topic = MemoryWatermarkTopic(self._end_offsets)
        # As on Spark: the authority reads the topic once for every computation, and one
        # driver per computation runs its batch cycle, subscribed from the start: every
        # report, in order.
        authority = WatermarkAuthority(self.watermark_topic)
        self._drivers = {
            name: ComputationDriver(
                spec,
                ComputationWatermarks.of(topology, spec),
                authority.subscribe(name),
                layout_store=lambda: self.store,
                clock=self.clock,
            )
            for name, spec in self._specs.items()
        }
        for driver in self._drivers.values():
            driver.load_layout()
        self._rounds = 0
        self._fired: dict[str, list[Timer]] = {name: [] for name in self._specs}
        self._produced: dict[str, set[bytes]] = {name: set() for name in self._specs}
        self._routed = 0

    def inject(self, stream: str, item: Record | Tombstone) -> None:
        """Queue a record or a tombstone of an injected stream for every consumer of the
        stream."""
        if stream not in self.topology.external_streams:
            raise TopologyError(
                f"{stream!r} is not an injected stream of topology {self.topology.name!r}; "
                f"inject into one of {sorted(self.topology.external_streams)}"
            )
        if isinstance(item, Tombstone):
            self._route_tombstone(stream, item)
        else:
            self._route(Production(stream, item))

    def step(self, item: Step) -> None:
        if isinstance(item, Watermark):
            self.run_until_idle()
            self._inject_watermark(item.timestamp, item.process, item.records)
            self.run_until_idle()
        elif isinstance(item, AdvanceClock):
            self.run_until_idle()
            self.clock.advance(item.micros)
            self.run_until_idle()
        elif isinstance(item, Record | Tombstone):
            self.inject(_INPUT_STREAM, item)
        else:
            self.inject(*item)

    def run_until_idle(self) -> None:
        """Process queued input and due timers, and deliver productions, until nothing moves."""
        for _ in range(self.max_rounds):
            if not self._round():
                return
        raise RuntimeError(
            f"the topology was still busy after {self.max_rounds} rounds; does a timer re-arm "
            "itself as already due, or a cycle produce without end?"
        )

    def result(self, computation: str) -> ComputationRun:
        spec = self._specs[computation]
        run = ComputationRun(
            name=computation,
            state=self.store.states(computation),
            fired_timers=list(self._fired[computation]),
            pending_timers=self.store.timers(computation),
        )
        for production in self.sink.delivered():
            if production.record_id not in self._produced[computation]:
                continue
            if production.stream == spec.dead_letter_stream:
                run.dead_letters.append(decode_dead_letter(production.record.value))
            else:
                run.productions.setdefault(production.stream, []).append(production.record)
        return run

    @property
    def layouts(self) -> dict[str, IntervalLayout]:
        """Each computation's key intervals (they split and merge with options.rebalance)."""
        layouts = {}
        for name, driver in self._drivers.items():
            assert driver.layout is not None  # read when the harness was made
            layouts[name] = driver.layout
        return layouts

    def _round(self) -> bool:
        busy = False
        for name, spec in self._specs.items():
            driver = self._drivers[name]
            inputs, self._queues[name] = self._queues[name], []
            counts = self._consumed[name]
            for item in inputs:
                stream = item.origin.stream
                assert stream is not None
                counts[stream] = counts.get(stream, 0) + 1
            # The batch cycle the Spark runtime runs (ComputationDriver), a round a batch.
            plan = driver.begin(_offsets(counts), had_input=bool(inputs))
            by_interval = split_by_interval(spec, inputs, plan.layout)
            outcomes: list[IntervalOutcome] = []
            try:
                for interval in sorted(by_interval.keys() | set(plan.ticks)):
                    worker, _ = self._workers.worker(spec, interval, plan.layout)
                    sent_before = len(self.sink.sent)
                    batch = by_interval.get(interval, [])
                    result = worker.process(
                        batch, plan.watermark, timer_watermark=plan.timer_watermark
                    )
                    outcomes.append(IntervalOutcome(interval, result.progress, records=len(batch)))
                    self._fired[name].extend(result.fired_timers)
                    self._produced[name].update(p.record_id for p in self.sink.sent[sent_before:])
                    busy = busy or bool(by_interval.get(interval)) or bool(result.fired_timers)
            except BaseException:
                # An injected crash: the intervals before it committed; nothing runs it again.
                driver.absorb(outcomes, complete=False)
                raise
            driver.absorb(outcomes)
            busy = self._route_sent() or busy
            # The new intervals of a split or merge run once to say what they hold.
            busy = driver.finish() is not None or busy
            report = driver.report(self._rounds, _offsets(self._written))
            if report is not None:
                self.watermark_topic.publish(report)
                busy = True
        self._rounds += 1
        return busy

    def _end_offsets(self, streams: Sequence[str]) -> Offsets:
        return _offsets({stream: self._written.get(stream, 0) for stream in streams})

    def _route_sent(self) -> bool:
        new = self.sink.sent[self._routed :]
        self._routed = len(self.sink.sent)
        for production in new:
            self._route(production)
        return bool(new)

    def _route(self, production: Production) -> None:
        # Every copy is written to the stream, resends included, as to a Kafka topic.
        self._written[production.stream] = self._written.get(production.stream, 0) + 1
        origin = Origin(stream=production.stream, record_id=production.record_id)
        for consumer in self.topology.consumers(production.stream):
            self._queues[consumer.name].append(
                deliver(consumer, production.stream, production.record, origin)
            )

    def _route_tombstone(self, stream: str, item: Tombstone) -> None:
        offset = self._written.get(stream, 0)
        self._written[stream] = offset + 1
        origin = Origin(stream=stream, partition=0, offset=offset)
        for consumer in self.topology.consumers(stream):
            self._queues[consumer.name].append(
                deliver_tombstone(consumer, stream, item.key, item.timestamp, origin)
            )

    def _inject_watermark(self, watermark: int, process: str, records: int | None) -> None:
        said = max(self.process_watermarks.get(process, MIN_EVENT_TIME), watermark)
        self.process_watermarks[process] = said
        if process == "0":
            self.watermark = said
        self._sequence += 1
        # A report can say no more than MAX_EVENT_TIME: as on the real runtime, END_OF_TIME
        # fires every timer before it.
        self.watermark_topic.publish(
            WatermarkReport(
                source=injector_source(_INJECTOR, process),
                streams=tuple(sorted(self.topology.external_streams)),
                watermark=min(said, MAX_EVENT_TIME),
                sequence=self._sequence,
                offsets=_offsets(self._written),
                records=records,
            )
        )


def _offsets(counts: Mapping[str, int]) -> dict[str, dict[int, int]]:
    """Message counts per stream as Kafka offsets: the harness's streams have one partition."""
    return {stream: {0: count} for stream, count in counts.items()}


def run_topology(
    topology: Topology,
    steps: Iterable[tuple[str, Record | Tombstone] | Watermark | AdvanceClock],
    *,
    clock: ManualClock | None = None,
    sink: TestingSink | None = None,
) -> dict[str, ComputationRun]:
    """Run ``steps`` through ``topology``; returns each computation's run by name."""
    harness = TopologyHarness(topology, clock=clock, sink=sink)
    for item in steps:
        harness.step(item)
    harness.run_until_idle()
    return {name: harness.result(name) for name in topology.computations}


def run_computation(
    computation: Computation,
    steps: Iterable[Record | Tombstone | Watermark | AdvanceClock],
    *,
    outputs: Iterable[str] = ("output",),
    options: ComputationOptions | None = None,
    key_extractor: KeyExtractor | None = None,
    clock: ManualClock | None = None,
    sink: TestingSink | None = None,
) -> ComputationRun:
    """Run one computation over records read from one input stream; see the module docstring."""
    topology = Topology("testing", streams=[_INPUT_STREAM])
    inputs: Mapping[str, KeyExtractor | None] = {_INPUT_STREAM: key_extractor}
    topology.add_computation(
        _COMPUTATION, computation, inputs=inputs, outputs=outputs, options=options
    )
    harness = TopologyHarness(topology, clock=clock, sink=sink)
    for item in steps:
        harness.step(item)
    harness.run_until_idle()
    return harness.result(_COMPUTATION)
