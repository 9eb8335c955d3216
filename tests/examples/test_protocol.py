"""Leave-one-series-out cross-validation: a fold never chooses with the series it holds out."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pytest
from zeitgeist.model import ModelParams
from zeitgeist.protocol import Judged, changes, cross_search, judge_params, search
from zeitgeist.series import NabScore, Score, Series


def _judged(raw: float, false_alarms: int = 0) -> Judged:
    return Score(1, 1, false_alarms, 1 + false_alarms), NabScore(raw, 1)


def _series(*queries: str) -> list[Series]:
    return [Series(q, {0: 1, 300_000_000: 1}, [(0, 1)]) for q in queries]


@pytest.mark.unit
def test_a_tie_goes_to_fewer_false_alarms_then_to_the_value_held() -> None:
    series = _series("A")
    false_alarms = {5.0: 3, 6.0: 2, 7.0: 1, 8.0: 1}  # every value scores 0.5

    def judge(pairs: Sequence[tuple[Series, ModelParams]]) -> list[Judged]:
        return [_judged(0.5, false_alarms[params.threshold]) for _, params in pairs]

    assert search(series, {"threshold": (5.0, 7.0, 8.0)}, judge=judge).params.threshold == 7.0


@pytest.mark.unit
def test_changes_say_what_differs() -> None:
    base = ModelParams()
    assert changes(base, base) == "defaults"
    assert changes(replace(base, tail=3.0), base) == "tail=3.0"
    with pytest.raises(ValueError, match="two series"):
        cross_search(_series("A"), {"tail": (3.0,)})


@pytest.mark.unit
def test_judging_carries_the_params_to_the_series_bucket_length() -> None:
    half_hour = 1_800_000_000
    steady = {i * half_hour: 100 for i in range(10 * 48)}
    steady.update({i * half_hour: 900 for i in range(6 * 48, 6 * 48 + 2)})  # a spike on day 6
    spiked = Series("taxi", steady, [(6 * 48 * half_hour, (6 * 48 + 4) * half_hour)])
    score, nab = judge_params(spiked, ModelParams())
    # At 5-minute settings the warm-up alone (576 buckets, 12 days here) would hide the spike.
    assert (score.found, score.false_alarms) == (1, 0)
    assert nab.raw > 0


@pytest.mark.unit
def test_the_coordinate_search_chooses_per_fold_and_judges_each_pair_once() -> None:
    series = _series("A", "B", "C")
    liked = {"A": 5.0, "B": 7.5, "C": 7.5}  # each series' best threshold
    judged: list[tuple[str, ModelParams]] = []

    def judge(pairs: Sequence[tuple[Series, ModelParams]]) -> list[Judged]:
        judged.extend((one.query, params) for one, params in pairs)
        return [_judged(-abs(params.threshold - liked[one.query])) for one, params in pairs]

    space = {"threshold": (5.0, 6.0, 7.5), "tail": (2.0,)}
    folds, everything = cross_search(series, space, judge=judge)
    # Held out A, B and C agree on 7.5; held out B, A and C tie every value: the default stays.
    assert [(f.held_out, f.params.threshold) for f in folds] == [
        ("A", 7.5),
        ("B", 6.0),
        ("C", 6.0),
    ]
    assert folds[0].held_out_nab.raw == -2.5  # A scored with what B and C chose
    assert everything.params.threshold == 7.5
    assert everything.rounds == 2  # the second round changed nothing
    assert len(judged) == len(set(judged))  # each pair once, across folds and rounds
    with pytest.raises(ValueError, match="no \\['treshold'\\]"):
        search(series, {"treshold": (1.0,)}, judge=judge)
