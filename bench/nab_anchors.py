"""Zeitgeist beside the published NAB detectors, on the same series, with the same scoring.

    python bench/nab_anchors.py

Reads the five tweet series the job ships (``examples/zeitgeist/data/nab``) and what each
detector published in NAB's ``results/`` flagged there at its standard-profile threshold
(``examples/zeitgeist/data/nab-published/detections.csv``, from NAB at commit ea702d75, MIT),
runs Zeitgeist's offline reference (``zeitgeist.offline``, whose detections equal the
streaming job's) with its default parameters, and prints one row per detector: windows found,
false alarms (a run of adjacent flagged rows outside every window counts once), recall,
precision (found / (found + false alarms)) and NAB's standard score normalised over the five
series (``zeitgeist.series.nab_score``). Nothing counts in NAB's probation (the first 750 rows
of each series). Zeitgeist's parameters were chosen looking at these series: its row is
in-sample. Pure Python, no services; about half a minute on 2 cores.

    python bench/nab_anchors.py --ensembles

adds what an ensemble could reach: each published detector's flagged times together with
Zeitgeist's (a union: one alarm of either counts), scored the same way. A union is the most
an ensemble of the two that votes "either" can find, and its false alarms are what it pays
for that; the rows are in-sample (Zeitgeist's were chosen here, the published detectors'
thresholds on all of NAB).
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
if str(EXAMPLES) not in sys.path:
    sys.path.insert(0, str(EXAMPLES))

from zeitgeist.model import ModelParams  # noqa: E402
from zeitgeist.offline import reference_detections  # noqa: E402
from zeitgeist.series import (  # noqa: E402
    NabScore,
    Score,
    Series,
    load_series,
    nab_score,
    parse_time,
)

SERIES = EXAMPLES / "zeitgeist" / "data" / "nab"
PUBLISHED = EXAMPLES / "zeitgeist" / "data" / "nab-published" / "detections.csv"
PROBATION_ROWS = 750  # NAB's probation on series of more than 5,000 rows


@dataclass(frozen=True)
class Row:
    """One detector's window scoring (a false alarm: a run of flagged rows) and NAB score."""

    detector: str
    score: Score
    nab: NabScore


def score_detector(name: str, series: Sequence[Series], flagged: dict[str, list[int]]) -> Row:
    """One detector's row over ``series``: ``flagged`` holds its flagged times per query."""
    found = windows = false_alarms = detections = 0
    nab = NabScore(0.0, 0)
    for one in series:
        rows = sorted(one.counts)
        times = flagged.get(one.query, [])
        nab += nab_score(rows, one.windows, times)
        windows += len(one.windows)
        index = {moment: number for number, moment in enumerate(rows)}
        probation = min(PROBATION_ROWS, int(0.15 * len(rows)))
        marked = sorted(index[t] for t in set(times) if t in index and index[t] >= probation)
        inside = {
            w
            for w, (start, end) in enumerate(one.windows)
            for i in marked
            if start <= rows[i] <= end
        }
        found += len(inside)
        outside = [
            i for i in marked if not any(start <= rows[i] <= end for start, end in one.windows)
        ]
        false_alarms += sum(1 for n, i in enumerate(outside) if n == 0 or outside[n - 1] != i - 1)
        detections += len(marked)
    return Row(name, Score(windows, found, false_alarms, detections), nab)


def published(path: Path, queries: Iterable[str]) -> dict[str, dict[str, list[int]]]:
    """Each published detector's flagged times per query."""
    wanted = set(queries)
    flagged: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    with path.open() as lines:
        for row in csv.DictReader(lines):
            query = Path(row["file"]).stem.removeprefix("Twitter_volume_")
            if query in wanted:
                flagged[row["detector"]][query].append(parse_time(row["timestamp"]))
    return flagged


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--ensembles",
        action="store_true",
        help="also each published detector's alarms together with Zeitgeist's (a union)",
    )
    args = parser.parse_args(argv)
    series = load_series(SERIES)
    others = published(PUBLISHED, (s.query for s in series))
    rows = [score_detector(name, series, by_query) for name, by_query in others.items()]
    started = time.monotonic()
    ours: dict[str, list[int]] = defaultdict(list)
    for detection in reference_detections(series, ModelParams()):
        ours[detection.query].append(detection.bucket)
    seconds = time.monotonic() - started
    rows.append(score_detector("Zeitgeist (in-sample)", series, ours))
    print(
        f"the {len(series)} tweet series NAB labelled ({rows[0].score.windows} windows), "
        "each detector at its published standard threshold\n"
    )
    _print_rows(rows)
    if args.ensembles:
        unions = [
            score_detector(f"Zeitgeist + {name}", series, _union(ours, by_query))
            for name, by_query in others.items()
        ]
        print("\nZeitgeist's alarms and each detector's together (in-sample)\n")
        _print_rows(unions)
    print(f"\nZeitgeist's offline reference: {seconds:.1f} s")


def _union(*flagged: dict[str, list[int]]) -> dict[str, list[int]]:
    """The flagged times of several detectors together, per query."""
    together: dict[str, set[int]] = defaultdict(set)
    for by_query in flagged:
        for query, times in by_query.items():
            together[query].update(times)
    return {query: sorted(times) for query, times in together.items()}


def _print_rows(rows: list[Row]) -> None:
    """A table of ``rows``, the best NAB score first."""
    width = max(24, *(len(row.detector) for row in rows))
    header = (
        f"{'detector':<{width}} {'windows':>8} {'false alarms':>12} {'recall':>6} "
        f"{'precision':>9} {'NAB':>6}"
    )
    print(header)
    print("-" * len(header))
    for row in sorted(rows, key=lambda r: -(r.nab.normalised or 0.0)):
        print(
            f"{row.detector:<{width}} {row.score.found:>4}/{row.score.windows:<3} "
            f"{row.score.false_alarms:>12} {row.score.recall:>6.2f} "
            f"{row.score.precision:>9.2f} {row.nab.normalised or 0.0:>6.1f}"
        )


if __name__ == "__main__":
    main()
