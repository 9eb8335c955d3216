"""``millstream prove``: its arguments, without services (the proving ground itself runs in
``tests/devtools/proving/test_ground.py``)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from millstream import cli
from millstream.cli import prove as prove_command

pytestmark = pytest.mark.unit


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> list[argparse.Namespace]:
    """The arguments of each run the command starts (none is started for real)."""
    started: list[argparse.Namespace] = []

    def run(args: argparse.Namespace) -> int:
        started.append(args)
        return 0

    monkeypatch.setattr(prove_command, "run", run)
    return started


def test_the_report_file_is_taken_from_where_the_command_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seen: list[argparse.Namespace]
) -> None:
    (tmp_path / "reports").mkdir()
    monkeypatch.chdir(tmp_path)
    assert cli.main(["prove", "--json", "reports/soak.json"]) == 0
    assert seen[0].json == tmp_path / "reports" / "soak.json"


def test_a_report_file_in_a_missing_directory_is_refused_before_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(prove_command, "run", lambda args: pytest.fail("the run started"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as refused:
        cli.main(["prove", "--json", "reports/soak.json"])
    assert refused.value.code == 2
    assert (
        f"argument --json: directory {str(tmp_path / 'reports')!r} does not exist"
        in capsys.readouterr().err
    )


@pytest.mark.parametrize(
    ("flags", "one_query"), [([], None), (["--one-query"], True), (["--query-each"], False)]
)
def test_the_way_the_topology_runs_is_left_to_the_configuration_unless_a_flag_says(
    seen: list[argparse.Namespace], flags: list[str], one_query: bool | None
) -> None:
    assert cli.main(["prove", *flags]) == 0
    assert seen[0].one_query is one_query


def test_one_query_and_query_each_are_refused_together(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(prove_command, "run", lambda args: pytest.fail("the run started"))
    with pytest.raises(SystemExit) as refused:
        cli.main(["prove", "--one-query", "--query-each"])
    assert refused.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err
