"""The reference: the pipeline's model and detectors run over bucket counts in one process.

It does per query what the streaming computations do (:mod:`zeitgeist.pipeline`): buckets
in order, a bucket with no events counts 0 for the model and the dip detector and is not
seen by the spike detector. Tests check runs on the stack against it; tuning uses it.
"""

from __future__ import annotations

from collections.abc import Iterable

from zeitgeist.model import (
    DetectorState,
    ModelParams,
    Prediction,
    detect,
    new_model,
    predict,
    update,
)
from zeitgeist.series import Detection, Series

__all__ = ["Traced", "reference_detections", "trace"]


class Traced:
    """A query's predictions (every bucket, silent ones included) and its detections."""

    def __init__(self) -> None:
        self.predictions: list[Prediction] = []
        self.detections: list[Detection] = []


def trace(series: Series, params: ModelParams) -> Traced:
    """Run one query's buckets through the model and both detectors."""
    traced = Traced()
    if not series.counts:
        return traced
    model = new_model()
    spike, dip = DetectorState(), DetectorState()
    bucket = series.start
    end = series.end
    while bucket <= end:
        observed = series.counts.get(bucket, 0)
        seen = model["seen"]
        prediction = predict(model, bucket, observed, params)
        update(model, prediction, params)
        traced.predictions.append(prediction)
        # An empty bucket reaches no spike detector.
        if observed > 0 and detect(spike, prediction, "spike", seen, params):
            traced.detections.append(Detection(series.query, "spike", bucket))
        if detect(dip, prediction, "dip", seen, params):
            traced.detections.append(Detection(series.query, "dip", bucket))
        bucket += params.bucket
    return traced


def reference_detections(series: Iterable[Series], params: ModelParams) -> list[Detection]:
    return [d for s in series for d in trace(s, params).detections]
