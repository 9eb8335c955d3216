"""Making the engine's frozen, slotted dataclasses fast on the per-record path.

A worker makes several small immutable objects for every record it routes and runs (its
origin, its delivery, the records it decodes and produces, their productions). A frozen
dataclass's generated ``__init__`` sets each field through ``object.__setattr__``, and
:class:`~millstream.engine.records.Record` checks every field after; together that was a
fifth of a worker's Python per record (``bench/record_path.py``). :func:`slot_constructor`
makes a function that sets a class's slots straight, through their descriptors, as
``dataclasses`` itself writes ``__init__``: the same object, for a third to half the cost,
without ``__post_init__``. Its callers pass fields they have checked.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["slot_constructor"]

T = TypeVar("T")


def slot_constructor(cls: type[T]) -> Callable[..., T]:
    """A function taking every field of the frozen, slotted dataclass ``cls``, positionally
    and in order (defaults included), and returning the instance they make, without running
    its ``__init__`` or ``__post_init__``."""
    if not dataclasses.is_dataclass(cls) or "__slots__" not in vars(cls):
        raise TypeError(f"{cls.__name__} is not a slotted dataclass")
    names = [field.name for field in dataclasses.fields(cls)]
    namespace: dict[str, Any] = {"_new": object.__new__, "_cls": cls}
    lines = [f"def make({', '.join(names)}):", "    made = _new(_cls)"]
    for name in names:
        namespace[f"_set_{name}"] = vars(cls)[name].__set__
        lines.append(f"    _set_{name}(made, {name})")
    lines.append("    return made")
    exec("\n".join(lines), namespace)
    make: Callable[..., T] = namespace["make"]
    make.__qualname__ = make.__name__ = f"make_{cls.__name__}"
    return make
