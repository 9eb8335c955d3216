"""The quarantine: messages a computation's query isolated as poison pills, kept durably.

Once :mod:`~millstream.spark.isolation` has pinned a failing batch on a few records, each is
written to the query's checkpoint directory, next to millstream's claim file
(:mod:`millstream.spark.checkpoint`), one small JSON file per message:
``<checkpoint>/millstream-quarantine/<topic>@<partition>@<offset>.json``, with the error and
the failing worker's traceback. Written whole under a temporary name and renamed, as the claim
is: a reader sees the entry or nothing.

From then on the query's router rejects the message before decoding it (decoding may be
what crashes) with a :class:`~millstream.engine.errors.PoisonRecordError` carrying that error,
and the rejected message becomes a dead letter like any other, atomically with the commit of
the interval that works rejected input, exactly once (its dedup ID is derived from its
position). A restarted driver reads the folder as it starts its query, so the batch it
replays skips the message at once; the quarantine of a computation lives and goes with its
checkpoint.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Final

from millstream.engine.deadletters import MAX_ERROR_MESSAGE_CHARS
from millstream.engine.errors import TopologyError
from millstream.spark.isolation import OffsetRange, Position

__all__ = [
    "MAX_TRACEBACK_CHARS",
    "QUARANTINE_DIRECTORY",
    "Quarantine",
    "QuarantinedRecord",
    "python_traceback",
]

QUARANTINE_DIRECTORY: Final = "millstream-quarantine"

MAX_TRACEBACK_CHARS: Final = 3_000
"""The end of a failing worker's traceback kept with a quarantined message (its last frames
and the error: the part that says where the engine failed)."""

_TRACEBACK: Final = "Traceback (most recent call last)"
_JVM_FRAME: Final = re.compile(r"^\s+at [\w$.]+\(.*\)$")


@dataclass(frozen=True, slots=True)
class QuarantinedRecord:
    """A message a query isolated: where it is, when and in which batch of which
    computation it was isolated (``quarantined_at``: µs, the driver's clock), and what
    the engine said (``error``: the error's line; ``traceback``: the failing worker's)."""

    topic: str
    partition: int
    offset: int
    computation: str
    batch_id: int
    quarantined_at: int
    error: str
    traceback: str

    @property
    def position(self) -> Position:
        return Position(self.topic, self.partition, self.offset)

    def message(self) -> str:
        """The :class:`~millstream.engine.errors.PoisonRecordError` message of its dead
        letter: what happened and what to do, the error, then the traceback (cut to fit)."""
        head = (
            f"message {self.position} made the engine of computation {self.computation!r} fail "
            f"whenever it was in batch {self.batch_id}, so it was isolated and quarantined; "
            "report the error with this dead letter's raw bytes, and produce them again to "
            "run the record once it is fixed. "
            f"{self.error}"
        )
        room = MAX_ERROR_MESSAGE_CHARS - len(head) - 1
        return f"{head}\n{self.traceback[-room:]}" if room > 0 else head


class Quarantine:
    """The quarantined messages of one query (its ``checkpoint`` directory)."""

    def __init__(self, checkpoint: Path) -> None:
        self.directory = checkpoint / QUARANTINE_DIRECTORY
        self.records: dict[Position, QuarantinedRecord] = {}

    def load(self) -> dict[Position, QuarantinedRecord]:
        """Read every entry from the folder (none yet: empty)."""
        records: dict[Position, QuarantinedRecord] = {}
        if self.directory.exists():
            for file in sorted(self.directory.glob("*.json")):
                try:
                    record = QuarantinedRecord(**json.loads(file.read_text(encoding="utf-8")))
                except (ValueError, TypeError) as exc:
                    raise TopologyError(
                        f"cannot read the quarantine entry {file}: {exc}; it was not written by "
                        "millstream, or edited: remove it (the message it names is then run "
                        "again if its batch replays)"
                    ) from exc
                records[record.position] = record
        self.records = records
        return records

    def add(self, record: QuarantinedRecord) -> None:
        """Write ``record``'s entry (whole: a temporary file renamed over it)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        name = f"{record.topic}@{record.partition}@{record.offset}.json"
        written = self.directory / f".{name}.{uuid.uuid4().hex}"
        written.write_text(json.dumps(asdict(record), indent=1), encoding="utf-8")
        os.replace(written, self.directory / name)
        self.records[record.position] = record

    def within(self, ranges: Iterable[OffsetRange]) -> dict[Position, str]:
        """The quarantined messages among ``ranges`` (a batch's), each with its
        :class:`~millstream.engine.errors.PoisonRecordError` message."""
        if not self.records:
            return {}
        ranges = list(ranges)
        return {
            position: record.message()
            for position, record in self.records.items()
            if any(position in r for r in ranges)
        }


def python_traceback(error: BaseException | str, limit: int = MAX_TRACEBACK_CHARS) -> str:
    """The last Python traceback in ``error``'s text (a failed Spark task's, wrapped in JVM
    frames by Py4J), without the JVM frames after it, cut to its last ``limit`` characters;
    the whole text's end when it has none."""
    text = str(error)
    start = text.rfind(_TRACEBACK)
    if start < 0:
        return text[-limit:]
    lines: list[str] = []
    for line in text[start:].splitlines():
        if _JVM_FRAME.match(line):
            break
        lines.append(line)
    return "\n".join(lines).rstrip()[-limit:]
