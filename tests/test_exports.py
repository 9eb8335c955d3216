"""Every public module's ``__all__`` names exactly its public classes and functions."""

import importlib
import inspect
import pkgutil
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

import pytest

import millstream.engine
from tests.test_packaging import installed_packages

pytestmark = pytest.mark.unit


@contextmanager
def aliases_imported_quietly() -> Iterator[None]:
    """Imports without the deprecated aliases' warnings (tests/spark/test_layout.py checks
    that they warn)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        yield


def public_modules() -> list[str]:
    names = installed_packages()
    with aliases_imported_quietly():  # walking imports each package, the aliases' too
        for package in map(importlib.import_module, installed_packages()):
            prefix = f"{package.__name__}."
            names += [i.name for i in pkgutil.walk_packages(package.__path__, prefix)]
    return sorted(names)


def defined_here(module: ModuleType) -> set[str]:
    return {
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and (inspect.isclass(value) or inspect.isfunction(value))
        and value.__module__ == module.__name__
    }


@pytest.mark.parametrize("name", public_modules())
def test_all_is_honest(name: str) -> None:
    with aliases_imported_quietly():
        module = importlib.import_module(name)
    exported = getattr(module, "__all__", None)
    if exported is None:
        assert not defined_here(module), f"{name} defines public names but has no __all__"
        return
    assert len(exported) == len(set(exported)), f"{name}.__all__ lists a name twice"
    missing = [n for n in exported if not hasattr(module, n)]
    assert not missing, f"{name}.__all__ names what it does not define: {missing}"
    unlisted = defined_here(module) - set(exported)
    assert not unlisted, f"{name} does not export {sorted(unlisted)}"


def test_the_front_door_reexports_the_model_names_from_their_modules() -> None:
    exported = millstream.engine.__all__
    assert exported, "millstream.engine exports nothing"
    for name in exported:
        value = getattr(millstream.engine, name)
        if not hasattr(value, "__module__"):  # a constant: found by its public home's name
            homes = [
                module
                for module_name, module in sorted(sys.modules.items())
                if module_name.startswith("millstream.engine.")
                and name in getattr(module, "__all__", ())
                and getattr(module, name) is value
            ]
            assert homes, f"{name} is public in no module of millstream.engine"
            continue
        home = importlib.import_module(value.__module__)
        assert getattr(home, name) is value
        assert name in home.__all__, f"{name} is not public in {home.__name__}"
