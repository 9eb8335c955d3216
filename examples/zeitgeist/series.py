"""Traffic series in the Numenta Anomaly Benchmark's format, their labels, and NAB scoring.

A series directory holds CSV files (a header ``timestamp,value``, then ``YYYY-MM-DD
HH:MM:SS,count`` rows, UTC, one per 5-minute bucket start) and a ``labels.json`` mapping
``<anything>/<file name>`` to a list of ``[start, end]`` anomaly windows. The query of a
series is its file name without ``.csv`` and without a ``Twitter_volume_`` prefix.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

__all__ = [
    "Detection",
    "Score",
    "Series",
    "format_time",
    "load_series",
    "parse_time",
    "score",
]

_MICROS = 1_000_000


def parse_time(text: str) -> int:
    """``YYYY-MM-DD HH:MM:SS[.ffffff]`` (UTC) as µs since the epoch."""
    moment = datetime.fromisoformat(text.strip()).replace(tzinfo=UTC)
    return int(moment.timestamp()) * _MICROS + moment.microsecond


def format_time(micros: int) -> str:
    return datetime.fromtimestamp(micros / _MICROS, UTC).strftime("%Y-%m-%d %H:%M:%S")


@dataclass(frozen=True, slots=True)
class Series:
    """One query's bucket counts (bucket start µs → count) and its labelled windows."""

    query: str
    counts: dict[int, int]
    windows: list[tuple[int, int]] = field(default_factory=list)

    @property
    def start(self) -> int:
        return min(self.counts)

    @property
    def end(self) -> int:
        return max(self.counts)

    @property
    def events(self) -> int:
        return sum(self.counts.values())

    def between(self, start: int, end: int) -> Series:
        """The buckets in ``[start, end)``; windows are kept where they overlap it."""
        return Series(
            self.query,
            {b: c for b, c in self.counts.items() if start <= b < end},
            [(s, e) for s, e in self.windows if s < end and e >= start],
        )


def query_of(path: Path) -> str:
    return path.stem.removeprefix("Twitter_volume_")


def load_series(directory: Path, queries: Iterable[str] | None = None) -> list[Series]:
    """Every ``*.csv`` of ``directory`` (or those of ``queries``), with ``labels.json``'s windows.

    Raises ``ValueError`` naming the file and line of a malformed row.
    """
    labels_path = directory / "labels.json"
    labels: Mapping[str, Sequence[Sequence[str]]] = (
        json.loads(labels_path.read_text()) if labels_path.exists() else {}
    )
    by_file = {Path(name).name: windows for name, windows in labels.items()}
    wanted = set(queries) if queries is not None else None
    found: list[Series] = []
    for path in sorted(directory.glob("*.csv")):
        query = query_of(path)
        if wanted is not None and query not in wanted:
            continue
        counts: dict[int, int] = {}
        with path.open(newline="") as file:
            rows = csv.reader(file)
            header = next(rows, None)
            if header is None or [h.strip() for h in header[:2]] != ["timestamp", "value"]:
                raise ValueError(f"{path}: the header must be 'timestamp,value', got {header}")
            for number, row in enumerate(rows, start=2):
                try:
                    counts[parse_time(row[0])] = round(float(row[1]))
                except (ValueError, IndexError) as exc:
                    raise ValueError(f"{path}:{number}: not 'timestamp,count': {row}") from exc
        windows = [(parse_time(s), parse_time(e)) for s, e in by_file.get(path.name, [])]
        found.append(Series(query, counts, windows))
    if wanted is not None and (missing := wanted - {s.query for s in found}):
        raise ValueError(f"{directory} has no series for {sorted(missing)}")
    if not found:
        raise ValueError(f"{directory} holds no *.csv series")
    return found


@dataclass(frozen=True, slots=True, order=True)
class Detection:
    query: str
    kind: str  # "spike" | "dip"
    bucket: int


@dataclass(frozen=True, slots=True)
class Score:
    """NAB window scoring of one set of detections against labelled windows."""

    windows: int
    found: int
    false_alarms: int
    detections: int

    @property
    def recall(self) -> float:
        return self.found / self.windows if self.windows else 1.0

    @property
    def precision(self) -> float:
        flagged = self.found + self.false_alarms
        return self.found / flagged if flagged else 1.0

    def __add__(self, other: Score) -> Score:
        return Score(
            self.windows + other.windows,
            self.found + other.found,
            self.false_alarms + other.false_alarms,
            self.detections + other.detections,
        )


def score(windows: Sequence[tuple[int, int]], detections: Iterable[int]) -> Score:
    """A window is found when a detection falls inside it (ends included); a detection
    outside every window is a false alarm; further detections in a found window count
    neither way."""
    found: set[int] = set()
    false_alarms = 0
    count = 0
    for moment in detections:
        count += 1
        inside = [i for i, (start, end) in enumerate(windows) if start <= moment <= end]
        if inside:
            found.update(inside)
        else:
            false_alarms += 1
    return Score(len(windows), len(found), false_alarms, count)
