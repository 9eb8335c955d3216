"""The live view's series charts from decoded records, without services: the points and the
band, the newest first kept, the anomalies of the key and the run, and the keys."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.testclient import TestClient

from millstream.ui import SnapshotHub, create_app
from millstream.ui.series import series_of
from millstream.ui.snapshot import Observation

pytestmark = pytest.mark.unit

MINUTE = 60_000_000
STREAM = "zeitgeist_run7.predictions"


def prediction(key: str, bucket: int, observed: int, expected: float) -> dict[str, Any]:
    value = {"bucket": bucket, "observed": observed, "expected": expected, "scale": 0.5}
    return {"key": key, "value": value}


def anomaly(key: str, bucket: int, run: str | None = "run7") -> dict[str, Any]:
    value: dict[str, Any] = {"bucket": bucket, "kind": "spike", "observed": 90, "expected": 9.0}
    if run is not None:
        value["run"] = run
    value["explanation"] = f"{key}: <b>90</b> searches"
    return {"key": key, "value": value}


def test_a_key_charts_its_newest_buckets_with_the_band_and_its_anomalies() -> None:
    predictions = [prediction("a", i * MINUTE, 9, 9.0) for i in range(10)]
    predictions += [prediction("b", i * MINUTE, 1, 1.0) for i in range(10)]
    predictions.append({"key": "a", "value": "not a prediction"})
    anomalies = [
        anomaly("a", 8 * MINUTE),
        anomaly("a", 9 * MINUTE, run="run8"),  # another run's
        anomaly("b", 8 * MINUTE),  # another key's
        anomaly("a", 1 * MINUTE),  # before the points kept
        anomaly("a", 7 * MINUTE, run=None),  # names no run
    ]
    chart = series_of(STREAM, "a", predictions, anomalies, points=5)
    assert [p[0] for p in chart["points"]] == [i * MINUTE for i in range(5, 10)]
    # expected 9 = 3 squared; 3 spreads of 0.5 on the square-root scale: 1.5 to 4.5.
    assert chart["points"][0] == [5 * MINUTE, 9.0, 9.0, 2.25, 20.25]
    assert [m["bucket"] for m in chart["anomalies"]] == [7 * MINUTE, 8 * MINUTE]
    assert chart["anomalies"][1]["explanation"] == "a: <b>90</b> searches"
    assert chart["keys"] == ["a", "b"]
    only_keys = series_of(STREAM, None, predictions, anomalies)
    assert only_keys["points"] == []
    assert only_keys["keys"] == ["a", "b"]


def test_the_route_charts_and_refuses_a_query_without_a_stream() -> None:
    asked: list[tuple[Any, ...]] = []

    def chart(stream: str, key: str | None, anomalies: str | None, points: int, _: Any) -> Any:
        asked.append((stream, key, anomalies, points))
        return {"stream": stream, "points": []}

    hub = SnapshotHub(lambda: Observation(0, {}, {}), period=0.05)
    with TestClient(create_app(hub, chart=chart)) as client:
        assert client.get("/api/series").status_code == 400
        assert client.get("/api/series", params={"stream": "s", "points": "x"}).status_code == 400
        answer = client.get("/api/series", params={"stream": "s", "anomalies": "anomalies"})
        assert answer.status_code == 200
        assert client.get(
            "/api/series", params={"stream": "s", "key": "k", "points": "9"}
        ).is_success
    assert asked == [("s", None, "anomalies", 500), ("s", "k", None, 9)]
