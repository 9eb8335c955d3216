"""``millstream up``, ``status``, ``down``: exit codes and output, on a stand-in stack (the real
one is exercised by ``tests/devtools/local``)."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

import pytest

from millstream import cli
from millstream.devtools.local import stack as stack_module
from millstream.devtools.local.service import ServiceStatus
from millstream.engine.config import MillstreamConfig

pytestmark = pytest.mark.unit


def _stack(statuses: list[ServiceStatus]) -> Callable[..., object]:
    """A stand-in for ``LocalStack`` whose services report ``statuses``."""

    class Stack:
        def __init__(
            self, config: MillstreamConfig, progress: Callable[[str], None], **options: object
        ) -> None:
            self.config = config
            self.services = [SimpleNamespace(name=status.name) for status in statuses]

        def status(self) -> list[ServiceStatus]:
            return statuses

    return Stack


@pytest.mark.parametrize(
    ("kafka_healthy", "code"), [(True, 0), (False, 1)], ids=["healthy", "kafka-down"]
)
def test_status_exits_1_when_a_service_is_not_healthy(
    kafka_healthy: bool,
    code: int,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    statuses = [
        ServiceStatus("cassandra", 41, "127.0.0.1:9042", True),
        ServiceStatus("kafka", 42 if kafka_healthy else None, "127.0.0.1:9092", kafka_healthy),
    ]
    monkeypatch.setattr(stack_module, "LocalStack", _stack(statuses))
    assert cli.main(["status"]) == code
    shown = capsys.readouterr().out.splitlines()
    assert shown[0].startswith("cassandra  healthy")
    assert shown[1].startswith("kafka      " + ("healthy" if kafka_healthy else "stopped"))


@pytest.mark.parametrize("command", ["up", "status", "down"])
def test_the_secured_stack_has_one_node(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as refused:
        cli.main([command, "--secure", "--nodes", "3"])
    assert refused.value.code == 2
    assert "argument --nodes: not allowed with argument --secure" in capsys.readouterr().err
