"""``millstream produce`` and ``millstream tail``: their exit codes without services, then
both commands against the real Kafka."""

from __future__ import annotations

import hashlib
import io
import json
import sys
from collections.abc import Callable
from typing import Any, TextIO

import pytest

from millstream import cli
from millstream.connectors import streams
from millstream.engine.config import MillstreamConfig


def _tail_printing(lines: int, then: BaseException | None = None) -> Callable[..., int]:
    """A stand-in for ``streams.tail_stream`` that prints ``lines`` records, then raises
    ``then`` (Ctrl-C) or returns."""

    def tail_stream(config: MillstreamConfig, stream: str, *, out: TextIO, **options: Any) -> int:
        for offset in range(lines):
            out.write(json.dumps({"stream": stream, "offset": offset}) + "\n")
            out.flush()
        if then is not None:
            raise then
        return lines

    return tail_stream


@pytest.mark.unit
@pytest.mark.parametrize(
    ("options", "printed", "then", "code"),
    [
        ([], 2, None, 0),
        ([], 0, None, 1),  # nothing found
        (["--follow"], 1, KeyboardInterrupt(), 0),  # how --follow ends
        (["--follow"], 0, KeyboardInterrupt(), 1),
        ([], 1, KeyboardInterrupt(), 130),  # interrupted before the end
    ],
)
def test_tail_exits_1_when_it_printed_no_record(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    options: list[str],
    printed: int,
    then: BaseException | None,
    code: int,
) -> None:
    monkeypatch.setattr(streams, "tail_stream", _tail_printing(printed, then))
    assert cli.main(["tail", "clicks", *options]) == code
    shown = capsys.readouterr()
    assert len(shown.out.splitlines()) == printed
    assert shown.err == ("millstream tail: interrupted\n" if code == 130 else "")


@pytest.mark.integration
def test_produce_then_tail_through_the_command(
    services: MillstreamConfig,
    kafka_topic: Callable[..., str],
    unique: Callable[[str], str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    stream = kafka_topic(partitions=1)
    lines = [
        b'{"key": "u1", "value": {"q": "kafka"}, "timestamp": 1700000000000000, "id": "a"}',
        b'{"key": "u2", "value": "caf\xe9"}',  # Latin-1, not UTF-8: this line alone is refused
        b'{"key": "u2", "value": "caf\xc3\xa9", "timestamp": 1700000001000000}',
    ]
    stdin = io.TextIOWrapper(io.BytesIO(b"\n".join(lines) + b"\n"), encoding="utf-8")
    monkeypatch.setattr(sys, "stdin", stdin)
    assert cli.main(["produce", stream, "--source", "cli-test"]) == 1
    errors = capsys.readouterr().err.splitlines()
    assert errors[0].startswith("line 2 rejected: not UTF-8: ")
    assert errors[1] == (
        f"millstream produce: 2 records sent to stream {stream!r}, 1 line rejected; event times "
        "1700000000000000 (2023-11-14T22:13:20.000000Z) to 1700000001000000 "
        "(2023-11-14T22:13:21.000000Z)"
    )

    assert cli.main(["tail", stream, "--from-beginning", "--value", "json"]) == 0
    shown = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(e["offset"], e["key"], e["value"], e["time"]) for e in shown] == [
        (0, "u1", {"q": "kafka"}, "2023-11-14T22:13:20.000000Z"),
        (1, "u2", "café", "2023-11-14T22:13:21.000000Z"),
    ]
    assert shown[0]["record_id"] == (
        hashlib.blake2b(b"produce/cli-test/a", digest_size=16).hexdigest()
    )

    # The same input again (all lines good this time): the records are there twice, each ID once.
    monkeypatch.setattr(sys, "stdin", io.StringIO(lines[0].decode() + "\n"))
    assert cli.main(["produce", stream, "--source", "cli-test"]) == 0
    capsys.readouterr()
    assert cli.main(["tail", stream, "--from-beginning", "--dedup"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2
    assert cli.main(["tail", stream, "--from-beginning", "--max", "3"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 3

    missing = unique("missing")
    assert cli.main(["tail", missing]) == 2
    assert capsys.readouterr().err == (
        f"millstream tail: error: stream {missing!r} has no topic; nothing was produced to it yet\n"
    )
