"""The runner ships a job's own code to the executors, and nothing that is installed."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, cast

import pytest

from millstream.engine import Computation, Context, Record, Topology
from millstream.engine.config import MillstreamConfig
from millstream.engine.errors import TopologyError
from millstream.engine.topology import ComputationSpec
from millstream.spark import AvailableNow, RunningTopology, RunSettings
from millstream.spark.user_code import user_modules

pytestmark = pytest.mark.unit

JOB = """
from millstream.engine import Computation, Record
from {package}.helpers import Params, key_of


class Job(Computation):
    def __init__(self) -> None:
        self.params = Params()

    def process_record(self, ctx, record: Record) -> None:
        ctx.produce("out", record.value, record.timestamp)
"""
HELPERS = """
from dataclasses import dataclass
from millstream.engine import Record


@dataclass
class Params:
    threshold: float = 3.0


def key_of(record: Record) -> str:
    return record.key
"""


@pytest.fixture
def user_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """A package of a user's job, importable from a directory of its own (not installed)."""
    name = f"userjob_{tmp_path.name.replace('-', '_')}"
    package = tmp_path / name
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "job.py").write_text(JOB.format(package=name))
    (package / "helpers.py").write_text(HELPERS)
    monkeypatch.syspath_prepend(str(tmp_path))
    __import__(f"{name}.job")
    yield sys.modules[f"{name}.job"]
    for module in [m for m in sys.modules if m == name or m.startswith(f"{name}.")]:
        del sys.modules[module]


class Installed(Computation):
    """A computation of millstream's own tests: a package the test run imports."""

    def process_record(self, ctx: Context, record: Record) -> None:
        pass


def test_the_user_package_of_a_computation_and_its_key_extractor_is_found(
    user_package: ModuleType,
) -> None:
    topology = Topology("t")
    helpers = sys.modules[user_package.__name__.replace(".job", ".helpers")]
    topology.add_computation(
        "c", user_package.Job(), inputs={"in": helpers.key_of}, outputs=["out"]
    )
    top = sys.modules[user_package.__name__.partition(".")[0]]
    assert user_modules(topology.computations.values()) == [top]


def test_installed_code_and_millstream_stay_pickled_by_reference() -> None:
    from millstream.engine.testing import TestingSink

    class Holder(Computation):
        def __init__(self) -> None:
            self.sink = TestingSink()  # millstream's
            self.path = Path("/")  # the standard library's

        def process_record(self, ctx: Context, record: Record) -> None:
            pass

    spec = ComputationSpec("c", Holder(), (), ())
    found = [module.__name__ for module in user_modules([spec])]
    # Only this test module (loaded from its file by pytest, not installed) is shipped.
    assert found in ([], [__name__.partition(".")[0]], [__name__])
    assert not any(name.startswith(("millstream", "pathlib")) for name in found)


def test_run_topology_keywords_are_deprecated_in_favour_of_run_settings() -> None:
    topology = Topology("t", streams=["in"])
    topology.add_computation("c", Installed(), inputs=["in"], outputs=["out"])
    config = MillstreamConfig()
    spark = cast(Any, object())  # never used: nothing starts
    with pytest.warns(DeprecationWarning, match=r"RunningTopology\(keyspace=\.\.\., partitions"):
        running = RunningTopology(
            topology, config, trigger=AvailableNow(), spark=spark, keyspace="k", partitions=4
        )
    assert running.settings == RunSettings(keyspace="k", partitions=4)
    with pytest.raises(TypeError, match="unexpected keyword argument 'key_space'"):
        RunningTopology(topology, config, trigger=AvailableNow(), spark=spark, key_space="k")
    settings = RunSettings(keyspace="k", checkpoint_root=Path("/srv/checkpoints"))
    running = RunningTopology(topology, config, settings, trigger=AvailableNow(), spark=spark)
    assert running.checkpoint("c") == Path("/srv/checkpoints/t/c")
    with pytest.raises(TopologyError, match="needs a ProcessingTime trigger"):
        running.await_input_complete(timeout=1)


def test_connect_injector_keywords_are_deprecated_at_the_call() -> None:
    from millstream.injectors import LogFileSource, LogLine, connect_injector

    source = LogFileSource("/nonexistent", lambda line: LogLine(0, "k", b""), "s")
    with pytest.warns(DeprecationWarning, match=r"connect_injector\(keyspace=\.\.\.\)"):
        connect_injector(MillstreamConfig(), "n", source, keyspace="k")  # not entered
    with pytest.raises(TypeError, match="unexpected keyword argument 'spark'"):
        connect_injector(MillstreamConfig(), "n", source, spark=None)
