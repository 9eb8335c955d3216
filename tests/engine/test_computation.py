from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from millstream.engine.computation import Computation
from millstream.engine.context import Context
from millstream.engine.protocol import Delivery
from millstream.engine.records import Record

if TYPE_CHECKING:
    from tests.engine.conftest import RecordFactory, Workers

pytestmark = pytest.mark.unit


class SetsATimer(Computation):
    def process_record(self, ctx: Context, record: Record) -> None:
        ctx.set_timer("t", 0)


def test_unimplemented_hooks_dead_letter_with_a_clear_error(
    workers: Workers, make_record: RecordFactory
) -> None:
    result = workers.worker(workers.spec(Computation())).process(
        [Delivery("k", make_record("k"))], 0
    )
    assert [d.error_type for d in result.dead_letters] == ["NotImplementedError"]
    assert "process_record" in result.dead_letters[0].error_message

    timer_result = workers.worker(workers.spec(SetsATimer())).process(
        [Delivery("k", make_record("k"))], 10
    )
    assert [d.error_message for d in timer_result.dead_letters] == [
        "SetsATimer set timer 't' but does not override process_timer"
    ]
