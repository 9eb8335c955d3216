"""Zeitgeist's parameters chosen honestly: leave-one-series-out cross-validation, then checks.

    python bench/zeitgeist_cv.py [--jobs 2] [--seeds 101,102,103]

1. **Cross-validation** over the five tweet series the job ships
   (``examples/zeitgeist/data/nab``): for each series, the grid's best candidate on the four
   others (NAB standard score, :mod:`zeitgeist.protocol`) is scored on it. The five held-out
   results added up are the headline: what to expect on tweets the parameters never saw.
   In-sample rows (the defaults, and the grid's best on all five) are shown for comparison,
   labelled so.
2. **Checks** of the defaults and of the candidate chosen on all five tweet series, on series
   that took no part in choosing: the NAB series that fit the model
   (``examples/zeitgeist/data/nab-check``, its README says which and why), beside the detectors
   published with NAB on the same series; the artificialNoAnomaly series, where every alarm is
   false; and generated traffic with seeds never used for tuning (the defaults saw 7 to 9).

Every row is the offline reference (``zeitgeist.offline``, whose detections equal the streaming
job's), scored as ``bench/nab_anchors.py`` scores: a run of adjacent flagged rows outside every
window is one false alarm, nothing counts in NAB's probation, NAB standard score normalised
over the row's series. NAB's other tweet series are the project's held-out test and are not
read here. Pure Python, no services; a few minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
for path in (ROOT, EXAMPLES):  # run as a script: `bench.nab_anchors` and `zeitgeist`
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from zeitgeist.generate import generate  # noqa: E402
from zeitgeist.model import ModelParams  # noqa: E402
from zeitgeist.offline import trace  # noqa: E402
from zeitgeist.protocol import (  # noqa: E402
    Judged,
    changes,
    choose,
    cross_validate,
    grid,
    judge_params,
)
from zeitgeist.series import Series, load_series  # noqa: E402

from bench.nab_anchors import PUBLISHED, SERIES, Row, published, score_detector  # noqa: E402

CHECK = EXAMPLES / "zeitgeist" / "data" / "nab-check"
# The grid: the bars of both detectors, how far into its own tail a series' usual peak sits,
# and how long the scale remembers misses. The defaults come first.
GRID = {
    "threshold": (5.0, 6.0, 7.5),
    "dip_threshold": (4.5, 6.0, 7.5),
    "tail": (1.5, 2.0, 2.5),
    "dev_alpha": (0.0025, 0.005, 0.01),
}
ANCHORS = ("ARTime", "contextOSE", "knncad", "numenta")  # the published detectors shown


def _judge_one(task: tuple[Series, ModelParams]) -> Judged:
    return judge_params(*task)


def judge_everything(
    series: Sequence[Series], candidates: Sequence[ModelParams], jobs: int
) -> list[dict[str, Judged]]:
    """Each candidate's outcome per query (:func:`cross_validate`'s ``judge_all``), on
    ``jobs`` processes."""
    tasks = [(one, params) for params in candidates for one in series]
    with multiprocessing.get_context("fork").Pool(jobs) as pool:
        results = pool.map(_judge_one, tasks, chunksize=4)
    return [
        {one.query: results[c * len(series) + s] for s, one in enumerate(series)}
        for c in range(len(candidates))
    ]


def detections(series: Sequence[Series], params: ModelParams) -> dict[str, list[int]]:
    """The offline reference's detections per query (``params`` carried to each series'
    bucket length)."""
    found: dict[str, list[int]] = defaultdict(list)
    for one in series:
        carried = params.for_bucket(one.bucket) if len(one.counts) > 1 else params
        found[one.query] = [d.bucket for d in trace(one, carried).detections]
    return found


def print_rows(title: str, rows: Sequence[Row]) -> None:
    header = (
        f"{'':<34} {'windows':>8} {'false alarms':>12} {'recall':>6} {'precision':>9} {'NAB':>6}"
    )
    print(f"\n{title}\n{header}\n{'-' * len(header)}")
    for row in rows:
        nab = row.nab.normalised
        print(
            f"{row.detector:<34} {row.score.found:>4}/{row.score.windows:<3} "
            f"{row.score.false_alarms:>12} {row.score.recall:>6.2f} "
            f"{row.score.precision:>9.2f} {'' if nab is None else format(nab, '.1f'):>6}"
        )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2, help="processes (default 2)")
    parser.add_argument(
        "--seeds",
        default="101,102,103",
        help="generated traffic's seeds, never used for tuning (default 101,102,103)",
    )
    args = parser.parse_args(argv)
    started = time.monotonic()
    tweets = load_series(SERIES)
    defaults = ModelParams()
    candidates = grid(defaults, **GRID)
    outcomes = judge_everything(tweets, candidates, args.jobs)
    folds = cross_validate(tweets, candidates, judge_all=lambda *_: outcomes)
    print(
        f"leave-one-series-out cross-validation over the {len(tweets)} shipped tweet series, "
        f"{len(candidates)} candidates ({', '.join(GRID)}), chosen by NAB standard score"
    )
    print(f"\n{'held out':<8} {'chosen on the other four':<58} {'NAB there':>9}")
    held_out: dict[str, list[int]] = {}
    for fold in folds:
        one = next(s for s in tweets if s.query == fold.held_out)
        held_out.update(detections([one], fold.params))
        nab = fold.held_out_nab.normalised
        print(
            f"{fold.held_out:<8} {changes(fold.params, defaults):<58} "
            f"{'' if nab is None else format(nab, '.1f'):>9}"
        )
    chosen = candidates[choose(outcomes, (s.query for s in tweets))[0]]
    flagged = published(PUBLISHED, (s.query for s in tweets))
    print_rows(
        f"the {len(tweets)} tweet series",
        [
            score_detector("Zeitgeist, cross-validated", tweets, held_out),
            score_detector("Zeitgeist defaults (in-sample)", tweets, detections(tweets, defaults)),
            score_detector(
                "Zeitgeist best of grid (in-sample)", tweets, detections(tweets, chosen)
            ),
            *(score_detector(name, tweets, flagged[name]) for name in ANCHORS),
        ],
    )
    print(f"\nbest of grid on all five: {changes(chosen, defaults)}")

    checks = load_series(CHECK)
    labelled = [s for s in checks if s.windows]
    quiet = [s for s in checks if not s.windows]
    flagged = published(PUBLISHED, (s.query for s in checks))
    for title, group in (
        ("NAB series that fit the model (out of sample)", labelled),
        ("NAB series without anomalies: every alarm is false", quiet),
    ):
        for one in group:
            rows = [
                score_detector("Zeitgeist defaults", [one], detections([one], defaults)),
                score_detector("Zeitgeist best of grid", [one], detections([one], chosen)),
                *(score_detector(name, [one], flagged[name]) for name in ANCHORS),
            ]
            print_rows(f"{title}: {one.query} ({one.bucket // 60_000_000}-minute buckets)", rows)

    seeds = [int(s) for s in args.seeds.split(",") if s]
    generated = [
        Series(f"{seed}/{one.query}", one.counts, one.windows)
        for seed in seeds
        for one in generate(seed=seed).series
    ]
    print_rows(
        f"generated traffic, seeds {', '.join(map(str, seeds))} (never used for tuning)",
        [
            score_detector("Zeitgeist defaults", generated, detections(generated, defaults)),
            score_detector("Zeitgeist best of grid", generated, detections(generated, chosen)),
        ],
    )
    print(f"\n{time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
