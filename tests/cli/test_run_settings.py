"""`millstream run`'s flags feed the run's settings: each flag given overrides its [run]
setting, and the settings the flags leave alone come from the configuration."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from millstream import cli
from millstream.engine.config import RunSettings
from millstream.spark import runner

pytestmark = pytest.mark.unit

TOPOLOGY = """
from millstream.engine import Topology

topology = Topology("flags", streams=["in"])
"""


class Started:
    """What run_topology returned, for a command that asks for everything available."""

    def __init__(self, settings: RunSettings) -> None:
        self.settings = settings

    def process_available(self) -> int:
        return 1

    def stop(self) -> None:
        pass

    def metrics(self) -> dict[str, Any]:
        return {}


@pytest.fixture(autouse=True)
def no_run_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only what a test sets: no configuration file, no MILLSTREAM_RUN_* from outside."""
    monkeypatch.delenv("MILLSTREAM_CONFIG", raising=False)
    for variable in [v for v in os.environ if v.startswith("MILLSTREAM_RUN_")]:
        monkeypatch.delenv(variable)


def run(args: list[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> RunSettings:
    module = f"flags_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{module}.py").write_text(TOPOLOGY)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    taken: list[RunSettings] = []

    def run_topology(topology: Any, config: Any, settings: RunSettings, **_: Any) -> Started:
        taken.append(settings)
        return Started(settings)

    monkeypatch.setattr(runner, "run_topology", run_topology)
    try:
        assert cli.main(["run", f"{module}:topology", "--available-now", *args]) == 0
    finally:
        sys.modules.pop(module, None)
    (settings,) = taken
    return settings


def test_run_flags_override_the_run_table(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MILLSTREAM_RUN_KEYSPACE", "from_env")
    monkeypatch.setenv("MILLSTREAM_RUN_MAX_OFFSETS_PER_TRIGGER", "500")
    monkeypatch.setenv("MILLSTREAM_RUN_TOPIC_PARTITIONS", "in=3")
    settings = run(
        [
            "--keyspace=from_flag",
            "--partitions=4",
            "--no-create-keyspace",
            "--one-query",
            "--metrics-port=0.0.0.0:9400",
            f"--checkpoint-root={tmp_path / 'ckpt'}",
        ],
        monkeypatch,
        tmp_path,
    )
    assert settings == RunSettings(
        keyspace="from_flag",
        create_keyspace=False,
        checkpoint_root=tmp_path / "ckpt",
        partitions=4,
        topic_partitions={"in": 3},
        max_offsets_per_trigger=500,
        metrics_port=9400,
        metrics_address="0.0.0.0",
        one_query=True,
    )


def test_without_flags_the_run_table_holds(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MILLSTREAM_RUN_KEYSPACE", "from_env")
    monkeypatch.setenv("MILLSTREAM_RUN_CREATE_KEYSPACE", "false")
    monkeypatch.setenv("MILLSTREAM_RUN_METRICS_PORT", "9401")
    assert run([], monkeypatch, tmp_path) == RunSettings(
        keyspace="from_env", create_keyspace=False, metrics_port=9401
    )


def test_query_each_overrides_a_topology_configured_in_one_query(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("MILLSTREAM_RUN_ONE_QUERY", "true")
    assert run([], monkeypatch, tmp_path).one_query is True
    assert run(["--query-each"], monkeypatch, tmp_path).one_query is False
    with pytest.raises(SystemExit):  # one or the other
        run(["--query-each", "--one-query"], monkeypatch, tmp_path)
