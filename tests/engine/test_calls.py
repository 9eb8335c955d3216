"""A key's calls into user code: a call that raises is undone and leaves a dead letter."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from millstream.engine.computation import Computation
from millstream.engine.context import Context
from millstream.engine.deadletters import Origin, decode_dead_letter
from millstream.engine.errors import MalformedRecordError
from millstream.engine.protocol import Delivery, Rejected
from millstream.engine.records import (
    MAX_RECORD_BYTES,
    Record,
    dead_letter_record_id,
    encode_record,
    injector_record_id,
)
from tests.engine.appender import WM, Appender, deliver

if TYPE_CHECKING:
    from tests.engine.conftest import RecordFactory, Workers

pytestmark = pytest.mark.unit


# -- dead letters -------------------------------------------------------------------------


def test_an_exception_in_user_code_dead_letters_the_record_atomically(
    workers: Workers, make_record: RecordFactory
) -> None:
    spec = workers.spec(Appender())
    bad = make_record("k", b"boom", timestamp=7)
    result = workers.worker(spec).process(
        [
            Delivery("k", bad, Origin(stream="in", partition=2, offset=9)),
            *deliver(make_record("k", b"ok")),
        ],
        WM,
    )

    assert workers.state(spec) == {"k": ["ok"]}  # the failed call's state change is dropped
    (letter,) = workers.sink.delivered("comp.dead-letters")
    assert letter.record.record_id == dead_letter_record_id("comp", bad.record_id)
    assert letter.record.timestamp == 7
    dead = decode_dead_letter(letter.record.value)
    assert dead == result.dead_letters[0]
    assert dead.origin == Origin(
        stream="in", partition=2, offset=9, record_id=bad.record_id, key="k"
    )
    assert (dead.error_type, dead.error_message) == ("RuntimeError", "boom")
    assert dead.raw == encode_record(bad)
    assert [p.record.value for p in workers.sink.delivered("out")] == [b"ok"]
    (commit,) = workers.store.commit_log  # dead letter, dedup ID and state: one write
    assert commit.keys == ("k",)


class Undone(Computation):
    """Sets the record's value as state, timer ``t`` at its time, produces it; a value of
    ``fail`` also sets ``v``, deletes ``w`` and clears the state, then raises; ``w`` sets ``w``.
    ``seen``: the state and the timers each call saw as it began."""

    def __init__(self) -> None:
        self.seen: list[tuple[bytes | None, list[str]]] = []

    def process_record(self, ctx: Context, record: Record) -> None:
        self.seen.append((ctx.get_state(), [t for t in "tvw" if ctx.timer(t) is not None]))
        if record.value == b"w":
            ctx.set_timer("w", FAR)
            return
        ctx.set_state(record.value)
        ctx.set_timer("t", record.timestamp + FAR)
        ctx.produce("out", record.value, record.timestamp)
        if record.value == b"fail":
            ctx.set_timer("v", FAR)
            ctx.delete_timer("w")
            ctx.clear_state()
            raise RuntimeError("boom")


FAR = 10**15  # a timer the batches' watermarks never reach


def test_a_failing_call_is_undone_and_leaves_the_calls_before_it_in_the_batch(
    workers: Workers, make_record: RecordFactory
) -> None:
    computation = Undone()
    spec = workers.spec(computation)
    worker = workers.worker(spec)
    worker.process(deliver(make_record("k", b"w")), WM)
    result = worker.process(
        deliver(
            make_record("k", b"a", timestamp=100),
            make_record("k", b"fail", timestamp=200),
            make_record("j", b"fail", timestamp=300),
        ),
        WM,
    )

    assert len(result.dead_letters) == 2
    assert workers.store.states("comp") == {"k": b"a"}  # j had no state: it still has none
    assert sorted((t.key, t.tag, t.timestamp) for t in workers.store.timers("comp")) == [
        ("k", "t", 100 + FAR),
        ("k", "w", FAR),
    ]
    assert [p.record.value for p in workers.sink.delivered("out")] == [b"a"]
    # Each call saw the calls before it in the batch (keys in order: j, then k), and the
    # next batch nothing of the one that failed.
    assert computation.seen == [(None, []), (None, []), (None, ["w"]), (b"a", ["t", "w"])]
    worker.process(deliver(make_record("k", b"b", timestamp=400)), WM)
    assert computation.seen[-1] == (b"a", ["t", "w"])


def test_a_dead_lettered_record_is_not_retried(
    workers: Workers, make_record: RecordFactory
) -> None:
    spec = workers.spec(Appender())
    worker = workers.worker(spec)
    bad = make_record("k", b"boom")
    worker.process(deliver(bad), WM)
    assert worker.process(deliver(bad), WM).duplicates == 1
    assert len(workers.sink.sent) == 1


class Producer(Computation):
    def __init__(self, stream: str, size: int = 1, timestamp: int = 1) -> None:
        self.stream, self.size, self.timestamp = stream, size, timestamp

    def process_record(self, ctx: Context, record: Record) -> None:
        ctx.produce(self.stream, b"x" * self.size, self.timestamp)


@pytest.mark.parametrize(
    ("computation", "error"),
    [
        (Producer("undeclared"), "UndeclaredStreamError"),
        (Producer("out", size=MAX_RECORD_BYTES), "OversizedRecordError"),
        (Producer("out", timestamp=-1), "AbsurdTimestampError"),
    ],
)
def test_bad_productions_dead_letter_the_input(
    workers: Workers, make_record: RecordFactory, computation: Computation, error: str
) -> None:
    result = workers.worker(workers.spec(computation)).process(deliver(make_record("k")), WM)
    assert [d.error_type for d in result.dead_letters] == [error]
    assert workers.sink.delivered("out") == []


def test_an_absurd_input_timestamp_is_dead_lettered_without_running_user_code(
    workers: Workers, make_record: RecordFactory
) -> None:
    spec = workers.spec(Appender())
    result = workers.worker(spec).process(deliver(make_record("k", b"a", timestamp=-5)), 42)
    assert [d.error_type for d in result.dead_letters] == ["AbsurdTimestampError"]
    assert workers.state(spec) == {}
    (letter,) = workers.sink.delivered("comp.dead-letters")
    assert letter.record.timestamp == 42


def test_undecodable_input_becomes_a_dead_letter_identified_by_its_position(
    workers: Workers,
) -> None:
    spec = workers.spec(Appender())
    origin = Origin(stream="in", partition=1, offset=5)
    rejected = Rejected(origin, b"\x00garbage", MalformedRecordError("bad marker"), 77)
    first = workers.worker(spec).process([rejected, rejected], WM)  # delivered twice
    replayed = workers.worker(spec).process([rejected], WM)  # a replayed batch, new owner

    # Its position is its identity: dead-lettered and counted once, then a duplicate.
    assert (len(first.dead_letters), first.duplicates) == (1, 1)
    assert (len(replayed.dead_letters), replayed.duplicates) == (0, 1)
    (letter,) = workers.sink.delivered("comp.dead-letters")
    cause = injector_record_id("in", 1, 5)
    assert letter.record.record_id == dead_letter_record_id("comp", cause)
    dead = decode_dead_letter(letter.record.value)
    assert (dead.error_type, dead.raw, dead.origin) == (
        "MalformedRecordError",
        b"\x00garbage",
        origin,
    )
