"""Every engine module's ``__all__`` names exactly its public classes and functions."""

import importlib
import inspect
import pkgutil
from types import ModuleType

import pytest

import millstream.engine

pytestmark = pytest.mark.unit


def engine_modules() -> list[str]:
    return sorted(
        info.name
        for info in pkgutil.walk_packages(millstream.engine.__path__, "millstream.engine.")
        # Backends that need a running service import their driver lazily or not at all;
        # the Spark session module pulls in pyspark, which is not part of the engine core.
        if not info.name.endswith("spark_session")
    )


def defined_here(module: ModuleType) -> set[str]:
    return {
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and (inspect.isclass(value) or inspect.isfunction(value))
        and value.__module__ == module.__name__
    }


@pytest.mark.parametrize("name", engine_modules())
def test_all_is_honest(name: str) -> None:
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
