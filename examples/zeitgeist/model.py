"""The Zeitgeist model and detectors, as pure functions over JSON-able state.

The streaming computations (:mod:`zeitgeist.pipeline`) and the offline reference
(:mod:`zeitgeist.offline`) run exactly this code, so a run on the stack can be checked
against the reference bucket by bucket.

**Model** (per query, paper section 2's "model of expected traffic"): the expected count of
a bucket (5 minutes by default: ``ModelParams.bucket``) is ``level * profile[hour of day]``.
``level`` is an exponentially weighted mean of the deseasonalised counts, ``profile`` a
24-slot daily shape with mean 1. For the first ``warmup`` buckets both are running means
(each profile slot over its own visits), so that a burst on the first day is averaged, not
copied, into the daily shape.

**Score** on the square-root scale: ``(√observed - √expected) / scale``, where ``scale`` is
``dev_weight`` times an exponentially weighted mean of ``|√observed - √expected|`` (never
below ½, the spread of a Poisson count on that scale). The square root stabilises the
variance of counts, so one scale serves a query's quiet nights and busy afternoons. It
compresses bursts (fifty times the usual count scores as seven times would in counts), which
keeps heavy-tailed series within reach of a threshold relative to their own history, and it
stretches the bottom, where dips live (0 searches instead of 4 is -2 on that scale, against
a Poisson spread of ½).

**Learning:** a count is clipped to ``√expected ± clip·scale`` before it is learned, so a
spike or an outage teaches the model little. While recent scores say traffic is well below
expectation (their exponentially weighted mean under ``-freeze``), the level is held, for at
most ``hold`` buckets: a dip keeps being measured against the traffic before it, and a
lasting drop is accepted once ``hold`` has passed.

**Detectors** (one per direction, spike and dip): the evidence of the last ``k`` buckets,
``S_k = Σ scores / √k``, at several ``k`` (``spike_scales``, ``dip_scales``). A steady
model makes each ``S_k`` roughly standard normal, so a spike of a few strong buckets passes
at ``k = 1`` and a two-hour dip of merely low ones adds up at ``k = 24``. Each scale's bar
adapts to the series' own tail: ``threshold * max(1, usual / calm_peak)``, where ``usual`` is
an upper quantile of the scale's daily peaks, ``exp(mean + tail·spread)`` of their logarithm
(exponentially weighted over days, each day's peak capped at ``mean + peak_cap·spread``, so
that an anomaly does not teach the detector that anomalies are usual; it starts from the
peaks of a calm series, ``prior_peak`` and ``prior_spread``). A calm series' daily peaks sit
near 3 and its usual peaks at 3.5 to 6, so its bars are 6 to 10; the tweet series' usual
peaks are 9 to 77 (AAPL), so their bars rise to 15 to 135, where only their largest events
pass (NAB labels only those).
An anomaly is declared when any scale passes its bar; the detector then stays quiet for
``cooldown`` buckets, so one event is one declaration.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

__all__ = [
    "BUCKET_MICROS",
    "DAY_MICROS",
    "Declaration",
    "DetectorState",
    "ModelParams",
    "Prediction",
    "bucket_of",
    "detect",
    "new_model",
    "pot_bar",
    "pot_step",
    "predict",
    "update",
]

BUCKET_MICROS = 300_000_000  # five minutes, the paper's and the benchmark's bucket
DAY_MICROS = 86_400_000_000
_HOUR_MICROS = 3_600_000_000
_SLOTS = 24
_WEEK_SLOTS = 7 * 24
_CLIP_AFTER_MICROS = 3 * _HOUR_MICROS  # learned unclipped at first: there is no scale yet
_LOW_ALPHA = 0.2  # weight of the newest score in the "traffic is low" mean (freeze)
_LOW_CAP = 6.0  # a score counts at most this much in that mean
_MIN_PEAK = 0.5  # daily peaks below this count as this (their logarithm stays finite)


@dataclass(frozen=True, slots=True)
class ModelParams:
    """Everything tunable; the defaults were chosen on the NAB tweet series and generated
    traffic (seeds 7 to 9, checked on others), for 5-minute buckets. Rates and lengths are
    per bucket: :meth:`for_bucket` carries them to another bucket length."""

    level_alpha: float = 0.02  # per bucket: a level half-life of ~3 hours
    profile_alpha: float = 0.05  # per visit of a slot (12 buckets an hour, once a day)
    dev_alpha: float = 0.005  # per bucket: the scale remembers ~17 hours of misses
    dev_weight: float = 1.25  # mean absolute deviation → standard deviation (normal: 1.25)
    clip: float = 2.0  # learn counts at most this many scales from the expectation
    warmup: int = 576  # two days of buckets before any alarm: the profile needs them
    freeze: float = 1.5  # hold the level while the mean recent score is below -freeze
    hold: int = 48  # ... for at most four hours, then accept the new level
    spike_scales: tuple[int, ...] = (1, 3, 6, 12)  # evidence windows for spikes, in buckets
    dip_scales: tuple[int, ...] = (6, 24)  # and for dips (30 minutes, two hours)
    threshold: float = 6.0  # a spike's lowest bar (√-scale scores); all bars scale with it
    dip_threshold: float = 6.0  # a dip's lowest bar
    calm_peak: float = 3.4  # a usual peak r times this makes the bar r times the threshold
    tail: float = 2.0  # usual peak = exp(mean + tail·spread) of the log daily peaks
    peak_alpha: float = 0.15  # per day: the usual peaks remember ~a week
    peak_cap: float = 2.5  # a day's peak is learned at most mean + peak_cap·spread (logs)
    prior_peak: float = 3.0  # the daily peak of a calm series (max of 288 normal scores)
    prior_spread: float = 0.15  # and the spread of its logarithm
    cooldown: int = 288  # buckets of quiet after a declaration: one event, one anomaly
    week_alpha: float = 0.0  # per visit of an hour of the week; 0: no weekly shape
    # The bars: "peaks" (threshold times the usual daily peak, above), or "pot" (peaks over
    # threshold, SPOT's: each scale's evidence tail fitted by a generalised Pareto
    # distribution, the bar its quantile at ``risk`` per bucket, never under ``threshold``).
    bar: str = "peaks"
    risk: float = 1e-4  # pot: how often a bucket of ordinary traffic may pass the bar
    pot_level: float = 0.98  # pot: the tail starts at this quantile of the evidence
    pot_alpha: float = 0.005  # pot: per exceedance, the tail's memory (~200 exceedances)
    bucket: int = BUCKET_MICROS  # the bucket's length, µs

    def __post_init__(self) -> None:
        if self.bar not in ("peaks", "pot"):
            raise ValueError(f"bar is 'peaks' or 'pot', not {self.bar!r}")
        if self.bucket <= 0 or (DAY_MICROS % self.bucket and self.bucket % DAY_MICROS):
            raise ValueError(
                f"a bucket of {self.bucket} µs neither divides a day nor is whole days"
            )

    @property
    def buckets_per_day(self) -> int:
        return max(DAY_MICROS // self.bucket, 1)

    def for_bucket(self, bucket: int) -> ModelParams:
        """The same model for buckets of ``bucket`` µs: per-bucket rates compound to the same
        rate per hour, lengths in buckets (warm-up, hold, cooldown, the detectors' windows)
        keep their duration, at least one bucket each."""
        if bucket == self.bucket:
            return self
        ratio = bucket / self.bucket

        def rate(alpha: float) -> float:
            return 1.0 - math.pow(1.0 - alpha, ratio)

        def length(buckets: int) -> int:
            return max(round(buckets / ratio), 1)

        def windows(scales: tuple[int, ...]) -> tuple[int, ...]:
            return tuple(sorted({length(k) for k in scales}))

        return replace(
            self,
            level_alpha=rate(self.level_alpha),
            profile_alpha=rate(self.profile_alpha),
            dev_alpha=rate(self.dev_alpha),
            warmup=length(self.warmup),
            hold=length(self.hold),
            spike_scales=windows(self.spike_scales),
            dip_scales=windows(self.dip_scales),
            cooldown=length(self.cooldown),
            bucket=bucket,
        )


@dataclass(frozen=True, slots=True)
class Prediction:
    """The model's view of one bucket: what was seen, what was expected, and the score."""

    bucket: int  # bucket start, µs since the epoch
    observed: int
    expected: float
    scale: float  # spread on the square-root scale

    @property
    def score(self) -> float:
        return (math.sqrt(self.observed) - math.sqrt(self.expected)) / self.scale


def bucket_of(timestamp: int, origin: int = 0, bucket: int = BUCKET_MICROS) -> int:
    """The start of the ``bucket``-long bucket holding ``timestamp``; buckets start at
    ``origin`` mod ``bucket``."""
    return (timestamp - origin) // bucket * bucket + origin


def _slot(bucket: int) -> int:
    return (bucket // _HOUR_MICROS) % _SLOTS


def _week_slot(bucket: int) -> int:
    return (bucket // _HOUR_MICROS) % _WEEK_SLOTS


def _week(model: dict[str, Any], bucket: int) -> float:
    week = model.get("week")
    return 1.0 if week is None else float(week[_week_slot(bucket)])


def new_model() -> dict[str, Any]:
    """A model that has seen nothing."""
    return {
        "level": 0.0,
        "profile": [1.0] * _SLOTS,
        "visits": [0] * _SLOTS,  # buckets learned per profile slot
        "dev": 0.0,  # mean |√observed - √expected|
        "low": 0.0,  # weighted mean of recent scores (for freezing the level)
        "held": 0,  # buckets the level has been held
        "seen": 0,
        "last": None,
    }


def predict(model: dict[str, Any], bucket: int, observed: int, params: ModelParams) -> Prediction:
    """The prediction for ``bucket`` before ``observed`` is learned."""
    expected = max(model["level"] * model["profile"][_slot(bucket)] * _week(model, bucket), 0.0)
    scale = max(params.dev_weight * model["dev"], 0.5)
    return Prediction(bucket, observed, expected, scale)


def update(model: dict[str, Any], prediction: Prediction, params: ModelParams) -> None:
    """Learn ``prediction.observed`` into ``model`` (in place)."""
    observed = float(prediction.observed)
    seen = model["seen"]
    slot = _slot(prediction.bucket)
    visits = model["visits"]
    root = math.sqrt(prediction.expected)
    warm = seen < params.warmup
    if warm and seen * params.bucket < _CLIP_AFTER_MICROS:
        learned = observed
    else:
        bound = params.clip * prediction.scale
        learned = min(max(observed, max(root - bound, 0.0) ** 2), (root + bound) ** 2)
    level_alpha, profile_alpha, dev_alpha = (
        params.level_alpha,
        params.profile_alpha,
        params.dev_alpha,
    )
    if warm:
        level_alpha = max(level_alpha, 1.0 / (seen + 1))
        profile_alpha = max(profile_alpha, 1.0 / (visits[slot] + 1))
        dev_alpha = max(dev_alpha, 1.0 / (seen + 1))
    else:
        score = max(min(prediction.score, _LOW_CAP), -_LOW_CAP)
        model["low"] += _LOW_ALPHA * (score - model["low"])
        if model["low"] < -params.freeze:
            if model["held"] < params.hold:
                model["held"] += 1
                level_alpha = 0.0
        else:
            model["held"] = 0
    visits[slot] += 1
    profile = model["profile"]
    week = _week(model, prediction.bucket)
    shape = max(profile[slot] * week, 0.05)
    model["level"] += level_alpha * (learned / shape - model["level"])
    if model["level"] > 0:
        ratio = min(learned / (model["level"] * max(week, 0.05)), 10.0)
        profile[slot] += profile_alpha * (ratio - profile[slot])
        mean = sum(profile) / _SLOTS
        if mean > 0:
            model["profile"] = [p / mean for p in profile]
        if params.week_alpha > 0:
            _learn_week(model, prediction.bucket, learned, params)
    if seen > 0:
        miss = min(abs(math.sqrt(observed) - root), params.clip * prediction.scale)
        model["dev"] += dev_alpha * (miss - model["dev"])
    model["seen"] = seen + 1
    model["last"] = prediction.bucket


def _learn_week(model: dict[str, Any], bucket: int, learned: float, params: ModelParams) -> None:
    """Learn the hour of the week's factor over the daily shape (mean 1 over the week)."""
    week = model.setdefault("week", [1.0] * _WEEK_SLOTS)
    visits = model.setdefault("week_visits", [0] * _WEEK_SLOTS)
    at = _week_slot(bucket)
    daily = max(model["level"] * model["profile"][_slot(bucket)], 1e-9)
    ratio = min(learned / daily, 10.0)
    alpha = max(params.week_alpha, 1.0 / (visits[at] + 1))
    visits[at] += 1
    week[at] += alpha * (ratio - week[at])
    mean = sum(week) / _WEEK_SLOTS
    if mean > 0:
        model["week"] = [w / mean for w in week]


@dataclass(slots=True)
class DetectorState:
    """One direction's detector of one query (spike or dip)."""

    quiet_until: int = -1  # bucket start before which nothing is declared
    last: int | None = None  # last bucket seen
    recent: list[float] = field(default_factory=list)  # latest consecutive scores, signed
    day: int | None = None  # the day (UTC) of the last bucket seen
    peaks: list[float] = field(default_factory=list)  # that day's peak evidence per scale
    usual: list[list[float]] = field(default_factory=list)  # per scale [mean, spread, days]
    # pot: per scale [tail start, evidence spread, mean excess, mean squared excess, excesses]
    tails: list[list[float]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        data = {
            "quiet": self.quiet_until,
            "last": self.last,
            "recent": self.recent,
            "day": self.day,
            "peaks": self.peaks,
            "usual": self.usual,
        }
        if self.tails:
            data["tails"] = self.tails
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> DetectorState:
        if not data:
            return cls()
        return cls(
            data["quiet"],
            data["last"],
            list(data["recent"]),
            data["day"],
            list(data["peaks"]),
            [list(u) for u in data["usual"]],
            [list(t) for t in data.get("tails", [])],
        )


def _learn_peaks(state: DetectorState, params: ModelParams) -> None:
    """Fold the day's peak evidence of each scale into its usual peaks (log scale)."""
    for usual, peak in zip(state.usual, state.peaks, strict=True):
        mean, spread, days = usual
        weight = max(params.peak_alpha, 1.0 / (days + 1))
        capped = min(math.log(max(peak, _MIN_PEAK)), mean + params.peak_cap * spread)
        mean += weight * (capped - mean)
        spread += weight * (abs(capped - mean) - spread)
        usual[:] = [mean, spread, days + 1]


def _bar(usual: Sequence[float], threshold: float, params: ModelParams) -> float:
    peak = math.exp(usual[0] + params.tail * usual[1])
    return threshold * max(1.0, peak / params.calm_peak)


_POT_STEP = 0.05  # the tail start moves by this many spreads per exceedance (x level)
_POT_MIN_EXCESSES = 20  # a tail fitted on fewer excesses is not trusted: the floor bar rules


def pot_bar(tail: Sequence[float], floor: float, params: ModelParams) -> float:
    """The evidence that ordinary traffic passes with probability ``risk`` per bucket: the
    generalised Pareto quantile above the tail start (method of moments), at least ``floor``."""
    start, _, mean, square, excesses = tail
    if excesses < _POT_MIN_EXCESSES or mean <= 0:
        return floor
    variance = square - mean * mean
    if variance <= 0:
        return max(floor, start + mean)
    # A shape under 0 (a bounded tail) is not believed: evidence has no known bound, and a
    # tail cut short by the bar itself would look bounded.
    shape = max(min(0.5 * (1.0 - mean * mean / variance), 0.9), 0.0)
    scale = 0.5 * mean * (mean * mean / variance + 1.0)
    odds = (1.0 - params.pot_level) / params.risk
    if shape < 1e-6:
        quantile = start + scale * math.log(odds)
    else:
        quantile = start + scale / shape * (odds**shape - 1.0)
    return max(floor, quantile)


def pot_step(tail: list[float], evidence: float, floor: float, params: ModelParams) -> float:
    """The bar ``evidence`` faces (:func:`pot_bar`); then ``evidence`` is learned into the
    tail, unless it passed a fitted tail's bar: what does is not ordinary, it teaches
    nothing."""
    bar = pot_bar(tail, floor, params)
    if evidence < bar or tail[4] < _POT_MIN_EXCESSES:
        _learn_tail(tail, evidence, params)
    return bar


def _learn_tail(tail: list[float], evidence: float, params: ModelParams) -> None:
    """One ordinary bucket's evidence into a scale's tail: the tail start tracks the
    ``pot_level`` quantile (a frugal stochastic estimate, in steps of the evidence's spread),
    an exceedance teaches the excess moments."""
    start, spread, mean, square, excesses = tail
    spread += 0.01 * (abs(evidence - start) - spread)
    step = _POT_STEP * max(spread, 1e-3)
    if evidence > start:
        excess = evidence - start
        weight = max(params.pot_alpha, 1.0 / (excesses + 1))
        mean += weight * (excess - mean)
        square += weight * (excess * excess - square)
        excesses += 1
        start += step * params.pot_level
    else:
        start -= step * (1.0 - params.pot_level)
    tail[:] = [start, spread, mean, square, excesses]


@dataclass(frozen=True, slots=True)
class Declaration:
    """Why a detector declared an anomaly: the evidence of its last ``buckets`` buckets
    (``S_k``, on the square-root scale, signed so that more is more anomalous) passed
    ``bar``."""

    kind: str  # "spike" | "dip"
    buckets: int
    evidence: float
    bar: float


def detect(
    state: DetectorState, prediction: Prediction, kind: str, seen: int, params: ModelParams
) -> Declaration | None:
    """Feed one bucket's prediction to a ``kind`` ("spike" or "dip") detector.

    ``seen`` is how many buckets the model had learned before this one (no alarm during
    warm-up). A :class:`Declaration` when this bucket declares an anomaly (the scale whose
    evidence passed its bar by the largest ratio), else ``None``.
    """
    spike = kind == "spike"
    scales = params.spike_scales if spike else params.dip_scales
    threshold = params.threshold if spike else params.dip_threshold
    if not state.usual:
        prior = [math.log(params.prior_peak), params.prior_spread, 1.0]
        state.usual = [list(prior) for _ in scales]
        state.peaks = [0.0] * len(scales)
    pot = params.bar == "pot"
    if pot and not state.tails:
        state.tails = [[0.0, 1.0, 0.0, 0.0, 0] for _ in scales]
    if state.last is not None and prediction.bucket != state.last + params.bucket:
        state.recent = []  # a gap breaks a run of consecutive buckets
    state.last = prediction.bucket
    day = prediction.bucket // DAY_MICROS
    if state.day is not None and day != state.day and seen >= params.buckets_per_day:
        # A new day: learn the last one's peaks (before the model has a day behind it,
        # peaks carry on into the next day instead).
        _learn_peaks(state, params)
        state.peaks = [0.0] * len(scales)
    state.day = day
    score = prediction.score if spike else -prediction.score
    state.recent = [*state.recent, score][-max(scales) :]
    passed: Declaration | None = None
    for i, k in enumerate(scales):
        evidence = sum(state.recent[-k:]) / math.sqrt(k)
        state.peaks[i] = max(state.peaks[i], evidence)
        if pot:
            bar = pot_step(state.tails[i], evidence, threshold, params)
        else:
            bar = _bar(state.usual[i], threshold, params)
        if evidence >= bar and (passed is None or evidence / bar > passed.evidence / passed.bar):
            passed = Declaration(kind, k, evidence, bar)
    if passed is None or seen < params.warmup or prediction.bucket < state.quiet_until:
        return None
    state.quiet_until = prediction.bucket + params.cooldown * params.bucket
    return passed
