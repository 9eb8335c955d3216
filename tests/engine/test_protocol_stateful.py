"""Exactly-once under faults: a Hypothesis state machine over the protocol and the memory store.

The machine feeds records to a pool of workers that share one key interval and injects, per
batch, at most one fault: a crash at any step of the commit path (store fault points and a
sink that dies mid-send), a timeout whose write applied, did not apply or lands later, or a
competing worker that acquires the interval in the middle of the batch (making the first a
zombie). Inputs are redelivered, reordered and duplicated; the watermark and the clock move.

After every step it checks that no effect happened twice, that no fenced writer committed,
and that downstream (deduplicating by record ID) never saw one effect under two IDs; at the end
of each run it drains everything and compares with a model fold over the distinct input.

Seeded and replayable: ``MILLSTREAM_HYPOTHESIS_SEED=<int>`` picks the seed, otherwise the run
is derandomized (the same every time).
"""

from __future__ import annotations

import os
import random
from collections import Counter
from typing import ClassVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from millstream.engine.clock import ManualClock
from millstream.engine.codecs import JsonCodec
from millstream.engine.computation import Computation
from millstream.engine.context import Context
from millstream.engine.deadletters import decode_dead_letter
from millstream.engine.errors import FencedError
from millstream.engine.productions import Production
from millstream.engine.protocol import Delivery, IntervalWorker
from millstream.engine.records import MAX_EVENT_TIME, Record, injector_record_id
from millstream.engine.stores.memory.store import (
    FaultPoint,
    InjectedCrash,
    MemoryIntervalStore,
    UnknownOutcome,
)
from millstream.engine.testing import SendOutcome, TestingSink
from millstream.engine.timers import TimeDomain, Timer
from millstream.engine.topology import ComputationOptions, ComputationSpec, InputStream

pytestmark = pytest.mark.unit

KEYS = ("a", "b", "c", "d")
WORKERS = 3
JSON = JsonCodec()
DEAD_LETTERS = "tally.dead-letters"

Fault = tuple[str, object]
FAULTS: list[Fault] = [
    *(("crash", point) for point in FaultPoint),
    *(("unknown", outcome) for outcome in UnknownOutcome),
    *(
        ("compete", point)
        for point in (
            FaultPoint.AFTER_ACQUIRE,
            FaultPoint.BEFORE_READ,
            FaultPoint.BEFORE_COMMIT,
            FaultPoint.AFTER_COMMIT,
            FaultPoint.BEFORE_DELETE,
        )
    ),
    *(("sink_crash", after) for after in (0, 1, 2)),
]


class Tally(Computation):
    """Per key, a JSON list of effects: ``r:<id>`` per record, ``e:<id>``/``w:<id>`` per timer.

    Each effect is also produced to ``out``. Records valued ``boom`` raise. A timer that fires
    before its record's effect is committed, or early, raises too: it would show up as an
    unexpected dead letter.

    Wall timers are set relative to the clock, so a retried call may set them differently: the
    computation is not deterministic, which strong productions must absorb. Weak productions
    are only for deterministic computations (paper 6.1.3), so ``deterministic`` derives the wall
    timer from the record instead.
    """

    def __init__(self, *, deterministic: bool) -> None:
        self.deterministic = deterministic

    def process_record(self, ctx: Context, record: Record) -> None:
        if record.value == b"boom":
            raise RuntimeError("boom")
        name = record.record_id.hex()[:12]
        self._effect(ctx, f"r:{name}", record.timestamp)
        ctx.set_timer(f"e{name}", record.timestamp)
        wall_base = 0 if self.deterministic else ctx.clock.now()
        ctx.set_timer(f"w{name}", wall_base + record.timestamp % 4, TimeDomain.WALL_TIME)

    def process_timer(self, ctx: Context, timer: Timer) -> None:
        name = timer.tag[1:]
        if f"r:{name}" not in ctx.state(JSON).get([]):
            raise AssertionError(f"timer {timer.tag} fired without its record's effect")
        if timer.domain is TimeDomain.EVENT_TIME and timer.timestamp >= ctx.input_low_watermark:
            raise AssertionError(f"timer {timer.tag} fired early")
        self._effect(ctx, f"{timer.tag[0]}:{name}", timer.timestamp)

    @staticmethod
    def _effect(ctx: Context, effect: str, timestamp: int) -> None:
        effects = ctx.state(JSON)
        effects.set([*effects.get([]), effect])
        ctx.produce("out", effect.encode(), max(timestamp, 0))


class ProtocolMachine(RuleBasedStateMachine):
    """Workers of one interval, a source that redelivers, and a deduplicating consumer."""

    steps: ClassVar[int] = 0

    def __init__(self) -> None:
        super().__init__()
        self.clock = ManualClock(0)
        # A small batch limit splits most commits, so faults also land between batches.
        self.store = MemoryIntervalStore(self.clock, max_batch_bytes=400)
        self.sink_outcome: SendOutcome | None = SendOutcome.ACKNOWLEDGED
        self.sink = TestingSink(self._send_outcome)
        self._configure(strong=True)
        self.watermark = 0
        self.records: list[Record] = []
        self.unacked: list[Record] = []
        self.acked: list[Record] = []
        self.checked_commits = 0
        self.checked_sends = 0
        self.downstream: dict[bytes, bytes] = {}
        self.downstream_values: set[bytes] = set()

    @initialize(strong=st.booleans())
    def _configure(self, strong: bool) -> None:
        """Strong or weak productions for this run (exactly-once either way)."""
        self.spec = ComputationSpec(
            "tally",
            Tally(deterministic=not strong),
            (InputStream("in"),),
            ("out",),
            ComputationOptions(key_intervals=1, strong_productions=strong),
        )
        self.workers = [self._new_worker() for _ in range(WORKERS)]

    def _new_worker(self) -> IntervalWorker:
        return IntervalWorker(self.spec, 0, store=self.store, sink=self.sink, clock=self.clock)

    def _count(self) -> None:
        type(self).steps += 1

    # -- inputs and time ---------------------------------------------------------------------

    @rule(key=st.integers(0, len(KEYS) - 1), boom=st.integers(0, 9), delta=st.integers(-3, 12))
    def new_record(self, key: int, boom: int, delta: int) -> None:
        self._count()
        record = Record(
            KEYS[key],
            b"boom" if boom == 0 else b"ok",
            max(0, self.watermark + delta),
            injector_record_id("source", 0, len(self.records)),
        )
        self.records.append(record)
        self.unacked.append(record)

    @rule(pick=st.integers(0, 1_000))
    def redeliver(self, pick: int) -> None:
        self._count()
        if self.acked:
            self.unacked.append(self.acked[pick % len(self.acked)])

    @rule(delta=st.integers(0, 8))
    def advance_watermark(self, delta: int) -> None:
        self._count()
        self.watermark += delta

    @rule(delta=st.integers(0, 3))
    def tick(self, delta: int) -> None:
        self._count()
        self.clock.advance(delta)

    @rule(outcome=st.integers(0, len(SendOutcome)))
    def sink_behaves(self, outcome: int) -> None:
        """One outcome for every production, or (the last choice) a mix that leaves a
        stored row of productions partly acknowledged."""
        self._count()
        self.sink_outcome = list(SendOutcome)[outcome] if outcome < len(SendOutcome) else None

    def _send_outcome(self, production: Production) -> SendOutcome:
        if self.sink_outcome is not None:
            return self.sink_outcome
        return list(SendOutcome)[production.record_id[0] % len(SendOutcome)]

    # -- batches -----------------------------------------------------------------------------

    @rule(
        worker=st.integers(0, WORKERS - 1),
        take=st.integers(0, 5),
        shuffle=st.integers(0, 2**16),
        duplicate=st.booleans(),
        fault=st.integers(0, 2 * len(FAULTS) - 1),
    )
    def run_batch(self, worker: int, take: int, shuffle: int, duplicate: bool, fault: int) -> None:
        """One batch; half of them meet one fault (plain integers: they draw fastest)."""
        self._count()
        order = list(range(len(self.unacked)))
        random.Random(shuffle).shuffle(order)
        chosen = sorted(order[:take], reverse=True)
        batch = [self.unacked[i] for i in chosen]
        if duplicate and batch:
            batch.append(batch[0])
        competitor = (worker + 1) % WORKERS
        competitor_done: list[bool] = []
        if fault < len(FAULTS):
            kind, detail = FAULTS[fault]
            if kind == "crash":
                assert isinstance(detail, FaultPoint)
                self.store.inject(detail)
            elif kind == "unknown":
                assert isinstance(detail, UnknownOutcome)
                self.store.inject_unknown_outcome(detail)
            elif kind == "sink_crash":
                assert isinstance(detail, int)
                self.sink.crash_next_send(detail)
            else:
                assert isinstance(detail, FaultPoint)

                def compete() -> None:
                    if self._process(competitor, batch):
                        competitor_done.append(True)

                self.store.inject(detail, compete)
        succeeded = self._process(worker, batch)
        self.store.clear_faults()  # a fault the batch did not reach must not hit the next one
        self.sink.clear_faults()
        if succeeded or competitor_done:
            for i in chosen:
                self.acked.append(self.unacked.pop(i))

    def _process(self, worker: int, batch: list[Record]) -> bool:
        try:
            self.workers[worker].process([Delivery(r.key, r) for r in batch], self.watermark)
        except InjectedCrash:
            self.workers[worker] = self._new_worker()  # the process died and restarts empty
            return False
        except FencedError:
            return False  # a zombie: its inputs stay unacknowledged for the owner
        return True

    # -- invariants --------------------------------------------------------------------------

    @invariant()
    def check(self) -> None:
        self.no_effect_twice()
        self.fenced_writers_never_commit()
        self.downstream_sees_each_effect_once()

    def no_effect_twice(self) -> None:
        for key, raw in self.store.states("tally").items():
            effects = JSON.decode(raw)
            twice = [e for e, n in Counter(effects).items() if n > 1]
            assert not twice, f"effects of key {key} happened more than once: {twice[:3]}"

    def fenced_writers_never_commit(self) -> None:
        log = self.store.commit_log
        for previous, commit in zip(
            log[max(0, self.checked_commits - 1) :], log[self.checked_commits :], strict=False
        ):
            assert commit.token == commit.sequencer, f"commit under a stale lease: {commit}"
            assert commit.token >= previous.token, f"an older lease committed late: {commit}"
        self.checked_commits = len(log)

    def downstream_sees_each_effect_once(self) -> None:
        for production in self.sink.sent[self.checked_sends :]:
            self._deliver_downstream(production)
        self.checked_sends = len(self.sink.sent)

    def _deliver_downstream(self, production: Production) -> None:
        record = production.record
        known = self.downstream.get(record.record_id)
        if known is not None:
            return  # a resend: the consumer drops it by record ID
        if production.stream == DEAD_LETTERS:
            dead = decode_dead_letter(record.value)
            assert dead.error_message == "boom", f"unexpected dead letter: {dead}"
            value = b"dead:" + (dead.origin.record_id or b"")
        else:
            value = record.value
        assert value not in self.downstream_values, f"{value!r} reached downstream twice"
        self.downstream[record.record_id] = value
        self.downstream_values.add(value)

    # -- the model ----------------------------------------------------------------------------

    def teardown(self) -> None:
        self.store.clear_faults()
        self.sink_outcome = SendOutcome.ACKNOWLEDGED
        self.watermark = MAX_EVENT_TIME + 1
        owner = self._new_worker()
        for _ in range(2):
            # Wall timers are set up to 3µs ahead of the clock at their record's processing.
            self.clock.advance(4)
            owner.process([Delivery(r.key, r) for r in self.unacked], self.watermark)
            self.unacked = []
        self.check()

        distinct = {r.record_id: r for r in self.records}.values()
        fine = [r for r in distinct if r.value != b"boom"]
        expected: dict[str, Counter[str]] = {}
        for r in fine:
            name = r.record_id.hex()[:12]
            expected.setdefault(r.key, Counter()).update([f"r:{name}", f"e:{name}", f"w:{name}"])
        actual = {key: Counter(JSON.decode(raw)) for key, raw in self.store.states("tally").items()}
        assert actual == expected, "state differs from the fold over the distinct input"
        assert self.downstream_values == {
            effect.encode() for counts in expected.values() for effect in counts
        } | {b"dead:" + r.record_id for r in distinct if r.value == b"boom"}
        assert self.store.productions("tally") == []
        assert self.store.timers("tally") == []


_SEED = os.environ.get("MILLSTREAM_HYPOTHESIS_SEED") or None
if _SEED is not None:
    hypothesis_seed(int(_SEED))(ProtocolMachine)

EXAMPLES = 270
MIN_STEPS = 100_000


def test_exactly_once_under_faults() -> None:
    ProtocolMachine.steps = 0
    run_state_machine_as_test(
        ProtocolMachine,
        settings=settings(
            max_examples=EXAMPLES,
            stateful_step_count=500,
            derandomize=_SEED is None,
            database=None,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        ),
    )
    assert ProtocolMachine.steps >= MIN_STEPS, f"only {ProtocolMachine.steps} steps ran"
