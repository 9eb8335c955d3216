"""Traffic series in the Numenta Anomaly Benchmark's format, their labels, and NAB scoring.

A series directory holds CSV files (a header ``timestamp,value``, then ``YYYY-MM-DD
HH:MM:SS,count`` rows, UTC, one per bucket start: NAB's tweets have 5-minute buckets,
nyc_taxi 30-minute ones; :func:`bucket_length` finds the length) and a ``labels.json`` mapping
``<anything>/<file name>`` to a list of ``[start, end]`` anomaly windows. The query of a
series is its file name without ``.csv`` and without a ``Twitter_volume_`` prefix.
"""

from __future__ import annotations

import bisect
import csv
import itertools
import json
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

__all__ = [
    "STANDARD_PROFILE",
    "Detection",
    "NabProfile",
    "NabScore",
    "Score",
    "Series",
    "bucket_length",
    "format_time",
    "judge",
    "load_series",
    "nab_score",
    "parse_time",
    "read_series",
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

    @property
    def bucket(self) -> int:
        """The bucket length, µs: the most common step between consecutive rows."""
        return bucket_length([self])

    def between(self, start: int, end: int) -> Series:
        """The buckets in ``[start, end)``; windows are kept where they overlap it."""
        return Series(
            self.query,
            {b: c for b, c in self.counts.items() if start <= b < end},
            [(s, e) for s, e in self.windows if s < end and e >= start],
        )


def bucket_length(series: Iterable[Series]) -> int:
    """The bucket length of ``series``, µs: the most common step between consecutive rows
    of each (ties go to the shorter step). Raises ``ValueError`` without two rows."""
    steps: Counter[int] = Counter()
    for one in series:
        times = sorted(one.counts)
        steps.update(b - a for a, b in itertools.pairwise(times))
    if not steps:
        raise ValueError("a bucket length needs two rows of one series")
    return min(steps, key=lambda step: (-steps[step], step))


def query_of(path: Path) -> str:
    return path.stem.removeprefix("Twitter_volume_")


def read_series(path: Path, windows: Iterable[Sequence[str]] = ()) -> Series:
    """One NAB-format CSV (values rounded to counts) with its ``[start, end]`` windows.

    Raises ``ValueError`` naming the file and line of a malformed row.
    """
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
    spans = [(parse_time(start), parse_time(end)) for start, end in windows]
    return Series(query_of(path), counts, spans)


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
        found.append(read_series(path, by_file.get(path.name, [])))
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


@dataclass(frozen=True, slots=True)
class NabProfile:
    """A NAB application profile: the weight of a true positive, a false positive and a
    false negative (a missed window)."""

    tp: float
    fp: float
    fn: float


STANDARD_PROFILE = NabProfile(tp=1.0, fp=0.11, fn=1.0)
"""NAB's standard profile."""


@dataclass(frozen=True, slots=True)
class NabScore:
    """A NAB raw score (one series, or the sum of several) and the windows it covers, which
    normalise it: 0 is the null detector's (every window missed, no alarm), 100 the perfect
    detector's (every window caught at its first row, no false alarm)."""

    raw: float
    windows: int
    profile: NabProfile = STANDARD_PROFILE

    @property
    def normalised(self) -> float | None:
        """``None`` without windows (every alarm there is false: see :attr:`raw`)."""
        if not self.windows:
            return None
        null = -self.profile.fn * self.windows
        perfect = self.profile.tp * self.windows
        return 100.0 * (self.raw - null) / (perfect - null)

    def __add__(self, other: NabScore) -> NabScore:
        if other.profile != self.profile:
            raise ValueError("NAB scores of different profiles do not add up")
        return NabScore(self.raw + other.raw, self.windows + other.windows, self.profile)


def _scaled_sigmoid(position: float) -> float:
    # NAB's scoring function: 1 well before a window's end, -1 well after it.
    if position > 3.0:
        return -1.0
    return 2.0 / (1.0 + math.exp(5.0 * position)) - 1.0


def judge(series: Series, detections: Iterable[int]) -> tuple[Score, NabScore]:
    """``detections`` (bucket starts) on ``series``: its window scoring and NAB standard score
    (its rows: its buckets)."""
    found = list(detections)
    return score(series.windows, found), nab_score(sorted(series.counts), series.windows, found)


def nab_score(
    rows: Sequence[int],
    windows: Sequence[tuple[int, int]],
    detections: Iterable[int],
    profile: NabProfile = STANDARD_PROFILE,
) -> NabScore:
    """The NAB score of ``detections`` on one series (NAB's ``Sweeper`` at a threshold).

    ``rows`` are the series' row times, in file order; ``windows`` ``(start, end)`` times,
    ends included; a detection flags the row it falls in (the last at or before it). The first
    15 % of the rows (at most 750) are probation: nothing there counts. A detection in a
    window scores ``tp`` times the scaled sigmoid of its position relative to the window's
    end (-1 at the first row, 0 one past the last), divided by the sigmoid's value at -1,
    and only the window's first detection counts; one outside every window scores ``fp``
    times the sigmoid of its distance past the last window's end in window widths (-1
    before any window); each window without a detection scores ``-fn``.
    """
    count = len(rows)
    probation = min(math.floor(0.15 * count), 0.15 * 5000)
    # A time is found by its row; one between rows by the last row at or before it (after
    # it, for a window's start). NAB works by row index in file order, which is time order
    # but for the odd row out (machine_temperature_system_failure has one).
    index_of: dict[int, int] = {}
    for index, moment in enumerate(rows):
        index_of.setdefault(moment, index)
    times = sorted(index_of)

    def at_or_before(moment: int) -> int:
        if moment in index_of:
            return index_of[moment]
        found = bisect.bisect_right(times, moment) - 1
        return index_of[times[found]] if found >= 0 else -1

    def at_or_after(moment: int) -> int:
        if moment in index_of:
            return index_of[moment]
        found = bisect.bisect_left(times, moment)
        return index_of[times[found]] if found < len(times) else count

    flagged = {index for moment in detections if (index := at_or_before(moment)) >= probation}
    spans = []
    for start, end in sorted(windows):
        first, last = at_or_after(start), at_or_before(end)
        if first <= last:
            spans.append((first, last))
    best_tp = _scaled_sigmoid(-1.0)
    starts = [first for first, _ in spans]
    raw = 0.0
    caught: set[int] = set()
    for index in sorted(flagged):
        # The window starting last at or before the row: the one it is in, or the last
        # one before it.
        at = bisect.bisect_right(starts, index) - 1
        if at >= 0 and index <= spans[at][1]:
            if at not in caught:
                first, last = spans[at]
                position = -(last - index + 1) / (last - first + 1)
                raw += _scaled_sigmoid(position) * profile.tp / best_tp
                caught.add(at)
        elif at < 0:
            raw -= profile.fp
        else:
            first, last = spans[at]
            raw += _scaled_sigmoid((index - last) / (last - first)) * profile.fp
    raw -= profile.fn * (len(spans) - len(caught))
    return NabScore(raw, len(spans), profile)
