"""The log-file injector: tails the files of a directory into a stream (paper 5.2, figure 10).

Every line of every file matching ``pattern`` becomes one record, through a user ``parse``
function that returns the line's event time (µs), key and value (or ``None`` to skip it).

* **Files are known by identity, not by path.** A file's identity is its inode plus a digest
  of its first line, so renaming it (``app.log`` → ``app.log.1`` on rotation) keeps its
  place, and a new file that reuses a name or an inode is a new file. A record's ID derives
  from ``(identity, byte offset of its line)``: after a crash the same lines get the same
  IDs and consumers drop the repeats.
* **Position** (checkpointed by the injector process): per file, its identity, the offset
  read up to, a digest of the bytes just before that offset, its first and highest event
  time, and whether it is finished. A restart re-opens each file by identity and seeks to
  its offset; nothing is lost or read twice.
* **Finished files.** In ``follow`` mode (the default) a file is finished once it was read
  to its end and a newer file (by modification time) exists beside it: it was rotated away.
  A finished file that grows again is read again. Without ``follow`` (a replay), every file
  is finished once read, and the source says its input is complete when all are, so the
  process reports the end of time.
* **Rotation** by rename: the renamed file keeps its identity and is drained, then the new
  file is read. **copytruncate**: the file is copied, then truncated in place. The
  truncation is seen (the file is shorter than the offset read, or the bytes before that
  offset changed), and what the file holds now is read from 0 as a new file. The copy, if
  ``pattern`` matches it, is recognised (same first line, same bytes before the offset read)
  and carries on the original's identity from where the original was left, so the lines
  written between the last poll and the truncation are read once, and nothing twice. While
  the original is still being read, a new file that starts with the same first line may be
  such a copy in the making: it waits until the original is finished.
* **Watermark** (paper figure 10): the minimum, over unfinished files, of the file's first
  event time. With ``out_of_order`` (µs) it is instead the file's highest event time minus
  ``out_of_order``: the bounded out-of-orderness of Spark's ``withWatermark`` and Flink's
  ``forBoundedOutOfOrderness``; lines older than that arrive late. With ``idle_after``
  (µs), once no file grew for that long the watermark moves to the clock minus
  ``out_of_order``, so an idle directory of live logs does not hold downstream timers.

**Bad input** never stops the source and never costs a good line. Lines end at ``\\n`` alone
(a trailing ``\\r`` is dropped; a ``\\r`` inside a line is part of it). A line that is not
UTF-8, that ``parse`` rejects (it raises), or for which it returns something other than a
:class:`LogLine` with a ``str`` key, ``bytes`` value and a plausible ``int`` event time,
becomes one dead letter whose origin is the file (``stream``: its identity, the one its
records' IDs derive from) and the byte offset where the line starts (``offset``); its
message starts with the file's path at the time. It never moves the watermark. A line
longer than ``max_line_bytes`` (default: the engine's record limit) is never held whole: it
becomes one dead letter with its first ``max_line_bytes`` bytes as soon as it passes the
limit, and the rest of it is skipped up to its newline, however long, a chunk at a time
(also across polls and restarts). NUL bytes and other binary junk are just bytes: a line of
them reaches ``parse`` if it is valid UTF-8 and is a dead letter if ``parse`` rejects it. A
file deleted before it was read to its end is logged with what was left unread.
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat as stat_module
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

from millstream.engine.clock import Clock
from millstream.engine.errors import InjectorError, OversizedRecordError
from millstream.engine.records import MAX_RECORD_BYTES, check_event_time
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
DEFAULT_MAX_LINE_BYTES = MAX_RECORD_BYTES

_FIRST_LINE_BYTES = 64 * 1024
# The bytes before the offset read that tell the same content (a copy) from new content (a
# truncated and refilled file).
_TAIL_BYTES = 256
_SKIP_CHUNK_BYTES = 1024 * 1024
# A file renamed between a scan's listing and its look at the file is missed by that scan.
_SCANS_TO_FORGET = 2

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
    skipping: bool = False  # inside an oversized line, already dead-lettered
    tail: str | None = None  # digest of the bytes just before ``offset``
    missed: int = 0  # scans in a row that did not find it (not checkpointed)

    @property
    def head(self) -> str:
        """The digest of the file's first line (the identity's second part)."""
        return self.identity.split("-")[1]

    def to_json(self) -> dict[str, Any]:
        return {
            "identity": self.identity,
            "inode": self.inode,
            "path": str(self.path),
            "offset": self.offset,
            "first_event": self.first_event,
            "max_event": self.max_event,
            "finished": self.finished,
            "skipping": self.skipping,
            "tail": self.tail,
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
            skipping=bool(document.get("skipping", False)),
            tail=document.get("tail"),
        )


@dataclass(frozen=True, slots=True)
class _Seen:
    """A regular file as one scan found it."""

    path: Path
    inode: int
    size: int
    mtime: float
    mtime_ns: int
    head: str  # digest of its first line


class LogFileSource(Source):
    """Tails ``directory``'s files matching ``pattern`` into ``stream``; see the module
    docstring. ``clock`` is needed only with ``idle_after``. ``max_bytes_per_poll`` bounds
    what one poll reads, ``max_line_bytes`` the longest line kept (longer ones are dead
    letters)."""

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
        max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
    ) -> None:
        if idle_after is not None and clock is None:
            raise InjectorError("LogFileSource: idle_after needs a clock")
        if out_of_order is not None and out_of_order < 0:
            raise InjectorError(f"out_of_order must be non-negative µs, got {out_of_order}")
        if max_bytes_per_poll < 1:
            raise InjectorError("max_bytes_per_poll must be positive")
        if max_line_bytes < 1:
            raise InjectorError("max_line_bytes must be positive")
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
        self.max_line_bytes = max_line_bytes
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
        present, newest = self._scan()
        for file, seen in sorted(present.values(), key=lambda item: item[1].mtime):
            size = seen.size
            if file.finished:
                if not (self.follow and size > file.offset):
                    continue
                file.finished = False  # rotated away, yet written again: read what came
            if budget > 0:
                consumed, read_size = self._read(file, records, rejected, budget)
                budget -= consumed
                size = read_size if read_size is not None else size
            at_end = file.offset >= size
            if at_end and (not self.follow or seen.mtime < newest):
                file.finished = True
        for file, _ in present.values():
            file.missed = 0
        for identity in [i for i in self._files if i not in present]:
            missing = self._files[identity]
            missing.missed += 1
            if missing.missed < _SCANS_TO_FORGET:
                continue
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

    def _scan(self) -> tuple[dict[str, tuple[_File, _Seen]], float]:
        """The files to read now, by identity, and the newest modification time among them."""
        present: dict[str, tuple[_File, _Seen]] = {}
        unknown: list[tuple[str, _Seen]] = []
        for path in sorted(self.directory.glob(self.pattern)):
            seen = _look(path, complete=self.follow)
            if seen is None:
                continue
            # Known by what it carries (its inode and first line), not by its identity: a
            # copy carries on its original's identity.
            carried = [
                f for f in self._files.values() if (f.inode, f.head) == (seen.inode, seen.head)
            ]
            file = next((f for f in carried if _same_content(f, seen)), None)
            if file is None and carried and _changed_since(seen):
                continue  # truncated while looked at: its first line may be the old one
            if file is None:
                identity = f"{seen.inode}-{seen.head}"
                if carried or identity in self._files:
                    # Truncated in place (copytruncate), perhaps refilled: what it holds now
                    # is new content, which must not reuse the old lines' IDs.
                    identity = f"{identity}-{seen.mtime_ns}"
                unknown.append((identity, seen))
                continue
            file.path = path
            present[file.identity] = (file, seen)
        # Oldest first: of new files that start alike, the oldest is read first.
        for identity, seen in sorted(unknown, key=lambda item: item[1].mtime):
            original = self._original_of(seen, present)
            if original is not None:
                # The copy of a file truncated in place: it carries on where that one was left.
                original.inode, original.path = seen.inode, seen.path
                present[original.identity] = (original, seen)
            elif _copy_of_a_live_file(seen, present):
                # Read as that file's continuation once it is truncated. Its time must not
                # make the file it copies look rotated away.
                continue
            else:
                file = _File(identity, seen.inode, seen.path)
                self._files[identity] = file
                present[identity] = (file, seen)
        newest = max((seen.mtime for _, seen in present.values()), default=float("-inf"))
        return present, newest

    def _original_of(self, seen: _Seen, present: dict[str, tuple[_File, _Seen]]) -> _File | None:
        """The known file, no longer where it was read, of which ``seen`` is a copy: it
        starts with the same line and holds the same bytes before that file's offset."""
        for file in self._files.values():
            if file.identity in present or file.head != seen.head or file.inode == seen.inode:
                continue
            if seen.size < file.offset:
                continue
            if file.offset == 0 or (
                file.tail is not None
                and _digest_at(seen.path, seen.inode, file.offset) == file.tail
            ):
                return file
        return None

    def _read(
        self,
        file: _File,
        records: list[SourceRecord],
        rejected: list[RejectedInput],
        budget: int,
    ) -> tuple[int, int | None]:
        """Reads ``file`` from its offset, about ``budget`` bytes: the bytes consumed, and
        the file's size as read (``None``: it is gone or its path names another file now)."""
        try:
            handle = file.path.open("rb")
        except FileNotFoundError:
            return 0, None
        with handle:
            if os.fstat(handle.fileno()).st_ino != file.inode:
                return 0, None  # rotated between the scan and now: the next scan sorts it out
            start = file.offset
            # The tail is digested from the bytes read, not read again after them: the file
            # may be truncated and refilled meanwhile.
            handle.seek(max(0, start - _TAIL_BYTES))
            tail = _Tail(handle.read(start - max(0, start - _TAIL_BYTES)))
            if file.tail is not None and tail.digest() != file.tail:
                return 0, None  # truncated since the scan: the next scan sorts it out
            # Until past the budget: a poll ends at the end of a line.
            while file.offset - start <= budget:
                if file.skipping:
                    skipped = self._skip(file, handle, budget - (file.offset - start) + 1)
                    if not skipped:
                        break
                    tail.add(skipped)
                    continue
                line = handle.readline(self.max_line_bytes + 1)
                if not line:
                    break
                if not line.endswith(b"\n") and len(line) > self.max_line_bytes:
                    error = OversizedRecordError(
                        f"line longer than max_line_bytes ({self.max_line_bytes} bytes): "
                        f"its first {self.max_line_bytes} bytes are kept here, the rest is "
                        "skipped up to its end"
                    )
                    rejected.append(_rejected(file, line[: self.max_line_bytes], error))
                    file.offset += len(line)
                    file.skipping = True
                    tail.add(line)
                    continue
                if not line.endswith(b"\n") and self.follow:
                    break  # a line still being written
                # A whole line, or the unterminated last line of a finished replay file.
                self._take(file, line, records, rejected)
                file.offset += len(line)
                tail.add(line)
            if file.offset != start:
                file.tail = tail.digest()
            size = os.fstat(handle.fileno()).st_size
        return file.offset - start, size

    def _skip(self, file: _File, handle: IO[bytes], budget: int) -> bytes:
        """Skips the rest of an oversized line a chunk at a time: the last bytes skipped
        (none at the end of the file: the line goes on when more is written)."""
        chunk = handle.read(min(_SKIP_CHUNK_BYTES, budget))
        newline = chunk.find(b"\n")
        end = len(chunk) if newline < 0 else newline + 1
        file.offset += end
        if newline >= 0:
            file.skipping = False
            handle.seek(file.offset)
        return chunk[max(0, end - _TAIL_BYTES) : end]

    def _take(
        self,
        file: _File,
        line: bytes,
        records: list[SourceRecord],
        rejected: list[RejectedInput],
    ) -> None:
        """Parses one line read at ``file.offset`` into a record or a dead letter."""
        text = line.removesuffix(b"\n").removesuffix(b"\r")
        if not text:
            return
        try:
            event = _checked(self.parse(text.decode("utf-8")))
        except Exception as exc:  # a bad line, whatever parse raises: a dead letter
            rejected.append(_rejected(file, text, exc))
            return
        if event is None:
            return
        records.append(
            SourceRecord(
                self.stream, event.key, event.value, event.timestamp, file.identity, file.offset
            )
        )
        if file.first_event is None:
            file.first_event = event.timestamp
        file.max_event = max(file.max_event or event.timestamp, event.timestamp)

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


def _rejected(file: _File, raw: bytes, error: Exception) -> RejectedInput:
    """The line at ``file.offset`` as a dead letter; its message starts with the file's path
    at the time, which the origin (the file's identity) does not tell."""
    rejected = RejectedInput.of(file.identity, file.offset, raw, error)
    message = f"{file.path} at byte {file.offset}: {rejected.error_message}"
    return replace(rejected, error_message=message)


def _checked(parsed: object) -> Event | None:
    """What ``parse`` returned, checked before it counts for the watermark: a bad event
    time must become a dead letter, never the source's low watermark."""
    if parsed is None:
        return None
    if not isinstance(parsed, Event):
        raise TypeError(f"parse returned {type(parsed).__name__}, not LogLine or None")
    if not isinstance(parsed.timestamp, int) or isinstance(parsed.timestamp, bool):
        raise TypeError(f"parse returned event time {parsed.timestamp!r}, not int µs")
    if not isinstance(parsed.key, str):
        raise TypeError(f"parse returned key {parsed.key!r}, not str")
    if not isinstance(parsed.value, bytes):
        raise TypeError(f"parse returned value of type {type(parsed.value).__name__}, not bytes")
    check_event_time(parsed.timestamp)
    return parsed


def _look(path: Path, *, complete: bool) -> _Seen | None:
    """``path`` as it is now, or ``None`` if it is gone, not a regular file, or has no first
    line yet (with ``complete``, no *terminated* first line)."""
    try:
        if not stat_module.S_ISREG(path.stat().st_mode):
            return None  # a directory, a FIFO (opening it would block), ...
        with path.open("rb") as handle:
            stat = os.fstat(handle.fileno())
            first = handle.readline(_FIRST_LINE_BYTES)
    except FileNotFoundError:
        return None  # rotated away between listing and opening: found next poll
    if not first or (complete and not first.endswith(b"\n") and len(first) < _FIRST_LINE_BYTES):
        return None
    return _Seen(
        path=path,
        inode=stat.st_ino,
        size=stat.st_size,
        mtime=stat.st_mtime,
        mtime_ns=stat.st_mtime_ns,
        head=hashlib.blake2b(first, digest_size=8).hexdigest(),
    )


def _same_content(file: _File, seen: _Seen) -> bool:
    """Whether ``seen`` still holds what ``file`` was read from, up to its offset."""
    if seen.size < file.offset:
        return False
    if file.tail is None:
        return True
    digest = _digest_at(seen.path, seen.inode, file.offset)
    return digest is None or digest == file.tail  # None: replaced since; the read checks


def _copy_of_a_live_file(seen: _Seen, present: dict[str, tuple[_File, _Seen]]) -> bool:
    """Whether ``seen`` may be a copy (perhaps in the making) of an unfinished file being
    read: it starts with the same line and ends with the same bytes as that file at its
    length. When that file changed since it was looked at (truncated after the copy, and
    perhaps refilled), the next poll tells."""
    for file, live in present.values():
        if file.finished or file.head != seen.head or live.inode == seen.inode:
            continue
        at = min(seen.size, live.size)
        ours = _bytes_before(seen.path, seen.inode, at)
        theirs = _bytes_before(live.path, live.inode, at)
        if ours is None or ours == theirs or not _still_holds(file, live):
            return True
    return False


def _still_holds(file: _File, live: _Seen) -> bool:
    """Whether ``live.path`` still holds what ``file`` read: the same file, first line and
    bytes before its offset (it may have been truncated and refilled since it was seen)."""
    try:
        with live.path.open("rb") as handle:
            if os.fstat(handle.fileno()).st_ino != live.inode:
                return False
            first = handle.readline(_FIRST_LINE_BYTES)
            if hashlib.blake2b(first, digest_size=8).hexdigest() != file.head:
                return False
            return file.tail is None or _digest_before(handle, file.offset) == file.tail
    except FileNotFoundError:
        return False


def _changed_since(seen: _Seen) -> bool:
    """Whether ``seen.path`` is gone, another file, or shorter than when it was seen."""
    try:
        now = seen.path.stat()
    except FileNotFoundError:
        return True
    return now.st_ino != seen.inode or now.st_size < seen.size


class _Tail:
    """The last bytes read, up to ``_TAIL_BYTES``."""

    def __init__(self, before: bytes) -> None:
        self.data = before

    def add(self, read: bytes) -> None:
        self.data = (self.data + read[-_TAIL_BYTES:])[-_TAIL_BYTES:]

    def digest(self) -> str:
        return hashlib.blake2b(self.data, digest_size=8).hexdigest()


def _digest_before(handle: IO[bytes], offset: int) -> str:
    start = max(0, offset - _TAIL_BYTES)
    handle.seek(start)
    return hashlib.blake2b(handle.read(offset - start), digest_size=8).hexdigest()


def _digest_at(path: Path, inode: int, offset: int) -> str | None:
    """The digest of the bytes before ``offset`` in ``path`` if it is still file ``inode``."""
    before = _bytes_before(path, inode, offset)
    return None if before is None else hashlib.blake2b(before, digest_size=8).hexdigest()


def _bytes_before(path: Path, inode: int, offset: int) -> bytes | None:
    """The bytes before ``offset`` in ``path`` (fewer if it is shorter now) if it is still
    file ``inode``."""
    try:
        with path.open("rb") as handle:
            if os.fstat(handle.fileno()).st_ino != inode:
                return None
            start = max(0, offset - _TAIL_BYTES)
            handle.seek(start)
            return handle.read(offset - start)
    except FileNotFoundError:
        return None
