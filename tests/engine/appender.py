"""What the protocol's tests share: a computation that appends each record's value to its
key's state, and the deliveries of records."""

from __future__ import annotations

from millstream.engine.codecs import JsonCodec
from millstream.engine.computation import Computation
from millstream.engine.context import Context
from millstream.engine.protocol import Delivery, Rejected
from millstream.engine.records import Record
from millstream.engine.timers import Timer

__all__ = ["JSON", "WM", "Appender", "deliver"]

WM = 0
JSON = JsonCodec()


def deliver(*records: Record) -> list[Delivery | Rejected]:
    return [Delivery(r.key, r) for r in records]


class Appender(Computation):
    """Appends each record's value to a JSON list in state and produces it to ``out``.

    A value of ``b"boom"`` raises after changing state, to test that a failed call's changes
    are dropped. Timers append ``"timer:<tag>"`` and produce it.
    """

    def __init__(self, *, timer_at: int | None = None) -> None:
        self.timer_at = timer_at
        self.timer_calls: list[Timer] = []

    def process_record(self, ctx: Context, record: Record) -> None:
        items = ctx.state(JSON)
        items.set([*items.get([]), record.value.decode()])
        ctx.produce("out", record.value, record.timestamp)
        if self.timer_at is not None:
            ctx.set_timer("t", self.timer_at)
        if record.value == b"boom":
            raise RuntimeError("boom")

    def process_timer(self, ctx: Context, timer: Timer) -> None:
        self.timer_calls.append(timer)
        items = ctx.state(JSON)
        items.set([*items.get([]), f"timer:{timer.tag}"])
        ctx.produce("out", f"timer:{timer.tag}".encode(), timer.timestamp)
