"""``bench/zeitgeist_cv.py``: the hindsight bound picks each series' best bars; the
long-horizon detector finds a sustained rise once."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest
from zeitgeist.model import BUCKET_MICROS, ModelParams
from zeitgeist.series import NabScore, Score, Series

from bench.zeitgeist_cv import HINDSIGHT, LONG_HORIZON, hindsight_bars, long_horizon

pytestmark = pytest.mark.unit

# The bar factors each series scores best with: (spike, dip).
BEST = {"a": (1.4, 0.8), "b": (0.5, 2.5)}


def judge(pairs: Sequence[tuple[Series, ModelParams]]) -> list[tuple[Score, NabScore]]:
    defaults = ModelParams()
    judged = []
    for one, params in pairs:
        spike, dip = BEST[one.query]
        off = abs(params.threshold / defaults.threshold - spike)
        off += abs(params.dip_threshold / defaults.dip_threshold - dip)
        judged.append((Score(1, 1, 0, 1), NabScore(-off, 1)))
    return judged


def test_each_series_gets_the_bars_that_score_best_on_it() -> None:
    series = [Series(query, {0: 1}, []) for query in BEST]
    defaults = ModelParams()

    bound = hindsight_bars(series, defaults, judge)

    for query, (spike, dip) in BEST.items():
        assert bound[query].threshold == pytest.approx(defaults.threshold * spike)
        assert bound[query].dip_threshold == pytest.approx(defaults.dip_threshold * dip)
        assert spike in HINDSIGHT
        assert dip in HINDSIGHT


def test_a_tie_goes_to_fewer_false_alarms() -> None:
    series = [Series("a", {0: 1}, [])]
    defaults = ModelParams()

    def flat(pairs: Sequence[tuple[Series, ModelParams]]) -> list[tuple[Score, NabScore]]:
        # The same NAB score everywhere; false alarms fall as the spike bar rises.
        return [
            (Score(1, 1, int(1000 / params.threshold), 1), NabScore(0.0, 1)) for _, params in pairs
        ]

    bound = hindsight_bars(series, defaults, flat)
    assert bound["a"].threshold == pytest.approx(defaults.threshold * max(HINDSIGHT))


def _daily(days: int, rise: tuple[int, int] | None = None) -> Series:
    """Noiseless traffic with a daily rhythm over ``days`` days of 5-minute buckets; ``rise``
    (first bucket, buckets) carries 1.7 times the usual count."""
    counts = {}
    for number in range(days * 288):
        usual = 100 + 60 * math.sin(2 * math.pi * number / 288)
        risen = rise is not None and rise[0] <= number < rise[0] + rise[1]
        counts[number * BUCKET_MICROS] = round(usual * (1.7 if risen else 1.0))
    return Series("q", counts)


def test_the_long_horizon_detector_finds_a_rise_sustained_for_most_of_a_day() -> None:
    params = ModelParams(
        level_alpha=LONG_HORIZON["level_alpha"][0],
        spike_scales=LONG_HORIZON["spike_scales"][0],
        threshold=LONG_HORIZON["threshold"][0],
        cooldown=LONG_HORIZON["cooldown"][0],
    )
    start = 12 * 288 + 100  # day 12, 8:20: ten hours of 1.7 times the usual traffic
    found = [bucket // BUCKET_MICROS for bucket in long_horizon(_daily(16, (start, 120)), params)]
    # Once, within the rise: not again a day on, while the 24-hour sum still holds it.
    assert len(found) == 1, found
    assert start <= found[0] < start + 120, found
    assert long_horizon(_daily(16), params) == []
