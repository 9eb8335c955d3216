"""The watermark authority (paper 4.5, 7.2): one per topology run, on the driver.

MillWheel's central authority follows the progress of every key interval and serves every
computation its low watermark. Here it has two parts:

- :class:`WatermarkAuthority` reads the watermark topic once for the whole run, through one
  consumer, and hands each computation the messages it has not seen yet. A computation that
  subscribes later (added to a running topology) first gets the latest message of every key, as
  a compacted topic would give it.
- each computation's bookkeeping keeps its key intervals' progress in an
  :class:`~millstream.engine.watermarks.IntervalMap`, indexed so that applying an interval's
  report costs O(log n) and the watermark, the intervals with due work and a percentile cost
  little more than what they return: a computation may have hundreds of thousands of
  intervals.

What a restart needs is journaled on the compacted watermark topic itself: each computation's
report carries the watermarks it said (its input's and its own), and its bookkeeping after a
restart starts from them, so a watermark never moves back (:meth:`ComputationWatermarks.read
<millstream.engine.watermarks.ComputationWatermarks.read>`).
"""

from __future__ import annotations

import threading

from millstream.engine.watermarks import ReportReader, WatermarkMessage

__all__ = ["Subscription", "WatermarkAuthority"]

_Message = tuple[str, WatermarkMessage | None]


class Subscription:
    """One computation's view of the watermark topic through the authority: a
    :class:`~millstream.engine.watermarks.ReportReader` whose reads return the messages this
    subscriber has not seen, in topic order."""

    def __init__(self, authority: WatermarkAuthority, name: str) -> None:
        self.authority = authority
        self.name = name

    def read(self, timeout: float = 30.0) -> list[_Message]:
        return self.authority.read(self.name, timeout)

    def close(self) -> None:
        self.authority.unsubscribe(self.name)


class WatermarkAuthority:
    """Reads the watermark topic once for every computation of a run (see the module
    docstring). Thread-safe: each computation's query runs its batches in a thread of its own.

    A subscriber that does not read for long accumulates messages; past ``inbox_limit`` its
    inbox is compacted to the latest message per key (what the compacted topic would give a
    new reader, so its watermark is as right, and only later).
    """

    def __init__(self, reader: ReportReader, *, inbox_limit: int = 10_000) -> None:
        self._reader = reader
        self._lock = threading.Lock()
        # The latest message per key, in the order of their last update: the topic compacted.
        self._latest: dict[str, WatermarkMessage | None] = {}
        self._inboxes: dict[str, list[_Message]] = {}
        self._inbox_limit = inbox_limit
        self.messages = 0

    def subscribe(self, name: str) -> Subscription:
        """A reader for ``name``, which starts with the topic's compacted view."""
        with self._lock:
            if name not in self._inboxes:
                self._inboxes[name] = list(self._latest.items())
        return Subscription(self, name)

    def unsubscribe(self, name: str) -> None:
        with self._lock:
            self._inboxes.pop(name, None)

    def read(self, name: str, timeout: float = 30.0) -> list[_Message]:
        """Read the topic up to its end (once, for everyone), then return what ``name`` has
        not seen. A failed read raises and loses nothing (the reader's contract)."""
        with self._lock:
            if name not in self._inboxes:
                raise KeyError(f"{name!r} has not subscribed to the watermark authority")
            new = self._reader.read(timeout)
            self.messages += len(new)
            for key, message in new:
                self._latest.pop(key, None)  # moved to the end: the order of last updates
                self._latest[key] = message
            for subscriber, inbox in self._inboxes.items():
                inbox.extend(new)
                if subscriber != name and len(inbox) > self._inbox_limit:
                    self._inboxes[subscriber] = _compacted(inbox)
            mine, self._inboxes[name] = self._inboxes[name], []
            return mine

    def reconnect(self) -> None:
        """A new consumer for the topic (an outage can wedge the old one), if the reader
        can make one; it goes on from the last message read."""
        reconnect = getattr(self._reader, "reconnect", None)
        if reconnect is not None:
            with self._lock:
                reconnect()

    def close(self) -> None:
        close = getattr(self._reader, "close", None)
        if close is not None:
            close()


def _compacted(inbox: list[_Message]) -> list[_Message]:
    latest: dict[str, WatermarkMessage | None] = {}
    for key, message in inbox:
        latest.pop(key, None)
        latest[key] = message
    return list(latest.items())
