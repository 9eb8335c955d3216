"""The Zeitgeist model and detectors, as pure functions over JSON-able state.

The streaming computations (:mod:`zeitgeist.pipeline`) and the offline reference
(:mod:`zeitgeist.offline`) run exactly this code, so a run on the stack can be checked
against the reference bucket by bucket.

**Model** (per query, paper section 2's "model of expected traffic"): the expected count of
a 5-minute bucket is ``level x profile[hour of day]``. ``level`` is an exponentially weighted
mean of the deseasonalised counts, ``profile`` a 24-slot daily shape with mean 1, and
``dev`` a weighted mean absolute deviation. Counts feed the model clipped to ``expected ±
clip·scale``, so a spike or an outage does not teach the model that it is normal.

**Score:** ``(observed - expected) / scale`` with ``scale = max(dev_weight·dev,
sqrt(expected), 1)``: the deviation of the series itself, never below Poisson noise, so a
query with a handful of searches per bucket does not alarm on every wobble.

**Detectors:** a spike (dip) is declared when ``confirm`` consecutive buckets score above
``threshold`` (below ``-dip_threshold``); the episode lasts while the score stays beyond half
the threshold, and a declared query stays quiet for ``cooldown`` buckets after its episode.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

__all__ = [
    "BUCKET_MICROS",
    "DetectorState",
    "ModelParams",
    "Prediction",
    "bucket_of",
    "detect",
    "new_detector",
    "new_model",
    "predict",
    "update",
]

BUCKET_MICROS = 300_000_000  # five minutes, the paper's and the benchmark's bucket
_HOUR_MICROS = 3_600_000_000
_SLOTS = 24


@dataclass(frozen=True, slots=True)
class ModelParams:
    """Everything tunable; the defaults were chosen on the NAB tweet series (README)."""

    level_alpha: float = 0.02  # per bucket: a level half-life of ~3 hours
    profile_alpha: float = 0.05  # per visit of a slot (12 buckets an hour, once a day)
    dev_alpha: float = 0.005
    dev_weight: float = 1.25
    clip: float = 4.0
    warmup: int = 288  # one day of buckets before any alarm
    threshold: float = 15.0
    dip_threshold: float = 5.0
    confirm: int = 2
    instant: float = 60.0  # a single bucket this far out is declared without confirmation
    cooldown: int = 288

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Prediction:
    """The model's view of one bucket: what was seen, what was expected, and the score."""

    bucket: int  # bucket start, µs since the epoch
    observed: int
    expected: float
    scale: float

    @property
    def score(self) -> float:
        return (self.observed - self.expected) / self.scale


def bucket_of(timestamp: int, origin: int = 0) -> int:
    """The start of the bucket holding ``timestamp``; buckets start at ``origin`` mod 5 min."""
    return (timestamp - origin) // BUCKET_MICROS * BUCKET_MICROS + origin


def _slot(bucket: int) -> int:
    return (bucket // _HOUR_MICROS) % _SLOTS


def new_model() -> dict[str, Any]:
    """A model that has seen nothing."""
    return {"level": 0.0, "profile": [1.0] * _SLOTS, "dev": 0.0, "seen": 0, "last": None}


def predict(model: dict[str, Any], bucket: int, observed: int, params: ModelParams) -> Prediction:
    """The prediction for ``bucket`` before ``observed`` is learned."""
    expected = model["level"] * model["profile"][_slot(bucket)]
    scale = max(params.dev_weight * model["dev"], math.sqrt(expected), 1.0)
    return Prediction(bucket, observed, expected, scale)


def update(model: dict[str, Any], prediction: Prediction, params: ModelParams) -> None:
    """Learn ``prediction.observed`` into ``model`` (in place)."""
    observed = float(prediction.observed)
    seen = model["seen"]
    if seen < params.warmup:
        # Warm-up: a running mean for the level, the profile learns fast.
        learned = observed
        level_alpha = 1.0 / (seen + 1)
        profile_alpha = max(params.profile_alpha, 0.5)
    else:
        bound = params.clip * prediction.scale
        learned = min(max(observed, prediction.expected - bound), prediction.expected + bound)
        level_alpha = params.level_alpha
        profile_alpha = params.profile_alpha
    slot = _slot(prediction.bucket)
    profile = model["profile"]
    model["level"] += level_alpha * (learned / max(profile[slot], 0.05) - model["level"])
    if model["level"] > 0:
        ratio = min(learned / model["level"], 10.0)
        profile[slot] += profile_alpha * (ratio - profile[slot])
        mean = sum(profile) / _SLOTS
        if mean > 0:
            model["profile"] = [p / mean for p in profile]
    if seen > 0:
        miss = min(abs(observed - prediction.expected), params.clip * prediction.scale)
        dev_alpha = (
            max(params.dev_alpha, 1.0 / (seen + 1)) if seen < params.warmup else (params.dev_alpha)
        )
        model["dev"] += dev_alpha * (miss - model["dev"])
    model["seen"] = seen + 1
    model["last"] = prediction.bucket


@dataclass(slots=True)
class DetectorState:
    """One direction's detector of one query (spike or dip)."""

    run: int = 0  # consecutive buckets beyond the threshold
    active: bool = False  # inside a declared episode
    quiet_until: int = -1  # bucket start before which nothing is declared
    last: int | None = None  # last bucket seen

    def to_json(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "active": self.active,
            "quiet": self.quiet_until,
            "last": self.last,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> DetectorState:
        if not data:
            return cls()
        return cls(data["run"], data["active"], data["quiet"], data["last"])


def new_detector() -> DetectorState:
    return DetectorState()


def detect(
    state: DetectorState, prediction: Prediction, kind: str, seen: int, params: ModelParams
) -> bool:
    """Feed one bucket's prediction to a ``kind`` ("spike" or "dip") detector.

    ``seen`` is how many buckets the model had learned before this one (no alarm during
    warm-up). True when this bucket declares an anomaly.
    """
    if state.last is not None and prediction.bucket != state.last + BUCKET_MICROS:
        state.run = 0  # a gap breaks a run of consecutive buckets
    state.last = prediction.bucket
    sign = 1.0 if kind == "spike" else -1.0
    threshold = params.threshold if kind == "spike" else params.dip_threshold
    score = sign * prediction.score
    if state.active:
        if score >= threshold / 2:
            return False
        state.active = False
        state.quiet_until = prediction.bucket + params.cooldown * BUCKET_MICROS
    if score < threshold or seen < params.warmup:
        state.run = 0
        return False
    state.run += 1
    confirmed = state.run >= params.confirm or score >= params.instant
    if not confirmed or prediction.bucket < state.quiet_until:
        return False
    state.active = True
    state.run = 0
    return True
