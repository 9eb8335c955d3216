"""Zeitgeist's parameters chosen honestly: leave-one-series-out cross-validation, then checks.

    python bench/zeitgeist_cv.py [--jobs 2] [--rounds 3] [--seeds 101,102,103]

0. **The hindsight bound**: each of the five tweet series with the spike and dip bars that
   score best on it (:func:`hindsight_bars`). In-sample by construction: the most any way of
   setting the bars from a series' own traffic could reach with this model's evidence
   (``--hindsight-only`` prints just this, in about two minutes).
   ``--long-horizon-only`` prints instead the defaults with a second spike detector beside
   them, on a model whose level moves over days and evidence summed over 12 and 24 hours
   (:func:`long_horizon`, the settings of :data:`LONG_HORIZON`), in-sample.
1. **Cross-validation** over the five tweet series the job ships
   (``examples/zeitgeist/data/nab``): for each series, a coordinate search over every tunable
   parameter (:data:`MODEL_SPACE` and the bar's own, :data:`BARS`;
   :func:`zeitgeist.protocol.cross_search`, by NAB standard score) on the four others chooses
   the parameters, which are then scored on it. The five held-out results added up are the
   headline: what to expect on tweets the parameters never saw. It runs once per kind of bar
   (the usual daily peaks; peaks over threshold), and the kind with the better
   cross-validated score is the one checked. In-sample rows (the defaults, and the search's
   choice on all five) are shown beside it, labelled so, and so is the trade-off the
   defaults' evidence allows: every bar scaled by one factor, from twice to 0.4 times.
2. **Checks** of the defaults and of the search's choice on all five tweet series, on series
   that took no part in choosing: the NAB series that fit the model
   (``examples/zeitgeist/data/nab-check``, its README says which and why), beside detectors
   published with NAB on the same series; the artificialNoAnomaly series, where every alarm is
   false; and generated traffic with seeds never used for tuning (the defaults saw 7 to 9).

Every row is the offline reference (``zeitgeist.offline``, whose detections equal the streaming
job's), scored as ``bench/nab_anchors.py`` scores: a run of adjacent flagged rows outside every
window is one false alarm, nothing counts in NAB's probation, NAB standard score normalised
over the row's series. NAB's other tweet series are the project's held-out test and are not
read here. Pure Python, no services; about ten minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
for path in (ROOT, EXAMPLES):  # run as a script: `bench.nab_anchors` and `zeitgeist`
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from zeitgeist.generate import generate  # noqa: E402
from zeitgeist.model import ModelParams  # noqa: E402
from zeitgeist.offline import trace  # noqa: E402
from zeitgeist.protocol import (  # noqa: E402
    Judge,
    Judged,
    changes,
    cross_search,
    detections,
    judge_params,
)
from zeitgeist.series import Series, load_series  # noqa: E402

from bench.nab_anchors import PUBLISHED, SERIES, Row, published, score_detector  # noqa: E402

CHECK = EXAMPLES / "zeitgeist" / "data" / "nab-check"
# Every tunable parameter and the values the search may give it (the default among them):
# the model's, then each kind of bar's.
MODEL_SPACE: dict[str, tuple[Any, ...]] = {
    "threshold": (5.0, 6.0, 7.5),
    "dip_threshold": (4.5, 6.0, 7.5),
    "dev_alpha": (0.0025, 0.005, 0.01),
    "level_alpha": (0.01, 0.02, 0.04),
    "profile_alpha": (0.025, 0.05, 0.1),
    "week_alpha": (0.0, 0.05, 0.2),
    "clip": (1.5, 2.0, 3.0),
    "freeze": (1.0, 1.5, 2.5),
    "hold": (24, 48, 96),
    "cooldown": (144, 288, 576),
    "spike_scales": ((1, 3, 6, 12), (1, 3, 12), (1, 6, 24)),
    "dip_scales": ((6, 24), (12, 48), (6, 24, 72)),
}
BARS: dict[str, tuple[ModelParams, dict[str, tuple[Any, ...]]]] = {
    # Bars from each scale's usual daily peak: the defaults.
    "peaks": (
        ModelParams(),
        {
            "tail": (1.5, 2.0, 2.5),
            "calm_peak": (3.0, 3.4, 4.0),
            "peak_alpha": (0.08, 0.15, 0.3),
            "peak_cap": (1.5, 2.5, 4.0),
        },
    ),
    # Peaks over threshold: each scale's tail a generalised Pareto, the bar its quantile.
    "pot": (
        ModelParams(bar="pot"),
        {
            "risk": (3e-5, 1e-4, 3e-4),
            "pot_level": (0.95, 0.98, 0.99),
            "pot_alpha": (0.002, 0.005, 0.02),
        },
    ),
}
# The factors the trade-off section scales every bar by.
TRADE_OFF = (2.0, 1.5, 1.25, 1.0, 0.8, 0.6, 0.4)
# The hindsight bound's factors, for the spike bars and the dip bars apart: each series gets
# the best of the 144 pairs.
HINDSIGHT = (0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.2, 1.4, 1.6, 1.8, 2.0, 2.5)
ANCHORS = ("ARTime", "contextOSE", "knncad", "numenta")  # the published detectors shown
# A long-horizon spike detector beside the defaults (:func:`long_horizon`): a second model
# whose level moves over days, its evidence summed over 12 and 24 hours, with these values.
# Its quiet after a declaration is two days: a 24-hour sum still holds the event a day on.
LONG_HORIZON: dict[str, tuple[Any, ...]] = {
    "level_alpha": (0.0005, 0.001),  # per bucket: a level half-life of ~2 days or ~1
    "spike_scales": ((288,), (144, 288)),
    "threshold": (3.5, 4.5, 5.5),
    "calm_peak": (3.4, 6.0),
    "cooldown": (576,),
}


def _judge_one(task: tuple[Series, ModelParams]) -> Judged:
    return judge_params(*task)


def flags(series: Sequence[Series], params: ModelParams) -> dict[str, list[int]]:
    """The offline reference's detections per query (``params`` carried to each series'
    bucket length)."""
    return {one.query: detections(one, params) for one in series}


def scaled_bars(params: ModelParams, factor: float) -> ModelParams:
    """``params`` with every bar ``factor`` times as high: the spike and the dip thresholds,
    which every scale's bar is a multiple of."""
    return replace(
        params,
        threshold=params.threshold * factor,
        dip_threshold=params.dip_threshold * factor,
    )


def hindsight_bars(
    series: Sequence[Series],
    params: ModelParams,
    judge: Judge,
) -> dict[str, ModelParams]:
    """Per series, ``params`` with the spike and the dip bars scaled by the pair of
    :data:`HINDSIGHT` factors that scores best there (NAB raw score; ties: fewer false
    alarms, then the lower bars): what the best calibration of the bars could do, chosen
    looking at the answers. No rule that sets bars from a series' own traffic (peaks over
    threshold, any extreme-value fit) can do better with the same evidence."""
    candidates = [
        replace(
            params, threshold=params.threshold * spike, dip_threshold=params.dip_threshold * dip
        )
        for spike in HINDSIGHT
        for dip in HINDSIGHT
    ]
    judged = judge([(one, candidate) for one in series for candidate in candidates])
    best: dict[str, ModelParams] = {}
    for number, one in enumerate(series):
        mine = judged[number * len(candidates) : (number + 1) * len(candidates)]
        _, chosen = max(
            zip(mine, candidates, strict=True),
            key=lambda pair: (pair[0][1].raw, -pair[0][0].false_alarms),
        )
        best[one.query] = chosen
    return best


def long_horizon(series: Series, params: ModelParams) -> list[int]:
    """The buckets where the spike detector of the offline reference with ``params`` (a slow
    level, long scales) declares, on ``series``: what a rise sustained for most of a day,
    which the defaults' level (a half-life of hours) learns as it goes, adds up to."""
    return [d.bucket for d in trace(series, params).detections if d.kind == "spike"]


def _long_horizon_one(task: tuple[Series, ModelParams]) -> list[int]:
    return long_horizon(*task)


def print_long_horizon(
    series: Sequence[Series], defaults: ModelParams, pool: Any, limit: int = 8
) -> None:
    """The defaults with a long-horizon detector beside them (in-sample, every combination of
    :data:`LONG_HORIZON`), best NAB score first."""
    candidates = [
        replace(defaults, **dict(zip(LONG_HORIZON, values, strict=True)))
        for values in itertools.product(*LONG_HORIZON.values())
    ]
    found = pool.map(
        _long_horizon_one, [(one, c) for c in candidates for one in series], chunksize=2
    )
    base = flags(series, defaults)
    rows = [score_detector("Zeitgeist defaults (in-sample)", series, base)]
    for number, candidate in enumerate(candidates):
        mine = found[number * len(series) : (number + 1) * len(series)]
        union = {
            one.query: sorted({*base[one.query], *extra})
            for one, extra in zip(series, mine, strict=True)
        }
        label = (
            f"+ level {candidate.level_alpha}, k {candidate.spike_scales}, "
            f"bar {candidate.threshold}, calm {candidate.calm_peak}"
        )
        rows.append(score_detector(label, series, union))
    rows[1:] = sorted(rows[1:], key=lambda row: -row.nab.raw)[:limit]
    print_rows(
        "a long-horizon spike detector beside the defaults (in-sample; the best of "
        f"{len(candidates)} settings)",
        rows,
    )


def print_rows(title: str, rows: Sequence[Row]) -> None:
    width = max(34, *(len(row.detector) for row in rows))
    header = (
        f"{'':<{width}} {'windows':>8} {'false alarms':>12} {'recall':>6} {'precision':>9} "
        f"{'NAB':>6}"
    )
    print(f"\n{title}\n{header}\n{'-' * len(header)}")
    for row in rows:
        nab = row.nab.normalised
        print(
            f"{row.detector:<{width}} {row.score.found:>4}/{row.score.windows:<3} "
            f"{row.score.false_alarms:>12} {row.score.recall:>6.2f} "
            f"{row.score.precision:>9.2f} {'' if nab is None else format(nab, '.1f'):>6}"
        )


def print_hindsight(
    series: Sequence[Series], bound: Mapping[str, ModelParams], defaults: ModelParams
) -> None:
    """The hindsight bound: each series' best bars, and the five together."""
    print(
        "\nthe hindsight bound (in-sample by construction): each series with the spike and "
        "dip bars that score best there"
    )
    for one in series:
        chosen = bound[one.query]
        print(
            f"  {one.query:<8} spike bars x{chosen.threshold / defaults.threshold:.2f}, "
            f"dip bars x{chosen.dip_threshold / defaults.dip_threshold:.2f}"
        )
    print_rows(
        f"the {len(series)} tweet series",
        [
            score_detector(
                "Zeitgeist, best bars per series",
                series,
                {q: v for one in series for q, v in flags([one], bound[one.query]).items()},
            ),
            score_detector("Zeitgeist defaults (in-sample)", series, flags(series, defaults)),
        ],
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2, help="processes (default 2)")
    parser.add_argument("--rounds", type=int, default=3, help="search rounds at most")
    parser.add_argument(
        "--hindsight-only",
        action="store_true",
        help="only the hindsight bound of the bars (about two minutes)",
    )
    parser.add_argument(
        "--long-horizon-only",
        action="store_true",
        help="only the long-horizon detector beside the defaults (about twenty seconds)",
    )
    parser.add_argument(
        "--seeds",
        default="101,102,103",
        help="generated traffic's seeds, never used for tuning (default 101,102,103)",
    )
    args = parser.parse_args(argv)
    started = time.monotonic()
    tweets = load_series(SERIES)
    defaults = ModelParams()
    flagged = published(PUBLISHED, (s.query for s in tweets))
    crossed: dict[str, Row] = {}
    searched: dict[str, ModelParams] = {}
    with multiprocessing.get_context("fork").Pool(args.jobs) as pool:

        def judge(pairs: Sequence[tuple[Series, ModelParams]]) -> list[Judged]:
            return pool.map(_judge_one, pairs, chunksize=2)

        if args.long_horizon_only:
            print_long_horizon(tweets, defaults, pool)
            print(f"\n{time.monotonic() - started:.0f} s")
            return
        bound = hindsight_bars(tweets, defaults, judge)
        print_hindsight(tweets, bound, defaults)
        if args.hindsight_only:
            print(f"\n{time.monotonic() - started:.0f} s")
            return
        for bar, (base, bar_space) in BARS.items():
            space = {**MODEL_SPACE, **bar_space}
            folds, everything = cross_search(tweets, space, base, judge=judge, rounds=args.rounds)
            print(
                f"\nbars '{bar}': leave-one-series-out cross-validation over the "
                f"{len(tweets)} shipped tweet series, a coordinate search over {len(space)} "
                "parameters on four, scored on the fifth"
            )
            print(f"{'held out':<8} {'NAB there':>9}  chosen on the other four")
            held_out: dict[str, list[int]] = {}
            for fold in folds:
                one = next(s for s in tweets if s.query == fold.held_out)
                held_out.update(flags([one], fold.params))
                nab = fold.held_out_nab.normalised
                print(
                    f"{fold.held_out:<8} {'' if nab is None else format(nab, '.1f'):>9}  "
                    f"{changes(fold.params, defaults)}"
                )
            crossed[bar] = score_detector(f"Zeitgeist '{bar}', cross-validated", tweets, held_out)
            searched[bar] = everything.params
            print(
                f"searched on all five ({everything.rounds} rounds): "
                f"{changes(everything.params, defaults)}"
            )
    # The kind of bar is chosen as every parameter is: by its cross-validated score.
    best = max(crossed, key=lambda bar: crossed[bar].nab.raw)
    chosen = searched[best]
    print_rows(
        f"the {len(tweets)} tweet series",
        [
            *crossed.values(),
            score_detector("Zeitgeist defaults (in-sample)", tweets, flags(tweets, defaults)),
            score_detector("Zeitgeist searched (in-sample)", tweets, flags(tweets, chosen)),
            *(score_detector(name, tweets, flagged[name]) for name in ANCHORS),
        ],
    )
    print_rows(
        "the trade-off of the defaults' evidence (in-sample): every bar scaled by one factor",
        [
            score_detector(
                f"Zeitgeist defaults, bars x{factor}",
                tweets,
                flags(tweets, scaled_bars(defaults, factor)),
            )
            for factor in TRADE_OFF
        ],
    )
    print(f"\nthe checks compare the defaults with bars '{best}' searched on all five")

    checks = load_series(CHECK)
    flagged = published(PUBLISHED, (s.query for s in checks))
    labelled = [s for s in checks if s.windows]
    quiet = [s for s in checks if not s.windows]
    for title, group in (
        ("NAB series that fit the model (out of sample)", labelled),
        ("NAB series without anomalies: every alarm is false", quiet),
    ):
        for one in group:
            rows = [
                score_detector("Zeitgeist defaults", [one], flags([one], defaults)),
                score_detector("Zeitgeist searched", [one], flags([one], chosen)),
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
            score_detector("Zeitgeist defaults", generated, flags(generated, defaults)),
            score_detector("Zeitgeist searched", generated, flags(generated, chosen)),
        ],
    )
    print(f"\n{time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
