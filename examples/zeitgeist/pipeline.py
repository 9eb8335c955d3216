"""Zeitgeist's computations and topology (paper section 2, figures 1 and 2).

::

    searches ─▶ window_counter ─▶ counts ─▶ model ─▶ predictions ─┬▶ spike_detector ─┐
     (query)    (event-time buckets,          (per-query model,  └▶ dip_detector  ──┴▶ anomalies
                 low-watermark timers)         daily seasonality)   (watermark timers)

* **window_counter** counts each query's searches per bucket (5 minutes by default) and
  emits a bucket's count once the low watermark says the bucket is complete (an event-time
  timer at its last microsecond). A bucket without searches emits nothing.
* **model** keeps the query's model of expected traffic (:mod:`zeitgeist.model`) and emits,
  per counted bucket, the prediction made before learning it, plus the model itself. Buckets
  that emitted nothing count as 0.
* **spike_detector** has no timers: it decides on each prediction as it comes.
* **dip_detector** must notice buckets that never come (an outage emits nothing), so it
  waits on the low watermark: once the watermark passes a bucket no prediction arrived for,
  that bucket was empty, and it scores it as 0 with the model it last received.

Every record is JSON; anomalies carry the query, the kind, the bucket's window, observed and
expected counts, the score, the evidence that declared it and a one-line explanation
(:func:`anomaly_value`), and ``run``, the name of the run that found them.
:func:`add_anomaly_detection` puts the four computations on any topology's stream.
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from millstream.engine import (
    MAX_EVENT_TIME,
    Computation,
    ComputationOptions,
    Context,
    JsonCodec,
    Record,
    Timer,
    Topology,
)
from zeitgeist.model import (
    BUCKET_MICROS,
    DAY_MICROS,
    Declaration,
    DetectorState,
    ModelParams,
    Prediction,
    bucket_of,
    detect,
    new_model,
    predict,
    update,
)
from zeitgeist.series import format_time

__all__ = [
    "AnomalyDetection",
    "DipDetector",
    "ModelCalculator",
    "Names",
    "OpenBuckets",
    "OpenBucketsCodec",
    "SpikeDetector",
    "WindowCounter",
    "add_anomaly_detection",
    "anomaly_value",
    "explain",
    "zeitgeist_topology",
]

JSON = JsonCodec()
# A gap longer than this (a week) is not replayed into the model bucket by bucket.
_MAX_GAP_MICROS = 7 * DAY_MICROS


def _max_gap(params: ModelParams) -> int:
    return max(_MAX_GAP_MICROS // params.bucket, 1)


def _empty_buckets(first: int, before: int, params: ModelParams) -> range:
    """The buckets from ``first`` up to ``before`` that the model learns as empty: the last
    week of them. The model and the dip detector both replay a gap with this, so the dip
    detector's copy of the model stays the model's."""
    return range(first, before, params.bucket)[-_max_gap(params) :]


@dataclass(frozen=True, slots=True)
class Names:
    """The stream and computation names of one run of the job."""

    run: str
    anomalies: str = "anomalies"

    @property
    def topology(self) -> str:
        return f"zeitgeist_{self.run}"

    def stream(self, name: str) -> str:
        return f"zeitgeist_{self.run}.{name}"

    @property
    def searches(self) -> str:
        return self.stream("searches")

    @property
    def counts(self) -> str:
        return self.stream("counts")

    @property
    def predictions(self) -> str:
        return self.stream("predictions")

    def computation(self, name: str) -> str:
        return f"zeitgeist_{self.run}_{name}"


class OpenBuckets:
    """A key's counts of the buckets not emitted yet: dense, from bucket ``base`` on, each
    ``size`` µs long (the codec stores no size: the computation knows it).

    Dense and binary on purpose: the state is decoded and encoded on every record, and a
    backlog read in one batch can hold weeks of buckets open at once; a JSON map of them
    would make each record cost as much as the whole map.
    """

    __slots__ = ("base", "counts", "size")

    def __init__(
        self, base: int, counts: array[int] | None = None, size: int = BUCKET_MICROS
    ) -> None:
        self.base = base
        self.counts = counts if counts is not None else array("Q")
        self.size = size

    def add(self, bucket: int) -> None:
        index = (bucket - self.base) // self.size
        if index < 0:  # a late record, before every open bucket: grow to the front
            self.counts[0:0] = array("Q", bytes(8 * -index))
            self.base, index = bucket, 0
        if index >= len(self.counts):
            self.counts.extend(array("Q", bytes(8 * (index - len(self.counts) + 1))))
        self.counts[index] += 1

    def take(self, bucket: int) -> int:
        """The count of ``bucket``, forgetting it and every bucket before it."""
        index = (bucket - self.base) // self.size
        if index < 0 or index >= len(self.counts):
            return 0
        count = self.counts[index]
        del self.counts[: index + 1]
        self.base = bucket + self.size
        return count

    def first(self) -> int | None:
        """The earliest bucket with a count (``None``: none open)."""
        index = next((i for i, count in enumerate(self.counts) if count), None)
        return None if index is None else self.base + index * self.size


class OpenBucketsCodec:
    """:class:`OpenBuckets` of ``size``-µs buckets as 8 bytes of ``base`` then 8 bytes per
    count (little-endian)."""

    def __init__(self, size: int = BUCKET_MICROS) -> None:
        self.size = size

    def encode(self, value: OpenBuckets, /) -> bytes:
        return value.base.to_bytes(8, "little", signed=True) + value.counts.tobytes()

    def decode(self, data: bytes, /) -> OpenBuckets:
        counts = array("Q")
        counts.frombytes(data[8:])
        return OpenBuckets(int.from_bytes(data[:8], "little", signed=True), counts, self.size)


# A record further than this from a key's open buckets is refused (a dead letter), so a wild
# timestamp cannot make the dense state huge: 90 days of 5-minute buckets are 207 KiB.
MAX_OPEN_MICROS = 90 * DAY_MICROS
# The tag of a key's one WindowCounter timer.
_CLOSE = "close"


class WindowCounter(Computation):
    """Counts a query's searches per bucket; emits each bucket once it is complete.

    One timer a key, at the end of its earliest open bucket, moved on to the next one as it
    fires (a timer set already due fires in the same batch): a timer tagged by its bucket
    would leave a tombstone per bucket in the store, which every read of the key passes over
    for ``gc_grace_seconds`` (see the state concept page)."""

    def __init__(self, output: str, origin: int = 0, bucket: int = BUCKET_MICROS) -> None:
        self.output = output
        self.origin = origin  # buckets start at origin mod ``bucket``
        self.bucket = bucket
        self.codec = OpenBucketsCodec(bucket)

    def process_record(self, ctx: Context, record: Record) -> None:
        size = self.bucket
        bucket = bucket_of(record.timestamp, self.origin, size)
        state = ctx.state(self.codec)
        open_buckets = state.get(None) or OpenBuckets(bucket, size=size)
        span = max(bucket + size, open_buckets.base + len(open_buckets.counts) * size) - min(
            bucket, open_buckets.base
        )
        if span > MAX_OPEN_MICROS:
            raise ValueError(
                f"event time {format_time(record.timestamp)} is more than "
                f"{MAX_OPEN_MICROS // DAY_MICROS} days away from the open buckets "
                f"(from {format_time(open_buckets.base)})"
            )
        open_buckets.add(bucket)
        state.set(open_buckets)
        self._close_at_first(ctx, open_buckets)

    def process_timer(self, ctx: Context, timer: Timer) -> None:
        state = ctx.state(self.codec)
        open_buckets = state.get(None)
        if open_buckets is None:
            return
        # The bucket the timer ends (earlier versions tagged a timer a bucket: the same).
        bucket = timer.timestamp - self.bucket + 1
        count = open_buckets.take(bucket)
        if open_buckets.counts:  # its last entry always counts something
            state.set(open_buckets)
            self._close_at_first(ctx, open_buckets)
        else:
            state.clear()
        if count:
            value = {"bucket": bucket, "count": count}
            ctx.produce(self.output, json.dumps(value).encode(), timer.timestamp)

    def _close_at_first(self, ctx: Context, open_buckets: OpenBuckets) -> None:
        first = open_buckets.first()
        if first is not None:
            ctx.set_timer(_CLOSE, first + self.bucket - 1)


class ModelCalculator(Computation):
    """Keeps a query's model; emits each counted bucket's prediction and the model."""

    def __init__(self, output: str, params: ModelParams) -> None:
        self.output = output
        self.params = params

    def process_record(self, ctx: Context, record: Record) -> None:
        counted = json.loads(record.value)
        bucket, count = int(counted["bucket"]), int(counted["count"])
        state = ctx.state(JSON)
        model: dict[str, Any] = state.get({}) or new_model()
        last = model["last"]
        if last is not None:
            if bucket <= last:
                return  # a late recount of a bucket already learned
            for empty in _empty_buckets(last + self.params.bucket, bucket, self.params):
                update(model, predict(model, empty, 0, self.params), self.params)
        seen = model["seen"]
        prediction = predict(model, bucket, count, self.params)
        update(model, prediction, self.params)
        state.set(model)
        value = {
            "bucket": bucket,
            "observed": count,
            "expected": prediction.expected,
            "scale": prediction.scale,
            "seen": seen,
            "model": model,
        }
        ctx.produce(self.output, json.dumps(value).encode(), record.timestamp)


def _duration(micros: int) -> str:
    minutes = micros // 60_000_000
    if minutes % 1440 == 0:
        days = minutes // 1440
        return f"{days} day{'s' if days > 1 else ''}"
    if minutes % 60 == 0:
        hours = minutes // 60
        return f"{hours} hour{'s' if hours > 1 else ''}"
    return f"{minutes} minute{'s' if minutes > 1 else ''}"


def explain(query: str, prediction: Prediction, declaration: Declaration, bucket: int) -> str:
    """One line a reader understands: what was seen against what was expected, and why."""
    when = f"in the {_duration(bucket)} from {format_time(prediction.bucket)} UTC"
    seen = f"{query}: {prediction.observed:,} {when}"
    expected = prediction.expected
    if prediction.observed >= expected and expected > 0:
        against = f"{prediction.observed / expected:.1f} times the {expected:,.0f} expected"
    else:
        against = f"against {expected:,.0f} expected"
    span = _duration(declaration.buckets * bucket)
    direction = "above" if declaration.kind == "spike" else "below"
    why = (
        f"{declaration.kind}: traffic {direction} expectation over the last {span} "
        f"(evidence {declaration.evidence:.1f}, bar {declaration.bar:.1f})"
    )
    return f"{seen}, {against}; {why}"


def anomaly_value(
    run: str,
    query: str,
    prediction: Prediction,
    declaration: Declaration,
    bucket: int = BUCKET_MICROS,
) -> bytes:
    """An anomaly record: the query, the kind, the bucket's window (start inclusive, end
    exclusive, µs and UTC text), observed and expected counts, the bucket's score, the
    evidence that declared it, and a one-line explanation. ``bucket``: the bucket length."""
    end = prediction.bucket + bucket
    return json.dumps(
        {
            "run": run,
            "query": query,
            "kind": declaration.kind,
            "bucket": prediction.bucket,
            "bucket_end": end,
            "bucket_time": format_time(prediction.bucket),
            "bucket_end_time": format_time(end),
            "observed": prediction.observed,
            "expected": round(prediction.expected, 2),
            "score": round(prediction.score, 2),
            "evidence": {
                "buckets": declaration.buckets,
                "value": round(declaration.evidence, 2),
                "bar": round(declaration.bar, 2),
            },
            "explanation": explain(query, prediction, declaration, bucket),
        }
    ).encode()


def _prediction(value: dict[str, Any]) -> Prediction:
    return Prediction(
        int(value["bucket"]), int(value["observed"]), float(value["expected"]), value["scale"]
    )


class _Detector(Computation):
    """What both detectors share: where anomalies go, the params, the run that names them."""

    def __init__(self, output: str, params: ModelParams, run: str) -> None:
        self.output = output
        self.params = params
        self.run = run

    def _judge(
        self,
        ctx: Context,
        detector: DetectorState,
        prediction: Prediction,
        kind: str,
        seen: int,
        timestamp: int,
    ) -> None:
        """Feed ``prediction`` to ``detector``; produce the anomaly it declares, if any."""
        declared = detect(detector, prediction, kind, seen, self.params)
        if declared:
            anomaly = anomaly_value(self.run, ctx.key, prediction, declared, self.params.bucket)
            ctx.produce(self.output, anomaly, timestamp)


class SpikeDetector(_Detector):
    """Declares spikes from predictions as they come (no timers)."""

    def process_record(self, ctx: Context, record: Record) -> None:
        value = json.loads(record.value)
        prediction = _prediction(value)
        state = ctx.state(JSON)
        detector = DetectorState.from_json(state.get({}))
        if detector.last is not None and prediction.bucket <= detector.last:
            return  # a repeat of a bucket already judged
        self._judge(ctx, detector, prediction, "spike", int(value["seen"]), record.timestamp)
        state.set(detector.to_json())


class DipDetector(_Detector):
    """Declares dips, judging a bucket only once the low watermark says it is complete.

    Buckets that had predictions are judged as they arrive (a prediction is only made for a
    complete bucket). A bucket with no searches makes no prediction; the watermark timer
    ``silence``, set at the end of the next expected bucket, finds those: when it fires and
    the bucket's prediction has not come, the bucket was empty, and it is judged as 0 against
    the model the last prediction carried. Once the input ended (the watermark reached the end
    of time), silence is the end of the data, not an outage.
    """

    def process_record(self, ctx: Context, record: Record) -> None:
        value = json.loads(record.value)
        prediction = _prediction(value)
        state = ctx.state(JSON)
        current: dict[str, Any] = state.get({})
        upcoming = current.get("next")
        if upcoming is not None and prediction.bucket < upcoming:
            return  # judged already (a repeat)
        detector = DetectorState.from_json(current.get("detector"))
        model = current.get("model")
        if upcoming is not None and model is not None:
            # Buckets between the last judged one and this one were empty.
            for empty in _empty_buckets(upcoming, prediction.bucket, self.params):
                self._judge_empty(ctx, detector, model, empty, record.timestamp)
        self._judge(ctx, detector, prediction, "dip", int(value["seen"]), record.timestamp)
        following = prediction.bucket + self.params.bucket
        state.set({"detector": detector.to_json(), "model": value["model"], "next": following})
        ctx.set_timer("silence", following + self.params.bucket - 1)

    def process_timer(self, ctx: Context, timer: Timer) -> None:
        watermark = ctx.input_low_watermark
        if watermark >= MAX_EVENT_TIME:
            return  # the input ended: the rest is not an outage
        state = ctx.state(JSON)
        current: dict[str, Any] = state.get({})
        upcoming, model = current.get("next"), current.get("model")
        if upcoming is None or model is None:
            return
        detector = DetectorState.from_json(current.get("detector"))
        size, most = self.params.bucket, _max_gap(self.params)
        judged = 0
        while upcoming + size - 1 < watermark and judged < most:
            self._judge_empty(ctx, detector, model, upcoming, upcoming + size - 1)
            upcoming += size
            judged += 1
        state.set({"detector": detector.to_json(), "model": model, "next": upcoming})
        if judged < most:
            ctx.set_timer("silence", upcoming + size - 1)

    def _judge_empty(
        self,
        ctx: Context,
        detector: DetectorState,
        model: dict[str, Any],
        bucket: int,
        timestamp: int,
    ) -> None:
        seen = model["seen"]
        prediction = predict(model, bucket, 0, self.params)
        update(model, prediction, self.params)
        self._judge(ctx, detector, prediction, "dip", seen, timestamp)


@dataclass(frozen=True, slots=True)
class AnomalyDetection:
    """What :func:`add_anomaly_detection` added: its streams and computations, by name."""

    events: str
    counts: str
    predictions: str
    anomalies: str
    computations: tuple[str, ...]


def add_anomaly_detection(
    topology: Topology,
    events: str,
    *,
    name: str,
    anomalies: str = "anomalies",
    key: Callable[[Record], str] | None = None,
    params: ModelParams | None = None,
    origin: int = 0,
    run: str | None = None,
    key_intervals: int = 2,
) -> AnomalyDetection:
    """Add Zeitgeist's counter, model and detectors to ``topology``, counting ``events``.

    Each record of the stream ``events`` counts once for its key (a search query, an endpoint,
    a customer: whatever is counted; ``key`` extracts another key from the record), in the
    bucket of its event time (``params.bucket`` long, starting at ``origin`` mod its length).
    Spikes and dips of each key's counts against its model go to the stream ``anomalies`` as
    JSON (:func:`anomaly_value`: the bucket's window, observed and expected, score, evidence
    and a one-line explanation), their ``run`` field ``run`` (default ``name``). ``name``
    prefixes the four computations (``<name>_window_counter``, ``_model``,
    ``_spike_detector``, ``_dip_detector``) and the two streams between them
    (``<name>.counts``, ``<name>.predictions``). ``events`` is declared by the caller (an
    injector's stream, or another computation's output).
    """
    params = params or ModelParams()
    run = name if run is None else run
    options = ComputationOptions(key_intervals=key_intervals)
    counts, predictions = f"{name}.counts", f"{name}.predictions"
    computations = tuple(
        f"{name}_{part}" for part in ("window_counter", "model", "spike_detector", "dip_detector")
    )
    counter, model, spike, dip = computations
    topology.add_computation(
        counter,
        WindowCounter(counts, origin, params.bucket),
        inputs={events: key},
        outputs=[counts],
        options=options,
    )
    topology.add_computation(
        model,
        ModelCalculator(predictions, params),
        inputs=[counts],
        outputs=[predictions],
        options=options,
    )
    for computation, detector in (
        (spike, SpikeDetector(anomalies, params, run)),
        (dip, DipDetector(anomalies, params, run)),
    ):
        topology.add_computation(
            computation,
            detector,
            inputs=[predictions],
            outputs=[anomalies],
            options=options,
        )
    return AnomalyDetection(events, counts, predictions, anomalies, computations)


def zeitgeist_topology(
    names: Names,
    params: ModelParams | None = None,
    *,
    origin: int = 0,
    key_intervals: int = 2,
) -> Topology:
    """The job for one run: ``names`` says its streams, ``origin`` where buckets start (mod
    ``params.bucket``)."""
    topology = Topology(names.topology, streams=[names.searches])
    add_anomaly_detection(
        topology,
        names.searches,
        name=names.topology,
        anomalies=names.anomalies,
        params=params,
        origin=origin,
        run=names.run,
        key_intervals=key_intervals,
    )
    return topology
