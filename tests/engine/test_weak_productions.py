"""Weak productions: sent while a batch's later keys run, stragglers checkpointed."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence, Set
from typing import TYPE_CHECKING

import pytest

from millstream.engine import weak_productions
from millstream.engine.computation import Computation
from millstream.engine.context import Context
from millstream.engine.productions import Production
from millstream.engine.protocol import Delivery, Rejected
from millstream.engine.records import (
    Record,
)
from millstream.engine.stores.memory.store import (
    MemoryIntervalStore,
)
from millstream.engine.testing import SendOutcome, TestingSink
from millstream.engine.topology import ComputationOptions
from tests.engine.appender import WM, Appender, deliver

if TYPE_CHECKING:
    from tests.engine.conftest import RecordFactory, WorkersFactory

pytestmark = pytest.mark.unit


WEAK = ComputationOptions(key_intervals=1, strong_productions=False)


class GatedSink(TestingSink):
    """A sink whose sends say when one began; ``hold`` keeps the next send from returning
    until :meth:`release`; ``outcome`` as :class:`TestingSink`'s."""

    def __init__(self, outcome: Callable[[Production], SendOutcome] | None = None) -> None:
        super().__init__(outcome)
        self.began = threading.Event()
        self.hold = False
        self._released = threading.Event()
        self.sends: list[list[bytes]] = []

    def send(self, productions: Sequence[Production], timeout: float) -> Set[bytes]:
        self.sends.append([p.record.value for p in productions])
        acked = super().send(productions, timeout)
        self.began.set()
        if self.hold:
            self.hold = False
            assert self._released.wait(10), "the test never released the send"
        return acked

    def release(self) -> None:
        self._released.set()


class WaitsForSend(Computation):
    """Produces each record's value; at the key ``wait``, waits (at most 10 s) until the
    sink began a send, and records whether it had."""

    def __init__(self, sink: GatedSink, wait: str) -> None:
        self.sink = sink
        self.wait = wait
        self.saw_a_send: bool | None = None

    def process_record(self, ctx: Context, record: Record) -> None:
        if record.key == self.wait:
            self.saw_a_send = self.sink.began.wait(10)
        ctx.produce("out", record.value, record.timestamp)


def _weak_senders() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "millstream-weak-sends"]


def _keys(make_record: RecordFactory, count: int) -> list[Delivery | Rejected]:
    """One record for each of ``count`` keys: ``k<n>`` valued ``v<n>``."""
    return deliver(*(make_record(f"k{n}", f"v{n}".encode()) for n in range(count)))


@pytest.fixture
def chunks_of_two(monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch hands its weak productions on two at a time."""
    monkeypatch.setattr(weak_productions, "WEAK_SEND_CHUNK", 2)


def test_a_large_batch_sends_weak_productions_while_its_later_keys_run(
    make_workers: WorkersFactory,
    store: MemoryIntervalStore,
    make_record: RecordFactory,
    chunks_of_two: None,
) -> None:
    sink = GatedSink()
    workers = make_workers(store, sink)
    computation = WaitsForSend(sink, wait="k4")
    spec = workers.spec(computation, options=WEAK)
    result = workers.worker(spec).process(_keys(make_record, 6), WM)

    assert computation.saw_a_send is True  # the first chunk left while k4 ran
    assert sink.sends[0] == [b"v0", b"v1"]
    assert [p.record.value for p in sink.delivered("out")] == [f"v{n}".encode() for n in range(6)]
    assert result.acknowledged == 6
    assert store.productions("comp") == []
    assert _weak_senders() == []


def test_a_small_batch_sends_its_weak_productions_once_its_keys_ran(
    make_workers: WorkersFactory, store: MemoryIntervalStore, make_record: RecordFactory
) -> None:
    sink = GatedSink()
    workers = make_workers(store, sink)
    spec = workers.spec(Appender(), options=WEAK)
    workers.worker(spec).process(_keys(make_record, 6), WM)

    assert sink.sends == [[f"v{n}".encode() for n in range(6)]]


def test_a_chunk_not_acknowledged_in_time_leaves_the_rest_to_one_send_after_the_keys(
    make_workers: WorkersFactory,
    store: MemoryIntervalStore,
    make_record: RecordFactory,
    chunks_of_two: None,
) -> None:
    lost = {b"v1"}
    sink = GatedSink(
        lambda p: SendOutcome.LOST if p.record.value in lost else SendOutcome.ACKNOWLEDGED
    )
    workers = make_workers(store, sink)
    spec = workers.spec(WaitsForSend(sink, wait="k4"), options=WEAK)
    worker = workers.worker(spec)
    result = worker.process(_keys(make_record, 8), WM)

    # The first chunk lost v1, so the thread sent nothing more: the rest left in one send
    # once the keys had run; the straggler was checkpointed and sent again after the commit.
    rest = [f"v{n}".encode() for n in range(2, 8)]
    assert sink.sends == [[b"v0", b"v1"], rest, [b"v1"]]
    assert result.acknowledged == 7
    assert [p.record.value for p in store.productions("comp")] == [b"v1"]

    lost.clear()
    worker.process([], WM)
    assert store.productions("comp") == []
    assert sorted(p.record.value for p in sink.delivered("out")) == [
        f"v{n}".encode() for n in range(8)
    ]


def test_a_chunk_send_that_raises_fails_the_batch_and_commits_nothing(
    make_workers: WorkersFactory,
    store: MemoryIntervalStore,
    make_record: RecordFactory,
    chunks_of_two: None,
) -> None:

    class BrokenSink(GatedSink):
        def send(self, productions: Sequence[Production], timeout: float) -> Set[bytes]:
            self.began.set()
            raise ConnectionError("the broker went away")

    sink = BrokenSink()
    workers = make_workers(store, sink)
    spec = workers.spec(WaitsForSend(sink, wait="k4"), options=WEAK)
    with pytest.raises(ConnectionError, match="the broker went away"):
        workers.worker(spec).process(_keys(make_record, 6), WM)

    assert store.commit_log == []
    assert _weak_senders() == []


def test_a_batch_that_fails_while_a_chunk_is_sent_waits_for_that_send_and_sends_no_more(
    make_workers: WorkersFactory,
    store: MemoryIntervalStore,
    make_record: RecordFactory,
    chunks_of_two: None,
) -> None:
    sink = GatedSink()
    sink.hold = True  # the first chunk's send does not return until released

    class StopsTheBatch(WaitsForSend):
        def process_record(self, ctx: Context, record: Record) -> None:
            super().process_record(ctx, record)
            if record.key == "k4":
                # Released after this raised, so the batch must wait for the send.
                threading.Timer(0.2, sink.release).start()
                raise KeyboardInterrupt  # not an Exception: it fails the batch

    workers = make_workers(store, sink)
    spec = workers.spec(StopsTheBatch(sink, wait="k2"), options=WEAK)
    with pytest.raises(KeyboardInterrupt):
        workers.worker(spec).process(_keys(make_record, 6), WM)

    assert _weak_senders() == []  # joined before the batch raised
    assert sink.sends == [[b"v0", b"v1"]]  # k2 and k3's chunk was never sent
    assert store.commit_log == []


class ProducesValueTimes(Computation):
    """Produces ``<key>-<n>`` for n below the record's value; a record valued ``fail``
    produces, then raises (its production must go with the call)."""

    def process_record(self, ctx: Context, record: Record) -> None:
        if record.value == b"fail":
            ctx.produce("out", b"undone", record.timestamp)
            raise ValueError("fails after producing")
        for n in range(int(record.value)):
            ctx.produce("out", f"{record.key}-{n}".encode(), record.timestamp)


def test_each_calls_weak_productions_leave_once_in_the_order_made_and_a_failed_calls_none(
    make_workers: WorkersFactory, store: MemoryIntervalStore, make_record: RecordFactory
) -> None:
    sink = GatedSink()
    workers = make_workers(store, sink)
    spec = workers.spec(ProducesValueTimes(), options=WEAK)
    inputs = deliver(
        make_record("a", b"3"),
        make_record("b", b"0"),
        make_record("c", b"fail"),
        make_record("d", b"1"),
        make_record("a", b"2"),
    )
    result = workers.worker(spec).process(inputs, WM)

    assert [p.record.value for p in sink.delivered("out")] == [
        b"a-0", b"a-1", b"a-2", b"a-0", b"a-1", b"d-0",
    ]  # fmt: skip
    assert len(result.dead_letters) == 1
    assert len(sink.delivered(spec.dead_letter_stream)) == 1
    assert result.acknowledged == 7  # the six outputs and the dead letter
    assert store.productions("comp") == []
