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

Steps are records (or ``(stream, record)`` pairs for topologies), :class:`Watermark` to move
the injectors' low watermark, and :class:`AdvanceClock` to move wall time. Consecutive records
form one batch; a watermark or clock step first runs everything up to then to completion,
timers included, then moves time. Productions flow to the consumers of their stream, and each
computation's input low watermark is computed as in MillWheel: the minimum of its producers'
watermarks and their oldest pending work (queued input, pending timers and productions).
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field

from millstream.engine.clock import ManualClock
from millstream.engine.computation import Computation
from millstream.engine.deadletters import DeadLetter, Origin, decode_dead_letter
from millstream.engine.errors import TopologyError
from millstream.engine.keys import key_interval
from millstream.engine.productions import Production
from millstream.engine.protocol import Delivery, IntervalWorker, Rejected
from millstream.engine.records import (
    MAX_EVENT_TIME,
    MIN_EVENT_TIME,
    Record,
    encode_record,
    injector_record_id,
)
from millstream.engine.stores.memory.store import InjectedCrash, MemoryIntervalStore
from millstream.engine.timers import TimeDomain, Timer
from millstream.engine.topology import ComputationOptions, ComputationSpec, KeyExtractor, Topology

__all__ = [
    "END_OF_TIME",
    "AdvanceClock",
    "ComputationRun",
    "SendOutcome",
    "TestingSink",
    "TopologyHarness",
    "Watermark",
    "record",
    "run_computation",
    "run_topology",
]

END_OF_TIME = MAX_EVENT_TIME + 1
"""A watermark past every valid event time: every event-time timer fires."""

_INPUT_STREAM = "input"
_COMPUTATION = "computation"
_record_numbers = itertools.count()


@dataclass(frozen=True, slots=True)
class Watermark:
    """Move the low watermark of the injected streams to ``timestamp`` (never backwards)."""

    timestamp: int


@dataclass(frozen=True, slots=True)
class AdvanceClock:
    """Move the wall clock forward by ``micros``."""

    micros: int


Step = Record | tuple[str, Record] | Watermark | AdvanceClock


def record(key: str, value: bytes, timestamp: int, record_id: bytes | None = None) -> Record:
    """A test record; without ``record_id`` it gets a fresh one, unique in this process."""
    if record_id is None:
        record_id = injector_record_id("millstream.testing", 0, next(_record_numbers))
    return Record(key, value, timestamp, record_id)


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
        self.max_rounds = max_rounds
        self._specs = dict(topology.computations)
        self._queues: dict[str, list[Delivery | Rejected]] = {name: [] for name in self._specs}
        self._workers: dict[tuple[str, int], IntervalWorker] = {}
        self._watermarks = dict.fromkeys(self._specs, MIN_EVENT_TIME)
        self._fired: dict[str, list[Timer]] = {name: [] for name in self._specs}
        self._produced: dict[str, set[bytes]] = {name: set() for name in self._specs}
        self._routed = 0

    def inject(self, stream: str, item: Record) -> None:
        """Queue a record of an injected stream for every consumer of the stream."""
        if stream not in self.topology.external_streams:
            raise TopologyError(
                f"{stream!r} is not an injected stream of topology {self.topology.name!r}; "
                f"inject into one of {sorted(self.topology.external_streams)}"
            )
        self._route(Production(stream, item))

    def step(self, item: Step) -> None:
        if isinstance(item, Watermark):
            self.run_until_idle()
            self.watermark = max(self.watermark, item.timestamp)
            self.run_until_idle()
        elif isinstance(item, AdvanceClock):
            self.run_until_idle()
            self.clock.advance(item.micros)
            self.run_until_idle()
        elif isinstance(item, Record):
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

    def _round(self) -> bool:
        busy = False
        for name, spec in self._specs.items():
            watermark = self._input_watermark(name)
            inputs, self._queues[name] = self._queues[name], []
            by_interval: dict[int, list[Delivery | Rejected]] = {}
            for item in inputs:
                key = item.key if isinstance(item, Delivery) else ""
                by_interval.setdefault(key_interval(key, spec.options.key_intervals), []).append(
                    item
                )
            for interval in sorted(by_interval.keys() | self._timer_intervals(spec, watermark)):
                worker = self._workers.get((name, interval))
                if worker is None:
                    worker = IntervalWorker(
                        spec, interval, store=self.store, sink=self.sink, clock=self.clock
                    )
                    self._workers[name, interval] = worker
                sent_before = len(self.sink.sent)
                result = worker.process(by_interval.get(interval, []), watermark)
                self._fired[name].extend(result.fired_timers)
                self._produced[name].update(p.record_id for p in self.sink.sent[sent_before:])
                busy = busy or bool(by_interval.get(interval)) or bool(result.fired_timers)
            busy = self._route_sent() or busy
        return busy

    def _timer_intervals(self, spec: ComputationSpec, watermark: int) -> set[int]:
        now = self.clock.now()
        return {
            key_interval(t.key, spec.options.key_intervals)
            for t in self.store.timers(spec.name)
            if t.is_due(watermark, now)
        }

    def _route_sent(self) -> bool:
        new = self.sink.sent[self._routed :]
        self._routed = len(self.sink.sent)
        for production in new:
            self._route(production)
        return bool(new)

    def _route(self, production: Production) -> None:
        for consumer in self.topology.consumers(production.stream):
            extract = consumer.key_extractor(production.stream)
            origin = Origin(stream=production.stream, record_id=production.record_id)
            try:
                key = extract(production.record)
            except Exception as exc:
                # A key extractor is user code: its failure dead-letters the record.
                self._queues[consumer.name].append(
                    Rejected(
                        origin, encode_record(production.record), exc, production.record.timestamp
                    )
                )
                continue
            self._queues[consumer.name].append(Delivery(key, production.record, origin))

    def _input_watermark(self, computation: str) -> int:
        # MillWheel's recursive definition, solved by iterating down from the injectors' value:
        # low watermark(C) = min over C's inputs of (injector watermark, or for each producer P:
        # min(low watermark(P), oldest pending work of P)). Held monotonic, as the authority does.
        oldest = {name: self._oldest_work(name) for name in self._specs}
        marks = dict.fromkeys(self._specs, self.watermark)
        external = self.topology.external_streams
        changed = True
        while changed:
            changed = False
            for name, spec in self._specs.items():
                candidates = (
                    [self.watermark] if any(i.stream in external for i in spec.inputs) else []
                )
                for i in spec.inputs:
                    candidates.extend(
                        min(marks[p.name], oldest[p.name])
                        for p in self.topology.producers(i.stream)
                    )
                mark = min(candidates, default=self.watermark)
                if mark < marks[name]:
                    marks[name] = mark
                    changed = True
        self._watermarks[computation] = max(self._watermarks[computation], marks[computation])
        return self._watermarks[computation]

    def _oldest_work(self, computation: str) -> int:
        pending = [
            *(
                item.record.timestamp
                for item in self._queues[computation]
                if isinstance(item, Delivery)
            ),
            *(
                t.timestamp
                for t in self.store.timers(computation)
                if t.domain is TimeDomain.EVENT_TIME
            ),
            *(p.record.timestamp for p in self.store.productions(computation)),
        ]
        return min(pending, default=END_OF_TIME)


def run_topology(
    topology: Topology,
    steps: Iterable[tuple[str, Record] | Watermark | AdvanceClock],
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
    steps: Iterable[Record | Watermark | AdvanceClock],
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
