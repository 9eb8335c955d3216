"""The store contract's own types (the backends' behaviour is in ``stores/test_contract.py``)."""

from __future__ import annotations

import pytest

from millstream.engine.store import NO_FLOOR, NextTimers, TimerFloor
from millstream.engine.timers import TimeDomain, Timer

pytestmark = pytest.mark.unit


def test_a_floor_starts_at_the_first_entries_and_above_all_in_a_domain_without_any() -> None:
    floor = TimerFloor.at(NextTimers(event_time=10, wall_time=None))
    assert floor.of(TimeDomain.EVENT_TIME) == 10
    wall = floor.of(TimeDomain.WALL_TIME)
    assert wall is not None
    assert wall >= 2**63 - 1


def test_a_floor_is_lowered_to_the_timers_set_in_their_own_domain() -> None:
    floor = TimerFloor.at(NextTimers(event_time=10, wall_time=None))
    lowered = floor.lowered(
        [Timer("k", "a", 12), Timer("k", "b", 7), Timer("j", "w", 50, TimeDomain.WALL_TIME)]
    )
    assert lowered == TimerFloor(event_time=7, wall_time=50)
    assert lowered.lowered([Timer("k", "c", 9)]) == lowered


def test_a_floor_that_knows_nothing_stays_so() -> None:
    assert NO_FLOOR.lowered([Timer("k", "a", 12)]) == NO_FLOOR
    assert NO_FLOOR.of(TimeDomain.EVENT_TIME) is None


def test_a_floor_is_raised_to_where_a_read_ended_or_to_the_first_entry_it_left() -> None:
    read_below = TimerFloor(event_time=25, wall_time=101)
    floor = TimerFloor(event_time=10, wall_time=None)
    assert floor.raised(read_below, []) == read_below
    left = [Timer("k", "a", 12), Timer("j", "w", 90, TimeDomain.WALL_TIME)]
    assert floor.raised(read_below, left) == TimerFloor(event_time=12, wall_time=90)
    # Never below what it knew: a read that ended below the floor read nothing.
    assert TimerFloor(40, 200).raised(read_below, []) == TimerFloor(40, 200)
