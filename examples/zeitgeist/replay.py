"""Bucket counts replayed as search logs, for the log-file injector.

Each bucket's count becomes that many search events, spread evenly over the bucket (event
``i`` of ``n`` at ``start + (2i + 1)·length / 2n``, the series' bucket length), so a replay
is the same every time.
One file per day holds every query's events in time order, one line each::

    2015-02-26T21:42:53.750000Z AAPL

The files' modification times follow their days, the order in which the log-file injector
reads a directory.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from millstream.injectors import Event
from zeitgeist.series import Series, bucket_length

__all__ = ["parse_search", "write_logs"]

_DAY = 86_400_000_000
_MICROS = 1_000_000


def _stamp(micros: int) -> str:
    moment = datetime.fromtimestamp(micros // _MICROS, UTC)
    return f"{moment:%Y-%m-%dT%H:%M:%S}.{micros % _MICROS:06d}Z"


def write_logs(
    series: Sequence[Series], directory: Path, bucket: int | None = None
) -> tuple[int, int]:
    """Write the replay of ``series`` into ``directory``; returns (files, events).

    ``bucket`` is the bucket length, µs (by default the series' own: :func:`bucket_length`).
    """
    directory.mkdir(parents=True, exist_ok=True)
    length = bucket if bucket is not None else bucket_length(series)
    per_day: dict[int, list[tuple[int, str]]] = {}
    for one in series:
        for bucket, count in one.counts.items():
            day = per_day.setdefault(bucket // _DAY, [])
            for i in range(count):
                day.append((bucket + (2 * i + 1) * length // (2 * count), one.query))
    events = 0
    for number, day_index in enumerate(sorted(per_day)):
        lines = sorted(per_day[day_index])
        events += len(lines)
        path = directory / f"searches-{_stamp(day_index * _DAY)[:10]}.log"
        path.write_text("".join(f"{_stamp(at)} {query}\n" for at, query in lines))
        # mtimes in day order, a second apart: the injector reads the oldest first.
        os.utime(path, (1_000_000_000 + number, 1_000_000_000 + number))
    return len(per_day), events


def parse_search(line: str) -> Event:
    """One log line: its time, its query (the key) and the query as the value."""
    stamp, _, query = line.partition(" ")
    if not query:
        raise ValueError("expected '<ISO time> <query>'")
    moment = datetime.fromisoformat(stamp)
    if moment.tzinfo is None:
        raise ValueError(f"the time {stamp!r} has no zone")
    micros = int(moment.timestamp()) * _MICROS + moment.microsecond
    return Event(micros, query, query.encode())
