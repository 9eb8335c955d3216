"""The ``millstream`` command as a whole: plain help, and the same exit codes and error lines
for every command (:func:`millstream.cli.guarded`)."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections.abc import Callable

import pytest

from millstream import cli
from millstream.engine import config as config_module
from millstream.engine.errors import ConfigError

pytestmark = pytest.mark.unit

COMMANDS = [
    "up",
    "status",
    "down",
    "jars",
    "run",
    "produce",
    "tail",
    "watermarks",
    "state",
    "ui",
    "prove",
]
# The fewest arguments each command runs with.
ARGUMENTS = {"run": ["jobs:topology"], "produce": ["s"], "tail": ["s"], "state": ["c", "k"]}
# What reStructuredText and Sphinx markup look like.
MARKUP = re.compile(r"``|:(mod|func|class|meth|data|attr):|::")


def help_of(*command: str, capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as done:
        cli.main([*command, "--help"])
    assert done.value.code == 0
    return capsys.readouterr().out


def test_the_top_level_help_is_plain_and_lists_every_command_and_the_exit_codes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    shown = help_of(capsys=capsys)
    assert not MARKUP.search(shown), shown
    assert "{" + ",".join(COMMANDS) + "}" in shown
    for command in COMMANDS:
        (line,) = [line for line in shown.splitlines() if line.startswith(f"    {command} ")]
        assert line[len(command) + 4 :].strip(), f"{command} has no one-line help"
    exit_codes = shown[shown.index("Exit codes") :]
    for code in ("0", "1", "2", "130"):
        assert re.search(rf"^  {code} +\S", exit_codes, re.MULTILINE), code


def test_the_module_docstring_documents_the_exit_codes_the_help_shows(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.__doc__ is not None
    documented = cli.__doc__[cli.__doc__.index("Exit codes") :].strip()
    assert documented in help_of(capsys=capsys)


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_a_plain_description(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    shown = help_of(command, capsys=capsys)
    assert shown.startswith(f"usage: millstream {command}")
    description = shown.split("\n\n")[1]
    assert len(description.split()) >= 8, f"millstream {command} has no description"
    assert not MARKUP.search(shown), shown


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_reports_a_configuration_error_the_same_way(
    command: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken() -> None:
        raise ConfigError("[kafka] bootstrap is malformed; set MILLSTREAM_KAFKA_BOOTSTRAP")

    monkeypatch.setattr(config_module, "load_config", broken)
    assert cli.main([command, *ARGUMENTS.get(command, [])]) == 2
    shown = capsys.readouterr()
    assert shown.err == (
        f"millstream {command}: error: [kafka] bootstrap is malformed; set "
        "MILLSTREAM_KAFKA_BOOTSTRAP\n"
    )
    assert shown.out == ""


def test_a_usage_error_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as refused:
        cli.main(["tail", "s", "--max", "0"])
    assert refused.value.code == 2
    assert "argument --max: must be at least 1, not 0" in capsys.readouterr().err


def _failing(error: BaseException) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        raise error

    return run


def _kafka_error() -> Exception:
    from confluent_kafka import KafkaError, KafkaException

    return KafkaException(KafkaError(KafkaError._TRANSPORT, "Connection refused"))


def _cassandra_error() -> Exception:
    from cassandra.cluster import NoHostAvailable

    error: Exception = NoHostAvailable(
        "Unable to connect to any servers", {"127.0.0.1:9042": OSError()}
    )
    return error


@pytest.mark.parametrize(
    ("error", "said"),
    [
        (
            _kafka_error(),
            "Kafka at 127.0.0.9:9092: KafkaError{code=_TRANSPORT,val=-195,"
            'str="Connection refused"}; if it is down,',
        ),
        (_cassandra_error(), "Cassandra at 127.0.0.9 port 9042: ('Unable to connect"),
        (TimeoutError("no answer within 30 s"), "Kafka or Cassandra: no answer within 30 s;"),
    ],
    ids=["kafka", "cassandra", "timeout"],
)
def test_a_service_that_does_not_answer_is_a_one_line_error_saying_where(
    error: Exception,
    said: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("MILLSTREAM_KAFKA_BOOTSTRAP", "127.0.0.9:9092")
    monkeypatch.setenv("MILLSTREAM_CASSANDRA_HOSTS", "127.0.0.9")
    monkeypatch.setenv("MILLSTREAM_CASSANDRA_PORT", "9042")
    assert cli.guarded(_failing(error))(argparse.Namespace(command="tail")) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"millstream tail: error: {said}"), line
    assert "`millstream status` shows the local stack and `millstream up` starts it" in line
    assert "if it runs elsewhere, set MILLSTREAM_" in line


def test_an_unexpected_error_is_shown_with_its_traceback_and_exits_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    failing = _failing(ZeroDivisionError("division by zero"))
    assert cli.guarded(failing)(argparse.Namespace(command="state")) == 2
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):")
    assert "ZeroDivisionError: division by zero\n" in err
    assert err.endswith(
        "millstream state: unexpected error (ZeroDivisionError); this is a bug in millstream: "
        "please report it with the traceback above\n"
    )


def test_ctrl_c_exits_130(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.guarded(_failing(KeyboardInterrupt()))(argparse.Namespace(command="run")) == 130
    assert capsys.readouterr().err == "millstream run: interrupted\n"


def test_a_command_s_own_exit_code_passes_through() -> None:
    assert cli.guarded(lambda args: 1)(argparse.Namespace(command="state")) == 1


def test_python_dash_m_runs_the_command() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "millstream.cli", "tail", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: millstream tail")
