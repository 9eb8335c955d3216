import time

import pytest

from millstream.engine.clock import Clock, ManualClock, SystemClock

pytestmark = pytest.mark.unit


def test_system_clock_reads_microseconds_since_the_epoch() -> None:
    before = time.time_ns() // 1_000
    now = SystemClock().now()
    assert before <= now <= time.time_ns() // 1_000


def test_manual_clock_moves_only_forward_and_by_hand() -> None:
    clock = ManualClock(10)
    assert clock.now() == 10
    assert clock.advance(5) == 15
    clock.set(20)
    assert clock.now() == 20
    with pytest.raises(ValueError, match="backwards"):
        clock.advance(-1)
    with pytest.raises(ValueError, match="backwards"):
        clock.set(19)
    assert clock.now() == 20


def test_both_clocks_satisfy_the_protocol() -> None:
    assert isinstance(SystemClock(), Clock)
    assert isinstance(ManualClock(), Clock)
