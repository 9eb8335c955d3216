"""Generated search traffic with exact ground truth: daily seasonality, noise, spikes, dips
and one query's full outage.

Deterministic for a seed. Each query gets a base rate, a daily shape (a peak in its local
afternoon, a trough at night) and over-dispersed noise (a Poisson count whose mean is
itself jittered, like real traffic). After a clean first ``warmup_days``, anomalies are
placed at least a day and a half apart per query: spikes (3-6x for 20-60 minutes), dips
(traffic falls to 10-30% for 1-3 hours) and, for one query, an outage (no searches at all
for 3 hours). The truth window of an anomaly runs from its start to one hour after its end:
a detection is due while it lasts, and a detector may need a bucket or two to confirm.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from zeitgeist.model import BUCKET_MICROS
from zeitgeist.series import Series, parse_time

__all__ = ["Anomaly", "GeneratedTraffic", "generate"]

_DAY_BUCKETS = 288
_HOUR = 3_600_000_000


@dataclass(frozen=True, slots=True)
class Anomaly:
    query: str
    kind: str  # "spike" | "dip" (an outage is a dip of the whole traffic)
    start: int  # µs, a bucket start
    end: int  # µs, exclusive
    outage: bool = False

    @property
    def window(self) -> tuple[int, int]:
        return self.start, self.end + _HOUR


@dataclass(frozen=True, slots=True)
class GeneratedTraffic:
    series: list[Series]
    anomalies: list[Anomaly]

    def windows(self, kind: str) -> dict[str, list[tuple[int, int]]]:
        """Per query, the truth windows of ``kind`` anomalies."""
        found: dict[str, list[tuple[int, int]]] = {s.query: [] for s in self.series}
        for anomaly in self.anomalies:
            if anomaly.kind == kind:
                found[anomaly.query].append(anomaly.window)
        return found


def generate(
    seed: int = 7,
    queries: int = 5,
    days: int = 10,
    start: str = "2026-03-02 00:00:00",
    warmup_days: int = 2,
) -> GeneratedTraffic:
    """``queries`` queries over ``days`` days of 5-minute buckets from ``start`` (UTC)."""
    rng = random.Random(seed)
    origin = parse_time(start)
    buckets = days * _DAY_BUCKETS
    names = [f"query-{i:02d}" for i in range(queries)]
    outage_query = rng.randrange(queries)
    series: list[Series] = []
    anomalies: list[Anomaly] = []
    for index, name in enumerate(names):
        base = math.exp(rng.uniform(math.log(8), math.log(120)))
        peak_hour = rng.uniform(12, 20)
        depth = rng.uniform(0.5, 0.85)  # night traffic is (1 - depth) of the peak's
        planned = _plan(rng, name, origin, buckets, warmup_days, outage=index == outage_query)
        anomalies.extend(planned)
        counts: dict[int, int] = {}
        for b in range(buckets):
            bucket = origin + b * BUCKET_MICROS
            hour = (b % _DAY_BUCKETS) / 12
            shape = 1 - depth * (0.5 - 0.5 * math.cos(2 * math.pi * (hour - peak_hour) / 24))
            mean = base * shape * rng.gammavariate(20, 1 / 20)  # ±22% jitter
            for anomaly in planned:
                if anomaly.start <= bucket < anomaly.end:
                    mean *= _factor(rng, anomaly)
            count = _poisson(rng, mean)
            if count:
                counts[bucket] = count
        series.append(Series(name, counts, [a.window for a in planned]))
    return GeneratedTraffic(series, anomalies)


def _plan(
    rng: random.Random, query: str, origin: int, buckets: int, warmup_days: int, outage: bool
) -> list[Anomaly]:
    kinds = ["outage" if outage else "dip", "spike", "dip", "spike"]
    rng.shuffle(kinds)
    planned: list[Anomaly] = []
    at = warmup_days * _DAY_BUCKETS + rng.randrange(_DAY_BUCKETS // 2)
    for kind in kinds:
        length = {
            "spike": rng.randrange(4, 13),
            "dip": rng.randrange(12, 37),
            "outage": 36,
        }[kind]
        if at + length + _DAY_BUCKETS // 4 >= buckets:
            break
        start = origin + at * BUCKET_MICROS
        planned.append(
            Anomaly(
                query,
                "spike" if kind == "spike" else "dip",
                start,
                start + length * BUCKET_MICROS,
                outage=kind == "outage",
            )
        )
        at += length + _DAY_BUCKETS * 3 // 2 + rng.randrange(_DAY_BUCKETS // 2)
    return planned


def _factor(rng: random.Random, anomaly: Anomaly) -> float:
    if anomaly.outage:
        return 0.0
    if anomaly.kind == "spike":
        return rng.uniform(3.0, 6.0)
    return rng.uniform(0.1, 0.3)


def _poisson(rng: random.Random, mean: float) -> int:
    """A Poisson draw (Knuth for small means, a rounded normal for large ones)."""
    if mean <= 0:
        return 0
    if mean > 60:
        return max(0, round(rng.gauss(mean, math.sqrt(mean))))
    limit, k, p = math.exp(-mean), 0, 1.0
    while True:
        p *= rng.random()
        if p <= limit:
            return k
        k += 1
