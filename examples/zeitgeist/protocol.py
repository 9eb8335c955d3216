"""Choosing the detector's parameters honestly: leave-one-series-out cross-validation.

Fold ``i`` chooses the parameters by a coordinate search on every series but the ``i``-th
(:func:`search`: from the defaults, each parameter in turn takes the best of its values with
the others held, round after round until a round changes nothing), and reports what that
choice does on the ``i``-th, which took no part in choosing it (:func:`cross_search`). The
folds' held-out figures, added up, are the cross-validated figures: what to expect on traffic
the parameters never saw.

Every candidate (a :class:`~zeitgeist.model.ModelParams`) is run on a series by the offline
reference (whose detections equal the streaming job's) and judged there
(:func:`zeitgeist.series.judge`), once however many folds and rounds ask. Its NAB raw score
is the objective (NAB's standard profile weighs a missed window as much as nine false
alarms); ties go to fewer false alarms, then to the value held.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

from zeitgeist.model import ModelParams
from zeitgeist.offline import trace
from zeitgeist.series import NabScore, Score, Series, judge

__all__ = [
    "Fold",
    "Judge",
    "Judged",
    "Searched",
    "changes",
    "cross_search",
    "detections",
    "judge_params",
    "search",
]

Judged = tuple[Score, NabScore]
"""One candidate's outcome on one series."""


def detections(series: Series, params: ModelParams) -> list[int]:
    """The buckets where the offline reference declares anomalies on ``series``, ``params``
    carried to its bucket length."""
    if len(series.counts) > 1:
        params = params.for_bucket(series.bucket)
    return [d.bucket for d in trace(series, params).detections]


def judge_params(series: Series, params: ModelParams) -> Judged:
    """``params`` on ``series`` (:func:`detections`), judged against its windows."""
    return judge(series, detections(series, params))


def changes(params: ModelParams, base: ModelParams) -> str:
    """The fields in which ``params`` differ from ``base``, as ``name=value`` (or
    ``defaults``)."""
    changed = [
        f"{f.name}={getattr(params, f.name)}"
        for f in fields(ModelParams)
        if getattr(params, f.name) != getattr(base, f.name)
    ]
    return " ".join(changed) or "defaults"


def _better(new: Judged, old: Judged) -> bool:
    """A better NAB raw score, or as good with fewer false alarms."""
    return (new[1].raw, -new[0].false_alarms) > (old[1].raw, -old[0].false_alarms)


def _total(judged: Iterable[Judged]) -> Judged:
    score, nab = Score(0, 0, 0, 0), NabScore(0.0, 0)
    for one, one_nab in judged:
        score, nab = score + one, nab + one_nab
    return score, nab


@dataclass(frozen=True)
class Fold:
    """One fold: the series held out, the parameters chosen on the others, and their
    outcome on the held-out series (and, for comparison, on the series they were chosen
    on)."""

    held_out: str
    params: ModelParams
    held_out_score: Score
    held_out_nab: NabScore
    training_nab: NabScore


Judge = Callable[[Sequence[tuple[Series, ModelParams]]], list[Judged]]
"""Judges many (series, params) pairs at once (in parallel, say); :func:`judge_params` each."""


def _judge_serially(pairs: Sequence[tuple[Series, ModelParams]]) -> list[Judged]:
    return [judge_params(one, params) for one, params in pairs]


class _Memo:
    """Every (series, params) judged at most once across folds and rounds."""

    def __init__(self, judge: Judge) -> None:
        self.judge = judge
        self.known: dict[tuple[str, ModelParams], Judged] = {}

    def totals(self, series: Sequence[Series], candidates: Sequence[ModelParams]) -> list[Judged]:
        missing = [
            (one, params)
            for params in dict.fromkeys(candidates)
            for one in series
            if (one.query, params) not in self.known
        ]
        for (one, params), judged in zip(missing, self.judge(missing), strict=True):
            self.known[(one.query, params)] = judged
        return [_total(self.known[(one.query, params)] for one in series) for params in candidates]


@dataclass(frozen=True)
class Searched:
    """What a coordinate search chose, its total on the series it searched, and the rounds it
    took."""

    params: ModelParams
    total: Judged
    rounds: int


def search(
    series: Sequence[Series],
    space: Mapping[str, Sequence[Any]],
    base: ModelParams | None = None,
    *,
    judge: Judge | None = None,
    rounds: int = 3,
    memo: _Memo | None = None,
) -> Searched:
    """The coordinate search's choice on ``series``: from ``base``, each parameter of
    ``space`` in turn takes the value (of its values there) with the best NAB standard score
    on ``series``, the others held; ties keep the current value. Stops after a round that
    changes nothing, or after ``rounds``."""
    base = base or ModelParams()
    if unknown := set(space) - {f.name for f in fields(ModelParams)}:
        raise ValueError(f"ModelParams has no {sorted(unknown)}")
    memo = memo or _Memo(judge or _judge_serially)
    current = base
    (best,) = memo.totals(series, [current])
    done = 0
    while done < rounds:
        done += 1
        changed = False
        for name, values in space.items():
            candidates = [replace(current, **{name: value}) for value in values]
            for candidate, total in zip(candidates, memo.totals(series, candidates), strict=True):
                if _better(total, best):
                    current, best, changed = candidate, total, True
        if not changed:
            break
    return Searched(current, best, done)


def cross_search(
    series: Sequence[Series],
    space: Mapping[str, Sequence[Any]],
    base: ModelParams | None = None,
    *,
    judge: Judge | None = None,
    rounds: int = 3,
) -> tuple[list[Fold], Searched]:
    """Leave-one-series-out cross-validation of :func:`search`: each fold searches on every
    series but one and scores its choice on that one. Also returns the search on all of
    ``series`` (the parameters to ship)."""
    if len(series) < 2:
        raise ValueError("cross-validation needs at least two series")
    memo = _Memo(judge or _judge_serially)
    folds = []
    for held_out in series:
        training = [one for one in series if one is not held_out]
        found = search(training, space, base, rounds=rounds, memo=memo)
        ((score, nab),) = memo.totals([held_out], [found.params])
        folds.append(Fold(held_out.query, found.params, score, nab, found.total[1]))
    return folds, search(series, space, base, rounds=rounds, memo=memo)
