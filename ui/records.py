"""The live view's record browser: a bounded, cancellable read of one stream's records,
decoded (envelope and value, dead letters too), filtered by key and event time.

A scan reads at most ``budget`` messages, spread over the stream's partitions: by default
the newest of each partition, or, to tail a stream, what came after the positions a scan
before it reached. It says how much it read, where, and whether the budget cut it short, so a
reader knows what "no match" covered. It stops early when the caller's ``cancelled()`` says
so (the page went away or gave up waiting).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import Any, NamedTuple

from confluent_kafka import Consumer

from millstream.connectors.kafka import end_offsets, start_offsets, stream_topic
from millstream.connectors.stream_reader import range_reader, read_ranges
from millstream.connectors.streams import ValueFormat, render_message
from millstream.engine.config import MillstreamConfig
from millstream.engine.errors import ConfigError

__all__ = ["MAX_BUDGET", "MAX_LIMIT", "ReaderPool", "Scan", "StreamScan", "scan_stream"]

MAX_LIMIT = 500  # records a scan returns at most
MAX_BUDGET = 100_000  # messages a scan reads at most


class _Range(NamedTuple):
    topic: str
    partition: int
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class Scan:
    """What to read: ``stream``'s records whose key is ``key`` (any, if ``None``) and whose
    event time (µs) is in ``[since, until)``; the newest ``limit`` of those found. ``after``,
    per partition, reads only what came after those offsets (the positions a scan before
    reached: a live tail); without it, the newest messages of each partition. At most
    ``budget`` messages are read in all; without a filter, at most ``limit`` a partition."""

    stream: str
    key: str | None = None
    since: int | None = None
    until: int | None = None
    after: Mapping[int, int] | None = None
    limit: int = 100
    budget: int = 20_000
    value_format: ValueFormat = "json"

    def __post_init__(self) -> None:
        if not 1 <= self.limit <= MAX_LIMIT:
            raise ConfigError(f"a scan returns 1 to {MAX_LIMIT} records, not {self.limit}")
        if not 1 <= self.budget <= MAX_BUDGET:
            raise ConfigError(f"a scan reads 1 to {MAX_BUDGET:,} messages, not {self.budget}")
        if self.value_format not in ("json", "text", "hex"):
            raise ConfigError(f"values show as json, text or hex, not {self.value_format!r}")


class ReaderPool:
    """Kafka consumers for scans, kept between them: a page tailing a stream scans every
    2 s, and a consumer made for each scan costs a connection, a metadata request and
    threads on both ends. At most ``keep`` wait, unassigned (they fetch nothing meanwhile);
    one whose scan failed is closed, not kept. Thread-safe."""

    def __init__(self, config: MillstreamConfig, *, keep: int = 2) -> None:
        self.config = config
        self.keep = keep
        self._lock = threading.Lock()
        self._idle: list[Consumer] = []
        self._closed = False

    @contextmanager
    def reader(self) -> Iterator[Consumer]:
        """A consumer (:func:`~millstream.connectors.stream_reader.range_reader`) of this
        pool's, the caller's alone until the ``with`` ends."""
        with self._lock:
            reader = self._idle.pop() if self._idle else None
        if reader is None:
            reader = range_reader(self.config)
        try:
            yield reader
            reader.unassign()
        except BaseException:
            reader.close()
            raise
        with self._lock:
            if not self._closed and len(self._idle) < self.keep:
                self._idle.append(reader)
                return
        reader.close()

    def close(self) -> None:
        """Close the waiting consumers; those lent out close when they come back."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for reader in idle:
            reader.close()


def scan_stream(
    config: MillstreamConfig,
    scan: Scan,
    cancelled: Callable[[], bool] = lambda: False,
    *,
    timeout: float = 10.0,
    readers: ReaderPool | None = None,
) -> dict[str, Any]:
    """Read ``scan``'s messages from Kafka: ``records`` (newest first, at most
    ``scan.limit``), ``scanned`` (messages read), ``matched``, ``ranges`` (per partition, the
    offsets read: ``[start, end)``), ``positions`` (per partition, where a tail goes on),
    ``truncated`` (the budget left older messages unread) and ``cancelled``. ``readers``:
    where its consumer comes from (default: one made for it)."""
    found: list[dict[str, Any]] = []
    # Without a filter every message is wanted: the newest ``limit`` are among each
    # partition's newest ``limit``, and reading more (a tail of a busy stream) is wasted work.
    unfiltered = scan.key is None and scan.since is None and scan.until is None
    newest = scan.limit if unfiltered else None
    with StreamScan(
        config, scan, cancelled, timeout=timeout, newest=newest, readers=readers
    ) as read:
        for entry in read:
            if _wanted(entry, scan):
                found.append(entry)
    found.sort(key=lambda e: (e.get("timestamp", -1), e["partition"], e["offset"]), reverse=True)
    return {
        "stream": scan.stream,
        "records": found[: scan.limit],
        "scanned": read.scanned,
        "matched": len(found),
        "ranges": {str(r.partition): [r.start, r.end] for r in read.ranges},
        "positions": {str(p): end for p, end in sorted(read.ends.items())},
        "truncated": read.truncated,
        "cancelled": read.cancelled,
    }


class StreamScan:
    """The messages of ``scan``'s ranges (:func:`scan_stream` says which), each decoded as the
    record browser shows it, unfiltered, in offset order per partition: iterate it inside a
    ``with`` (which closes its Kafka consumer); ``newest``: at most that many of each
    partition's newest; ``readers``: where its consumer comes from (default: one made for
    it). ``scanned``, ``ranges``, ``ends``, ``truncated`` and ``cancelled`` say what it
    read."""

    def __init__(
        self,
        config: MillstreamConfig,
        scan: Scan,
        cancelled: Callable[[], bool] = lambda: False,
        *,
        timeout: float = 10.0,
        newest: int | None = None,
        readers: ReaderPool | None = None,
    ) -> None:
        self.scan = scan
        self.timeout = timeout
        self._cancelled = cancelled
        self._lease: AbstractContextManager[Consumer] = (
            readers or ReaderPool(config, keep=0)
        ).reader()
        self._consumer = self._lease.__enter__()
        topic = stream_topic(scan.stream)
        try:
            self.ends = end_offsets(self._consumer, [topic], timeout)[topic]
            starts = start_offsets(self._consumer, [topic], timeout)[topic]
        except BaseException as exc:
            self._lease.__exit__(type(exc), exc, exc.__traceback__)
            raise
        self.ranges, self.truncated = _ranges(topic, scan, starts, self.ends, newest)
        self.scanned = 0
        self.cancelled = False

    def __iter__(self) -> Iterator[dict[str, Any]]:
        messages = read_ranges(self._consumer, self.ranges, self.timeout)
        try:
            for message in messages:
                self.scanned += 1
                if self.scanned % 256 == 0 and self._cancelled():
                    self.cancelled = True
                    return
                yield render_message(
                    self.scan.stream,
                    message.partition,
                    message.offset,
                    message.value,
                    self.scan.value_format,
                )
        finally:
            # Now, not when collected: the consumer may be lent to another scan by then.
            messages.close()

    def __enter__(self) -> StreamScan:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._lease.__exit__(kind, error, traceback)


def _ranges(
    topic: str,
    scan: Scan,
    starts: Mapping[int, int],
    ends: Mapping[int, int],
    newest: int | None = None,
) -> tuple[list[_Range], bool]:
    """Each partition's offsets to read, the newest first: the budget shared out evenly, a
    share a partition leaves unused going to the others (``newest``: at most that many a
    partition in all); whether any older message of the asked span went unread."""
    firsts = {}
    for partition, end in ends.items():
        first = starts.get(partition, 0)
        if scan.after is not None:
            first = max(first, min(scan.after.get(partition, first), end))
        firsts[partition] = first
    left, shares = scan.budget, {}
    if newest is not None:
        left = min(left, newest * len(ends))
    by_size = sorted(ends, key=lambda p: (ends[p] - firsts[p], p))
    for index, partition in enumerate(by_size):
        shares[partition] = min(ends[partition] - firsts[partition], left // (len(by_size) - index))
        left -= shares[partition]
    ranges = [_Range(topic, p, ends[p] - shares[p], ends[p]) for p in sorted(ends)]
    return ranges, any(r.start > firsts[r.partition] for r in ranges)


def _wanted(entry: Mapping[str, Any], scan: Scan) -> bool:
    if scan.key is not None and entry.get("key") != scan.key:
        return False
    timestamp = entry.get("timestamp")
    if scan.since is not None and (timestamp is None or timestamp < scan.since):
        return False
    return not (scan.until is not None and (timestamp is None or timestamp >= scan.until))
