"""The log-file injector: tails the files of a directory into a stream (paper 5.2, figure 10).

Every line of every file matching ``pattern`` becomes one record, through a user ``parse``
function that returns the line's event time (µs), key and value (or ``None`` to skip it).
A line ``parse`` rejects (it raises, or the line is not UTF-8) becomes a dead letter with
its file and offset; the injector goes on.

* **Files are known by identity, not by path.** A file's identity is its inode plus a digest
  of its first line, so renaming it (``app.log`` → ``app.log.1`` on rotation) keeps its
  place, and a new file that reuses a name or an inode is a new file. A record's ID derives
  from ``(identity, byte offset of its line)``: after a crash the same lines get the same
  IDs and consumers drop the repeats.
* **Position** (checkpointed by the injector process): per file, its identity, the offset
  read up to, its first and highest event time, and whether it is finished. A restart
  re-opens each file by identity and seeks to its offset; nothing is lost or read twice.
* **Finished files.** In ``follow`` mode (the default) a file is finished once it was read
  to its end and a newer file (by modification time) exists beside it: it was rotated away.
  Without ``follow`` (a replay), every file is finished once read, and the source says
  its input is complete when all are, so the process reports the end of time.
* **Watermark** (paper figure 10): the minimum, over unfinished files, of the file's first
  event time. With ``out_of_order`` (µs) it is instead the file's highest event time minus
  ``out_of_order``: the bounded out-of-orderness of Spark's ``withWatermark`` and Flink's
  ``forBoundedOutOfOrderness``; lines older than that arrive late. With ``idle_after``
  (µs), once no file grew for that long the watermark moves to the clock minus
  ``out_of_order``, so an idle directory of live logs does not hold downstream timers.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from millstream.engine.clock import Clock
from millstream.engine.errors import InjectorError
from millstream.injectors.source import (
    Event,
    Poll,
    Position,
    RejectedInput,
    Source,
    SourceRecord,
)

__all__ = ["LineParser", "LogFileSource", "LogLine"]

DEFAULT_MAX_BYTES_PER_POLL = 4 * 1024 * 1024

_log = logging.getLogger(__name__)


LogLine = Event
"""What ``parse`` makes of one line (an :class:`~millstream.injectors.source.Event`)."""

LineParser = Callable[[str], LogLine | None]
"""Parses one line (without its newline); ``None`` skips it, raising rejects it."""


@dataclass
class _File:
    identity: str
    inode: int
    path: Path
    offset: int = 0
    first_event: int | None = None
    max_event: int | None = None
    finished: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "identity": self.identity,
            "inode": self.inode,
            "path": str(self.path),
            "offset": self.offset,
            "first_event": self.first_event,
            "max_event": self.max_event,
            "finished": self.finished,
        }

    @classmethod
    def from_json(cls, document: dict[str, Any]) -> _File:
        return cls(
            identity=str(document["identity"]),
            inode=int(document["inode"]),
            path=Path(document["path"]),
            offset=int(document["offset"]),
            first_event=document.get("first_event"),
            max_event=document.get("max_event"),
            finished=bool(document.get("finished", False)),
        )


class LogFileSource(Source):
    """Tails ``directory``'s files matching ``pattern`` into ``stream``; see the module
    docstring. ``clock`` is needed only with ``idle_after``."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        parse: LineParser,
        stream: str,
        *,
        pattern: str = "*",
        follow: bool = True,
        out_of_order: int | None = None,
        idle_after: int | None = None,
        clock: Clock | None = None,
        max_bytes_per_poll: int = DEFAULT_MAX_BYTES_PER_POLL,
    ) -> None:
        if idle_after is not None and clock is None:
            raise InjectorError("LogFileSource: idle_after needs a clock")
        if out_of_order is not None and out_of_order < 0:
            raise InjectorError(f"out_of_order must be non-negative µs, got {out_of_order}")
        if max_bytes_per_poll < 1:
            raise InjectorError("max_bytes_per_poll must be positive")
        self.directory = Path(directory)
        self.parse = parse
        self.streams = (stream,)
        self.stream = stream
        self.pattern = pattern
        self.follow = follow
        self.out_of_order = out_of_order
        self.idle_after = idle_after
        self.clock = clock
        self.max_bytes_per_poll = max_bytes_per_poll
        self._files: dict[str, _File] = {}  # by identity
        self._last_growth: int | None = None
        self._idle_watermark: int | None = None

    def open(self, position: Position | None) -> None:
        if not self.directory.is_dir():
            raise InjectorError(
                f"log directory {self.directory} does not exist or is not a directory"
            )
        self._files = {}
        for document in (position or {}).get("files", []):
            known = _File.from_json(document)
            self._files[known.identity] = known
        if self.clock is not None:
            self._last_growth = self.clock.now()

    def poll(self, timeout: float) -> Poll:
        records: list[SourceRecord] = []
        rejected: list[RejectedInput] = []
        budget = self.max_bytes_per_poll
        present = self._scan()
        newest = max((mtime for _, mtime in present.values()), default=None)
        for file, mtime in sorted(present.values(), key=lambda item: item[1]):
            if file.finished:
                continue
            if budget > 0:
                budget -= self._read(file, records, rejected, budget)
            at_end = file.offset >= _size(file.path)
            if at_end and (not self.follow or (newest is not None and mtime < newest)):
                file.finished = True
        for identity in [i for i in self._files if i not in present]:
            gone = self._files.pop(identity)
            if not gone.finished:
                _log.warning(
                    "log file %s (%s) vanished before it was read to its end, at offset %d",
                    gone.path,
                    identity,
                    gone.offset,
                )
        if self.clock is not None and (records or rejected):
            self._last_growth = self.clock.now()
        return Poll(
            records=records,
            rejected=rejected,
            position={"files": [f.to_json() for f in self._files.values()]},
            watermark=self._watermark(),
            exhausted=not self.follow and all(f.finished for f in self._files.values()),
        )

    # -- internals ---------------------------------------------------------------------------

    def _scan(self) -> dict[str, tuple[_File, float]]:
        """The files now in the directory, by identity, with their modification times."""
        present: dict[str, tuple[_File, float]] = {}
        for path in sorted(self.directory.glob(self.pattern)):
            try:
                stat = path.stat()
            except FileNotFoundError:
                continue  # rotated away between listing and stat: found next poll
            if not path.is_file():
                continue
            identity = _identity(path, stat.st_ino, complete=self.follow)
            if identity is None:
                continue  # no complete first line yet
            file = self._files.get(identity)
            if file is not None and stat.st_size < file.offset:
                # Truncated in place (copytruncate): what it holds now is new content, which
                # must not reuse the old lines' IDs.
                identity = f"{identity}-{stat.st_mtime_ns}"
                file = self._files.get(identity)
            if file is None:
                file = _File(identity, stat.st_ino, path)
                self._files[identity] = file
            file.path = path
            present[identity] = (file, stat.st_mtime)
        return present

    def _read(
        self,
        file: _File,
        records: list[SourceRecord],
        rejected: list[RejectedInput],
        budget: int,
    ) -> int:
        try:
            with file.path.open("rb") as handle:
                handle.seek(file.offset)
                data = handle.read(budget)
                if len(data) == budget:
                    # Finish the line that straddles the budget.
                    data += handle.readline()
        except FileNotFoundError:
            return 0
        if not data:
            return 0
        end = data.rfind(b"\n") + 1
        if end == 0 and self.follow:
            return 0  # a line still being written
        if end == 0 or (not self.follow and not data.endswith(b"\n")):
            end = len(data)  # the unterminated last line of a finished replay file
        offset = file.offset
        for raw in data[:end].splitlines(keepends=True):
            line_offset, offset = offset, offset + len(raw)
            text = raw.rstrip(b"\r\n")
            if not text:
                continue
            try:
                parsed: object = self.parse(text.decode("utf-8"))
            except Exception as exc:
                rejected.append(RejectedInput.of(file.identity, line_offset, text, exc))
                continue
            if parsed is None:
                continue
            if not isinstance(parsed, Event):
                error = TypeError(f"parse returned {type(parsed).__name__}, not LogLine or None")
                rejected.append(RejectedInput.of(file.identity, line_offset, text, error))
                continue
            records.append(
                SourceRecord(
                    self.stream,
                    parsed.key,
                    parsed.value,
                    parsed.timestamp,
                    file.identity,
                    line_offset,
                )
            )
            if file.first_event is None:
                file.first_event = parsed.timestamp
            file.max_event = max(file.max_event or parsed.timestamp, parsed.timestamp)
        file.offset = offset
        return end

    def _watermark(self) -> int | None:
        holds: list[int] = []
        for file in self._files.values():
            if file.finished or file.first_event is None or file.max_event is None:
                continue
            if self.out_of_order is None:
                holds.append(file.first_event)
            else:
                holds.append(file.max_event - self.out_of_order)
        idle = (
            self.idle_after is not None
            and self.clock is not None
            and self._last_growth is not None
            and self.clock.now() - self._last_growth >= self.idle_after
        )
        if idle and self.clock is not None:
            return self.clock.now() - (self.out_of_order or 0)
        if holds:
            return min(holds)
        if self._files and all(f.finished for f in self._files.values()):
            # Everything read: the highest event time seen bounds what is still to come.
            return max((f.max_event for f in self._files.values() if f.max_event), default=None)
        return None


def _identity(path: Path, inode: int, *, complete: bool) -> str | None:
    """``<inode>-<digest of the first line>``, or ``None`` before a first line exists
    (with ``complete``, before a first *terminated* line exists)."""
    try:
        with path.open("rb") as handle:
            first = handle.readline(64 * 1024)
    except FileNotFoundError:
        return None
    if not first or (complete and not first.endswith(b"\n") and len(first) < 64 * 1024):
        return None
    return f"{inode}-{hashlib.blake2b(first, digest_size=8).hexdigest()}"


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0
