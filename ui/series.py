"""The live view's series charts: one key of an anomaly detector's predictions stream (the
counts it saw and expected, bucket by bucket) with its expected band, and the anomalies
declared on that key marked.

The predictions stream is the one ``add_anomaly_detection`` (the main job's detector) adds:
JSON values with ``bucket`` (its start, µs), ``observed``, ``expected`` and ``scale`` (the
spread on the square-root scale). The band is ``expected`` ± :data:`BAND_SPREADS` spreads on
that scale. Anomalies are the JSON values of the anomalies stream keyed by the same key; one
that names its ``run`` is shown only on the predictions stream whose name contains the run.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from millstream.engine.config import MillstreamConfig
from millstream.ui.records import MAX_BUDGET, MAX_LIMIT, ReaderPool, Scan, StreamScan, scan_stream

__all__ = ["BAND_SPREADS", "MAX_POINTS", "read_series", "series_of"]

BAND_SPREADS = 3.0
MAX_POINTS = 2_000


def series_of(
    stream: str,
    key: str | None,
    predictions: Iterable[Mapping[str, Any]],
    anomalies: Iterable[Mapping[str, Any]],
    points: int = 500,
) -> dict[str, Any]:
    """The chart of ``key`` from decoded records (as the record browser returns them): its
    newest ``points`` buckets as ``[bucket, observed, expected, low, high]``, oldest first,
    and the anomalies within their span; ``keys``, every key the predictions had (with
    ``key`` ``None``, only those: a page asks for them first)."""
    keys: set[str] = set()
    rows: dict[int, list[float]] = {}
    for record in predictions:
        keys.add(str(record.get("key")))
        value = record.get("value")
        if key is None or record.get("key") != key or not isinstance(value, Mapping):
            continue
        try:
            bucket = int(value["bucket"])
            observed, expected = float(value["observed"]), float(value["expected"])
            spread = float(value.get("scale", 0.0)) * BAND_SPREADS
        except (KeyError, TypeError, ValueError):
            continue  # not a prediction: the chart shows what it can
        root = math.sqrt(max(expected, 0.0))
        low, high = max(0.0, root - spread) ** 2, (root + spread) ** 2
        rows[bucket] = [bucket, observed, round(expected, 3), round(low, 3), round(high, 3)]
        if len(rows) > 2 * points:  # bounded whatever the scan holds
            for old in sorted(rows)[: len(rows) - points]:
                del rows[old]
    chart = [rows[b] for b in sorted(rows)][-points:]
    start = chart[0][0] if chart else None
    marks: list[dict[str, Any]] = []
    for record in anomalies:
        value = record.get("value")
        if record.get("key") != key or not isinstance(value, Mapping) or "bucket" not in value:
            continue
        run = value.get("run")
        if run is not None and str(run) not in stream:
            continue  # another run's anomaly on the same key
        bucket = int(value["bucket"])
        if start is None or bucket < start:
            continue
        marks.append(
            {
                "bucket": bucket,
                "kind": str(value.get("kind", "")),
                "observed": value.get("observed"),
                "expected": value.get("expected"),
                "score": value.get("score"),
                "explanation": str(value.get("explanation", "")),
            }
        )
    marks.sort(key=lambda m: m["bucket"])
    return {
        "stream": stream,
        "key": key,
        "points": chart,
        "anomalies": marks,
        "keys": sorted(keys),
        "band_spreads": BAND_SPREADS,
    }


def read_series(
    config: MillstreamConfig,
    stream: str,
    key: str | None,
    anomalies: str | None,
    points: int = 500,
    cancelled: Callable[[], bool] = lambda: False,
    *,
    readers: ReaderPool | None = None,
) -> dict[str, Any]:
    """:func:`series_of` from Kafka: the newest predictions of ``stream`` (a bounded scan of
    ten messages per point, enough for ten keys interleaved) and the anomalies of stream
    ``anomalies`` on ``key`` (none if ``None``, or if ``key`` is); ``readers``: where the
    scans' consumers come from (default: made for them)."""
    if not 1 <= points <= MAX_POINTS:
        raise ValueError(f"a chart has 1 to {MAX_POINTS:,} points, not {points}")
    budget = min(MAX_BUDGET, 10 * points)
    with StreamScan(config, Scan(stream, budget=budget), cancelled, readers=readers) as read:
        marks = _anomalies(config, anomalies, key, cancelled, readers)
        chart = series_of(stream, key, read, marks, points)
        chart["scanned"] = read.scanned
        chart["truncated"] = read.truncated
    return chart


def _anomalies(
    config: MillstreamConfig,
    stream: str | None,
    key: str | None,
    cancelled: Callable[[], bool],
    readers: ReaderPool | None,
) -> list[dict[str, Any]]:
    if not stream or key is None:
        return []
    found = scan_stream(
        config,
        Scan(stream, key=key, limit=MAX_LIMIT, budget=MAX_BUDGET),
        cancelled,
        readers=readers,
    )
    records: list[dict[str, Any]] = found["records"]
    return records
