"""The watermark topic (paper 4.5, 5.2): its contract, and an in-memory backend for tests.

One compacted topic carries, keyed so that it keeps the latest of each, every source's
:class:`~millstream.engine.watermarks.WatermarkReport` (keyed by its source) and every
injector's :class:`~millstream.engine.watermarks.ExpectedSet` (keyed by
:func:`~millstream.engine.watermarks.injector_group`); a tombstone (``None``) retires a key.

- **Writers** (injector processes, the computations' drivers) :meth:`~WatermarkTopic.publish`
  reports, :meth:`~WatermarkTopic.declare` expected sets and :meth:`~WatermarkTopic.retire`
  sources. A write returns once the topic holds it, and only then wakes the consumers of
  the streams it names (:meth:`~WatermarkTopic.wake`), so a batch it starts finds it. A
  report covers the :meth:`~WatermarkTopic.end_offsets` of its streams: no consumer applies
  it before it consumed them.
- **Readers** :meth:`~WatermarkTopic.read` it from its beginning, a call at a time up to its
  end now, each object at its own position. A read that fails moves nothing: the next one
  starts where it did, so no message is ever skipped.

Backends: ``millstream.connectors.kafka.KafkaWatermarkTopic`` on Kafka, and
:class:`MemoryWatermarkTopic` here, which the testing harnesses
(:mod:`millstream.engine.testing`, ``millstream.injectors.testing``) run on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from millstream.engine.watermarks import (
    ExpectedSet,
    Offsets,
    ReportReader,
    WatermarkMessage,
    WatermarkReport,
)

__all__ = ["MemoryWatermarkTopic", "ReportReader", "WatermarkTopic"]

_Message = tuple[str, WatermarkMessage | None]


class WatermarkTopic(ReportReader, Protocol):
    """The watermark topic as its writers and readers use it; see the module docstring.

    :class:`~millstream.engine.watermarks.ReportReader` is its reading half alone (what a
    computation's bookkeeping reads from, such as a watermark authority's subscription).
    """

    def read(self, timeout: float = ...) -> list[_Message]:
        """The messages written since the last read (all of them at the first), as
        ``(key, message)`` in topic order; ``message`` is ``None`` for a retired key."""

    def publish(self, report: WatermarkReport) -> None:
        """Write a report, then wake the consumers of the streams it names."""

    def declare(self, expected: ExpectedSet) -> None:
        """Write an injector's expected set, then wake the consumers of its streams."""

    def retire(self, source: str) -> None:
        """Delete a source's report (or an injector's expected set) for good: a tombstone."""

    def wake(self, topics: Sequence[str], source: str) -> None:
        """Start a batch of the queries that read ``topics`` (a runtime's wake-up topics,
        such as a computation's alarm topic), on behalf of ``source``."""

    def end_offsets(self, streams: Sequence[str]) -> Offsets:
        """The current end offsets of the streams' topics: what a report made now covers."""

    def close(self) -> None:
        """Deliver what is written and let go of the connections."""


def _nothing_written(streams: Sequence[str]) -> Offsets:
    return {}


class MemoryWatermarkTopic:
    """A :class:`WatermarkTopic` in memory: every message in :attr:`messages`, in order.

    ``end_offsets`` tells the offsets a report covers (default: none, so consumers apply
    reports at once); the harnesses count what their sinks delivered. :meth:`reader` is
    another client of the same topic, at its own position. Wake-ups are kept in
    :attr:`wakes`, as ``(topic, source)``.
    """

    def __init__(self, end_offsets: Callable[[Sequence[str]], Offsets] | None = None) -> None:
        self.messages: list[_Message] = []
        self.wakes: list[tuple[str, str]] = []
        self._end_offsets = end_offsets or _nothing_written
        self._read = 0

    def read(self, timeout: float = 0.0) -> list[_Message]:
        start, self._read = self._read, len(self.messages)
        return self.messages[start:]

    def publish(self, report: WatermarkReport) -> None:
        self.messages.append((report.source, report))

    def declare(self, expected: ExpectedSet) -> None:
        self.messages.append((expected.key, expected))

    def retire(self, source: str) -> None:
        self.messages.append((source, None))

    def wake(self, topics: Sequence[str], source: str) -> None:
        self.wakes.extend((topic, source) for topic in topics)

    def end_offsets(self, streams: Sequence[str]) -> Offsets:
        return self._end_offsets(streams)

    def close(self) -> None:
        pass

    def reader(self) -> MemoryWatermarkTopic:
        """Another client of the same topic, reading from its beginning."""
        other = MemoryWatermarkTopic(self._end_offsets)
        other.messages = self.messages
        other.wakes = self.wakes
        return other

    def reports(self) -> list[WatermarkReport]:
        """The reports written, in order (expected sets and tombstones left out)."""
        return [m for _, m in self.messages if isinstance(m, WatermarkReport)]
