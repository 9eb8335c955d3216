"""The user's code on the executors: shipped by value, so a job runs without installing it.

Spark's Python workers import millstream and whatever is installed where they run, but not
the modules of a job started from its own directory (``python -m my_job``,
``millstream run my_job:topology``): pickled by reference, its computations would fail to load
there. :func:`ship_user_code` registers the top-level package (or module) of every class and
function a topology names with cloudpickle's ``register_pickle_by_value``, so their code
travels with each task. What is installed (the standard library, site-packages, millstream
itself) stays pickled by reference. The runner calls it for every topology it starts and
every computation added to one.
"""

from __future__ import annotations

import site
import sys
import sysconfig
from collections.abc import Iterable, Iterator
from functools import cache
from pathlib import Path
from types import ModuleType

from millstream.engine.topology import ComputationSpec

__all__ = ["ship_user_code", "user_modules"]

# Shipped by reference always: installed with millstream wherever it runs.
_INSTALLED_PACKAGES = frozenset({"millstream", "pyspark", "py4j"})


def ship_user_code(specs: Iterable[ComputationSpec]) -> list[str]:
    """Register the user packages of ``specs`` to be pickled by value; returns their names
    (each once, in the order found)."""
    from pyspark import cloudpickle

    names = []
    for module in user_modules(specs):
        cloudpickle.register_pickle_by_value(module)  # type: ignore[no-untyped-call]
        names.append(module.__name__)
    return names


def user_modules(specs: Iterable[ComputationSpec]) -> list[ModuleType]:
    """The top-level packages (or modules) of the user code ``specs`` name: the classes of
    their computations and of those computations' attributes, and their key extractors."""
    found: dict[str, ModuleType] = {}
    for spec in specs:
        for name in _module_names(spec):
            module = _outermost(name)
            if module is not None and module.__name__ not in found and _is_user_code(module):
                found[module.__name__] = module
    return list(found.values())


def _outermost(name: str) -> ModuleType | None:
    """The outermost imported package of module ``name`` (a module loaded from its file
    alone, as pytest loads tests, may have no imported parent: then itself)."""
    parts = name.split(".")
    for end in range(1, len(parts) + 1):
        module = sys.modules.get(".".join(parts[:end]))
        if module is not None:
            return module
    return None


def _module_names(spec: ComputationSpec) -> Iterator[str]:
    computation = spec.computation
    yield type(computation).__module__
    for value in vars(computation).values() if hasattr(computation, "__dict__") else ():
        yield type(value).__module__
        if callable(value):
            yield getattr(value, "__module__", None) or ""
    for stream in spec.inputs:
        yield getattr(stream.key_extractor, "__module__", None) or ""


def _is_user_code(module: ModuleType) -> bool:
    if module.__name__ in _INSTALLED_PACKAGES or module.__name__ == "__main__":
        return False  # __main__ is pickled by value anyway
    file = getattr(module, "__file__", None)
    # A namespace package (a directory without __init__.py) has only its directories.
    places = [file] if file is not None else list(getattr(module, "__path__", ()))
    if not places:
        return False  # built in
    roots = _installed_roots()
    return not any(Path(place).resolve().is_relative_to(root) for place in places for root in roots)


@cache
def _installed_roots() -> tuple[Path, ...]:
    paths = sysconfig.get_paths()
    roots = {paths[key] for key in ("stdlib", "platstdlib", "purelib", "platlib") if key in paths}
    roots.update(site.getsitepackages())
    roots.add(site.getusersitepackages())
    return tuple(Path(root).resolve() for root in roots)
