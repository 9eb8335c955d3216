"""slot_constructor: the same frozen objects as the dataclass makes, without its checks."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import pytest

from millstream.engine.slots import slot_constructor

pytestmark = pytest.mark.unit


@dataclass(frozen=True, slots=True)
class Point:
    x: int
    y: int = 0
    tags: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        if self.x < 0:
            raise ValueError("x must be non-negative")


def test_it_makes_what_the_dataclass_makes_from_every_field_in_order() -> None:
    make = slot_constructor(Point)
    made = make(3, 4, ("a",))
    assert type(made) is Point
    assert made == Point(3, 4, ("a",))
    assert hash(made) == hash(Point(3, 4, ("b",)))  # tags do not compare, as declared
    assert (made.x, made.y, made.tags) == (3, 4, ("a",))
    assert repr(made) == "Point(x=3, y=4, tags=('a',))"
    assert make.__name__ == "make_Point"


def test_what_it_makes_stays_frozen() -> None:
    made = slot_constructor(Point)(1, 2, ())
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.x = 5  # type: ignore[misc]


def test_it_runs_no_checks_its_caller_must_have_made_them() -> None:
    assert slot_constructor(Point)(-1, 0, ()).x == -1
    with pytest.raises(ValueError, match="non-negative"):
        Point(-1)


def test_a_dataclass_without_slots_or_a_class_is_refused() -> None:
    @dataclass(frozen=True)
    class Plain:
        x: int

    with pytest.raises(TypeError, match="not a slotted dataclass"):
        slot_constructor(Plain)
    with pytest.raises(TypeError, match="not a slotted dataclass"):
        slot_constructor(int)
    with pytest.raises(TypeError):
        slot_constructor(Point)(1, 2)  # every field, defaults included
