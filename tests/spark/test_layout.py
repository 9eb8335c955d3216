"""The Spark runtime is a package apart: the model does without it, old names still work."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import millstream.spark as spark_package

pytestmark = pytest.mark.unit

MODEL_MODULES = [
    "millstream.engine",
    "millstream.engine.protocol",
    "millstream.engine.routing",
    "millstream.engine.testing",
    "millstream.engine.watermarks",
    "millstream.engine.stores.memory",
    "millstream.engine.stores.cassandra",
]


def test_the_model_imports_neither_spark_nor_the_connectors() -> None:
    # ruff's banned-api rule (pyproject.toml) checks the source; this checks what an import
    # really loads, indirect imports included, in a fresh interpreter.
    script = (
        "import importlib, sys\n"
        f"for name in {MODEL_MODULES!r}: importlib.import_module(name)\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] == 'pyspark'\n"
        "             or m.startswith(('millstream.spark', 'millstream.connectors')))\n"
        "print(','.join(bad))\n"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", script], check=True, capture_output=True, text=True
    ).stdout.strip()
    assert loaded == "", f"the model loaded {loaded}"


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("millstream.engine.spark_runner", "millstream.spark.runner"),
        ("millstream.engine.spark_executor", "millstream.spark.executor"),
        ("millstream.engine.spark_session", "millstream.spark.session"),
        ("millstream.engine.spark", "millstream.spark"),
        ("millstream.engine.spark.runner", "millstream.spark.runner"),
        ("millstream.engine.spark.batch", "millstream.spark.batch"),
        ("millstream.engine.cli", "millstream.cli"),
        ("millstream.connectors.local.artifacts", "millstream.connectors.maven"),
        ("millstream.connectors.local.stack", "millstream.devtools.local.stack"),
        (
            "millstream.connectors.local.spark_standalone",
            "millstream.devtools.local.spark_standalone",
        ),
        ("millstream.connectors.proving", "millstream.devtools.proving"),
    ],
)
def test_the_old_module_names_warn_and_give_the_same_objects(old: str, new: str) -> None:
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=new):
        alias = importlib.import_module(old)
    moved = importlib.import_module(new)
    assert alias.__all__ == moved.__all__
    for name in moved.__all__:
        assert getattr(alias, name) is getattr(moved, name)


def test_the_package_exports_the_entry_points() -> None:
    from millstream.spark.runner import RunningTopology, run_topology

    assert spark_package.run_topology is run_topology
    assert spark_package.RunningTopology is RunningTopology
