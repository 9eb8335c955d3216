"""The contract of a custom injector: a :class:`Source` that reads records from outside.

An injector brings external data into streams (paper 4.5, 5.2). millstream runs the loop
around it (:class:`~millstream.injectors.process.InjectorProcess`): it restores the source's
position from a sequencer-fenced checkpoint, polls, turns what the source read into records
whose IDs derive from their source position, sends them to Kafka, checkpoints the new
position, and reports the source's low watermark; while idle it heartbeats the watermark.

A source only says what it read and where it stands, in the style of a Kafka Connect
``SourceTask``::

    class Numbers(Source):
        streams = ("numbers",)

        def open(self, position):
            self.next = position["next"] if position else 0

        def poll(self, timeout):
            first, self.next = self.next, self.next + 10
            return Poll(
                records=[
                    SourceRecord("numbers", str(n), b"", n * 1_000_000, origin="numbers", offset=n)
                    for n in range(first, self.next)
                ],
                position={"next": self.next},
                watermark=self.next * 1_000_000,
            )

The rules a source keeps:

* ``(origin, offset)`` names a record's place in the source for good (a file identity and a
  byte offset; a topic partition and an offset): the record ID derives from it, so a
  restarted injector that re-reads a record re-sends the same ID and consumers drop it.
* ``position`` is JSON (a dict of plain values); :meth:`Source.open` gets back the last one
  checkpointed, so everything before it is never read again and nothing after it is lost.
* ``watermark`` promises that no record the source reads after this poll is older (µs);
  records it reads later that are older anyway are *late*: delivered, and counted by the
  consumer. It never needs to move back: the process keeps the highest one.
* Input it cannot turn into a record goes in ``rejected``, never raised: it becomes a dead
  letter with its origin, and the injector goes on.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

__all__ = ["Event", "Poll", "Position", "RejectedInput", "Source", "SourceRecord"]

Position: TypeAlias = Mapping[str, Any]
"""Where a source stands, as JSON-serialisable values."""


@dataclass(frozen=True, slots=True)
class Event:
    """What a user's parse function makes of one input: event time (µs), key and value."""

    timestamp: int
    key: str
    value: bytes = b""


@dataclass(frozen=True, slots=True)
class SourceRecord:
    """One record a source read: its stream, key, value, event time (µs) and place."""

    stream: str
    key: str
    value: bytes
    timestamp: int
    origin: str
    offset: int


@dataclass(frozen=True, slots=True)
class RejectedInput:
    """Input a source could not turn into a record (it becomes a dead letter)."""

    origin: str
    offset: int
    raw: bytes
    error_type: str
    error_message: str

    @classmethod
    def of(cls, origin: str, offset: int, raw: bytes, error: BaseException) -> RejectedInput:
        return cls(origin, offset, raw, type(error).__name__, str(error))


@dataclass(frozen=True, slots=True)
class Poll:
    """What one :meth:`Source.poll` read.

    ``position`` is where the source stands after it (``None``: unchanged); ``watermark`` the
    source's low watermark after it (µs; ``None``: unchanged). ``exhausted`` says the input
    is complete (a replay finished): the process then reports the end of time, so every
    downstream event-time timer fires.
    """

    records: Sequence[SourceRecord] = ()
    rejected: Sequence[RejectedInput] = ()
    position: Position | None = None
    watermark: int | None = None
    exhausted: bool = False


class Source(ABC):
    """A custom injector's reading side; see the module docstring."""

    streams: Sequence[str] = ()
    """Every stream the source writes to."""

    @abstractmethod
    def open(self, position: Position | None) -> None:
        """Start reading after ``position`` (``None``: from the source's beginning)."""

    @abstractmethod
    def poll(self, timeout: float) -> Poll:
        """Read what is available, waiting at most ``timeout`` seconds for something."""

    def close(self) -> None:  # noqa: B027 - optional for sources holding nothing
        """Release files, connections and the like."""
