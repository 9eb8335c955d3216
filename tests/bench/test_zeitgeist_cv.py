"""``bench/zeitgeist_cv.py``'s hindsight bound picks each series' best bars."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from zeitgeist.model import ModelParams
from zeitgeist.series import NabScore, Score, Series

from bench.zeitgeist_cv import HINDSIGHT, hindsight_bars

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
