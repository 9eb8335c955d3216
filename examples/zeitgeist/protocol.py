"""Choosing the detector's parameters honestly: leave-one-series-out cross-validation.

Every candidate (a :class:`~zeitgeist.model.ModelParams`) is run once on every series by the
offline reference (whose detections equal the streaming job's) and judged there
(:func:`zeitgeist.series.judge`). Fold ``i`` then chooses, among the candidates, the one with
the best NAB standard score on every series but the ``i``-th, and reports what that choice
does on the ``i``-th, which took no part in choosing it. The folds' held-out figures, added
up, are the cross-validated figures: what to expect on traffic the parameters never saw.

A candidate's NAB raw score is the objective (NAB's standard profile weighs a missed window
as much as nine false alarms); ties go to fewer false alarms, then to the earlier candidate
(list the defaults first).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

from zeitgeist.model import ModelParams
from zeitgeist.offline import trace
from zeitgeist.series import NabScore, Score, Series, judge

__all__ = [
    "Fold",
    "Judged",
    "changes",
    "choose",
    "cross_validate",
    "grid",
    "judge_params",
]

Judged = tuple[Score, NabScore]
"""One candidate's outcome on one series."""


def judge_params(series: Series, params: ModelParams) -> Judged:
    """``params`` carried to ``series``' bucket length, run on it by the offline reference,
    judged against its windows."""
    if len(series.counts) > 1:
        params = params.for_bucket(series.bucket)
    return judge(series, (d.bucket for d in trace(series, params).detections))


def grid(base: ModelParams, **values: Sequence[Any]) -> list[ModelParams]:
    """``base`` first, then every combination of ``values`` (field name → values) on it,
    without repeats."""
    names = list(values)
    known = {f.name for f in fields(ModelParams)}
    if unknown := set(names) - known:
        raise ValueError(f"ModelParams has no {sorted(unknown)}")
    candidates = [base]
    for combination in itertools.product(*(values[name] for name in names)):
        candidate = replace(base, **dict(zip(names, combination, strict=True)))
        if candidate not in candidates:
            candidates.append(candidate)
    return candidates


def changes(params: ModelParams, base: ModelParams) -> str:
    """The fields in which ``params`` differ from ``base``, as ``name=value`` (or
    ``defaults``)."""
    changed = [
        f"{f.name}={getattr(params, f.name)}"
        for f in fields(ModelParams)
        if getattr(params, f.name) != getattr(base, f.name)
    ]
    return " ".join(changed) or "defaults"


def _total(judged: Iterable[Judged]) -> Judged:
    score, nab = Score(0, 0, 0, 0), NabScore(0.0, 0)
    for one, one_nab in judged:
        score, nab = score + one, nab + one_nab
    return score, nab


def choose(outcomes: Sequence[Mapping[str, Judged]], queries: Iterable[str]) -> tuple[int, Judged]:
    """The index of the best candidate on ``queries`` (``outcomes[i]``: candidate ``i``'s
    outcome per query), and its total there."""
    wanted = list(queries)
    best: tuple[int, Judged] | None = None
    for index, outcome in enumerate(outcomes):
        total = _total(outcome[q] for q in wanted)
        if best is None or (total[1].raw, -total[0].false_alarms) > (
            best[1][1].raw,
            -best[1][0].false_alarms,
        ):
            best = (index, total)
    if best is None:
        raise ValueError("no candidates to choose from")
    return best


@dataclass(frozen=True)
class Fold:
    """One fold: the series held out, the candidate chosen on the others, and its outcome
    on the held-out series (and, for comparison, on the series it was chosen on)."""

    held_out: str
    chosen: int
    params: ModelParams
    held_out_score: Score
    held_out_nab: NabScore
    training_nab: NabScore


def cross_validate(
    series: Sequence[Series],
    candidates: Sequence[ModelParams],
    *,
    judge_all: Callable[[Sequence[Series], Sequence[ModelParams]], list[dict[str, Judged]]]
    | None = None,
) -> list[Fold]:
    """Leave-one-series-out cross-validation of ``candidates`` over ``series``.

    ``judge_all(series, candidates)`` gives each candidate's outcome per query (by default
    one after the other here; pass a parallel one for big grids).
    """
    if len(series) < 2:
        raise ValueError("cross-validation needs at least two series")
    queries = [s.query for s in series]
    if len(set(queries)) != len(queries):
        raise ValueError(f"the series' queries repeat: {queries}")
    outcomes = (judge_all or _judge_all)(series, candidates)
    folds = []
    for held_out in queries:
        index, (_, training_nab) = choose(outcomes, (q for q in queries if q != held_out))
        score, nab = outcomes[index][held_out]
        folds.append(Fold(held_out, index, candidates[index], score, nab, training_nab))
    return folds


def _judge_all(
    series: Sequence[Series], candidates: Sequence[ModelParams]
) -> list[dict[str, Judged]]:
    return [{s.query: judge_params(s, params) for s in series} for params in candidates]
