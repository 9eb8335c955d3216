"""Zeitgeist, the main job: its pieces in-process. (A slice of real traffic on the stack:
``test_zeitgeist_stack.py``.)"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import itertools
import json
import random
import re
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest
from zeitgeist.__main__ import main as zeitgeist_main
from zeitgeist.evaluation import JobInput, run_offline
from zeitgeist.generate import generate
from zeitgeist.model import (
    BUCKET_MICROS,
    Declaration,
    ModelParams,
    Prediction,
    bucket_of,
    new_model,
    pot_bar,
    pot_step,
    predict,
    update,
)
from zeitgeist.offline import reference_detections, trace
from zeitgeist.pipeline import (
    Names,
    OpenBuckets,
    OpenBucketsCodec,
    WindowCounter,
    add_anomaly_detection,
    explain,
    zeitgeist_topology,
)
from zeitgeist.progress import JobProgress
from zeitgeist.replay import parse_search, write_logs
from zeitgeist.series import (
    Detection,
    Series,
    bucket_length,
    format_time,
    load_series,
    parse_time,
    score,
)

from millstream.engine.records import MAX_EVENT_TIME, Record, injector_record_id
from millstream.engine.testing import Watermark, record, run_computation, run_topology
from millstream.engine.topology import Topology
from millstream.injectors import InjectorStats
from millstream.spark import BatchMetrics, Console, RunningTopology

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

NAB = EXAMPLES / "zeitgeist" / "data" / "nab"
NAB_CHECK = EXAMPLES / "zeitgeist" / "data" / "nab-check"
HOUR = 3_600_000_000
DAY = 24 * HOUR


def replayed(series: list[Series], directory: Path, bucket: int | None = None) -> list[Record]:
    """The events the log-file injector would read from ``series``' replay, in file order."""
    write_logs(series, directory, bucket)
    events: list[Record] = []
    for path in sorted(directory.glob("*.log")):
        for number, line in enumerate(path.read_text().splitlines()):
            event = parse_search(line)
            record_id = injector_record_id(path.name, 0, number)
            events.append(Record(event.key, event.value, event.timestamp, record_id))
    return events


def run_in_memory(series: list[Series], directory: Path, params: ModelParams) -> list[Detection]:
    """The streaming topology on the in-memory harness, the watermark following every hour."""
    names = Names("memory")
    origin = min(s.start for s in series) % params.bucket
    topology = zeitgeist_topology(names, params, origin=origin)
    steps: list[tuple[str, Record] | Watermark] = []
    horizon = None
    for event in replayed(series, directory, params.bucket):
        hour = event.timestamp // HOUR
        if horizon is not None and hour > horizon:
            steps.append(Watermark(hour * HOUR))
        horizon = hour
        steps.append((names.searches, event))
    steps.append(Watermark(MAX_EVENT_TIME))
    runs = run_topology(topology, steps)
    found = [
        json.loads(r.value)
        for name in ("spike_detector", "dip_detector")
        for r in runs[names.computation(name)].records(names.anomalies)
    ]
    return sorted(Detection(a["query"], a["kind"], a["bucket"]) for a in found)


# -- unit -------------------------------------------------------------------------------------


@pytest.mark.unit
def test_scoring_is_nab_window_scoring() -> None:
    windows = [(100, 200), (300, 400)]
    # 150 finds the first window, 160 is a repeat inside it, 250 is a false alarm, 400 (the
    # end, inclusive) finds the second.
    result = score(windows, [150, 160, 250, 400])
    assert (result.found, result.false_alarms, result.detections) == (2, 1, 4)
    assert result.recall == 1.0
    assert result.precision == pytest.approx(2 / 3)
    assert score(windows, []).recall == 0.0


@pytest.mark.unit
def test_load_series_names_the_file_and_line_of_a_bad_row(tmp_path: Path) -> None:
    (tmp_path / "q.csv").write_text("timestamp,value\n2015-01-01 00:00:00,3\nnot a row\n")
    with pytest.raises(ValueError, match=r"q\.csv:3"):
        load_series(tmp_path)
    (tmp_path / "q.csv").write_text("when,how many\n")
    with pytest.raises(ValueError, match="header"):
        load_series(tmp_path)


@pytest.mark.unit
def test_the_shipped_nab_series_and_labels_load() -> None:
    series = load_series(NAB)
    assert [s.query for s in series] == ["AAPL", "AMZN", "FB", "GOOG", "IBM"]
    assert sum(len(s.windows) for s in series) == 15
    assert sum(s.events for s in series) == 2_884_507
    assert (NAB / "LICENSE.txt").read_text().startswith("Copyright")


@pytest.mark.unit
def test_a_replay_reproduces_every_bucket_and_is_the_same_each_time(tmp_path: Path) -> None:
    start = parse_time("2015-03-01 23:52:53")
    series = [
        Series("AAPL", {start: 3, start + BUCKET_MICROS: 1, start + 3 * BUCKET_MICROS: 7}),
        Series("IBM", {start + BUCKET_MICROS: 2}),
    ]
    events = replayed(series, tmp_path / "one")
    counted = Counter((e.key, bucket_of(e.timestamp, start % BUCKET_MICROS)) for e in events)
    expected = {(s.query, b): c for s in series for b, c in s.counts.items()}
    assert dict(counted) == expected
    assert len({e.record_id for e in events}) == len(events)
    # The day boundary splits the files; the second replay is byte for byte the first.
    again = tmp_path / "two"
    write_logs(series, again)
    first = sorted(p.name for p in (tmp_path / "one").glob("*.log"))
    assert first == sorted(p.name for p in again.glob("*.log"))
    assert len(first) == 2
    for name in first:
        assert (tmp_path / "one" / name).read_bytes() == (again / name).read_bytes()


@pytest.mark.unit
def test_parse_search_rejects_lines_without_a_query_or_a_zone() -> None:
    assert parse_search("2015-03-01T00:00:00.000001Z IBM").timestamp == (
        parse_time("2015-03-01 00:00:00") + 1
    )
    with pytest.raises(ValueError, match="query"):
        parse_search("2015-03-01T00:00:00Z")
    with pytest.raises(ValueError, match="zone"):
        parse_search("2015-03-01T00:00:00 IBM")


@pytest.mark.unit
def test_generated_traffic_is_seeded_and_its_truth_is_exact() -> None:
    first, again, other = generate(seed=3), generate(seed=3), generate(seed=4)
    assert [s.counts for s in first.series] == [s.counts for s in again.series]
    assert [s.counts for s in first.series] != [s.counts for s in other.series]
    kinds = Counter(a.kind for a in first.anomalies)
    assert kinds["spike"] >= 5
    assert kinds["dip"] >= 5
    (outage,) = [a for a in first.anomalies if a.outage]
    assert outage.kind == "dip"
    counts = next(s for s in first.series if s.query == outage.query).counts
    assert all(counts.get(b, 0) == 0 for b in range(outage.start, outage.end, BUCKET_MICROS))


@pytest.mark.unit
def test_the_streaming_topology_finds_what_the_reference_finds(tmp_path: Path) -> None:
    # Sensitive settings, so that both detectors declare plenty to compare.
    params = ModelParams(threshold=5.0, dip_threshold=2.5)
    traffic = generate(seed=5, queries=2, days=5)
    streamed = run_in_memory(traffic.series, tmp_path, params)
    reference = sorted(reference_detections(traffic.series, params))
    assert reference, "the reference found nothing: the comparison would be vacuous"
    assert streamed == reference
    assert {d.kind for d in streamed} == {"spike", "dip"}


def _coarser(series: Series, factor: int) -> Series:
    """``series`` in buckets ``factor`` times as long (counts summed)."""
    length = factor * BUCKET_MICROS
    counts: Counter[int] = Counter()
    for bucket, count in series.counts.items():
        counts[bucket_of(bucket, series.start, length)] += count
    return Series(series.query, dict(counts), series.windows)


@pytest.mark.unit
def test_a_series_of_30_minute_buckets_streams_as_its_reference_finds(tmp_path: Path) -> None:
    traffic = generate(seed=5, queries=2, days=6)
    series = [_coarser(s, 6) for s in traffic.series]
    assert JobInput("coarse", series).bucket == 6 * BUCKET_MICROS
    params = JobInput("coarse", series).params(ModelParams(threshold=5.0, dip_threshold=2.5))
    streamed = run_in_memory(series, tmp_path, params)
    reference = sorted(reference_detections(series, params))
    assert reference, "the reference found nothing: the comparison would be vacuous"
    assert streamed == reference
    assert {d.kind for d in streamed} == {"spike", "dip"}
    # The cooldown is a day of 30-minute buckets: no two detections of a kind closer.
    for kind, query in {(d.kind, d.query) for d in streamed}:
        moments = [d.bucket for d in streamed if (d.kind, d.query) == (kind, query)]
        assert all(b - a >= DAY for a, b in itertools.pairwise(moments))


@pytest.mark.unit
def test_model_params_carry_their_meaning_to_another_bucket_length() -> None:
    five = ModelParams()
    assert five.for_bucket(BUCKET_MICROS) is five
    half_hour = five.for_bucket(6 * BUCKET_MICROS)
    assert half_hour.bucket == 6 * BUCKET_MICROS
    assert half_hour.buckets_per_day == 48
    # The same durations: two days of warm-up, a day of cooldown, 30 min to 1 h spike windows.
    assert (half_hour.warmup, half_hour.cooldown, half_hour.hold) == (96, 48, 8)
    assert half_hour.spike_scales == (1, 2)
    assert half_hour.dip_scales == (1, 4)
    # A rate per bucket compounds: six 5-minute steps forget what one 30-minute step does.
    assert (1 - half_hour.level_alpha) == pytest.approx((1 - five.level_alpha) ** 6)
    # And back again.
    back = half_hour.for_bucket(BUCKET_MICROS)
    assert back.level_alpha == pytest.approx(five.level_alpha)
    assert (back.warmup, back.cooldown) == (five.warmup, five.cooldown)
    with pytest.raises(ValueError, match="neither divides a day"):
        ModelParams(bucket=7 * 60_000_000)


@pytest.mark.unit
def test_a_weekly_shape_is_learned_only_when_asked_for() -> None:
    # Four weeks of hourly counts: 100 on weekdays, 40 on weekends (2015-03-02 is a Monday).
    monday = parse_time("2015-03-02 00:00:00")
    counts = {monday + h * HOUR: 40 if (h // 24) % 7 >= 5 else 100 for h in range(28 * 24)}
    next_monday_noon = monday + 28 * DAY + 12 * HOUR
    next_saturday_noon = next_monday_noon + 5 * DAY
    ratios = {}
    for week_alpha in (0.0, 0.1):
        params = ModelParams(week_alpha=week_alpha).for_bucket(HOUR)
        model = new_model()
        for bucket in sorted(counts):
            update(model, predict(model, bucket, counts[bucket], params), params)
        weekday = predict(model, next_monday_noon, 0, params).expected
        weekend = predict(model, next_saturday_noon, 0, params).expected
        ratios[week_alpha] = weekday / weekend
    # The daily shape alone expects the same at noon on any day (the level of the last
    # hours, a Sunday's); the weekly one expects more on a weekday, on its way to 2.5 times
    # (the fast level takes up most of each weekend's change, the week's factors the rest).
    assert ratios[0.0] == pytest.approx(1.0)
    assert 1.4 < ratios[0.1] < 2.6


@pytest.mark.unit
def test_the_bucket_length_is_inferred_from_the_rows(tmp_path: Path) -> None:
    (tmp_path / "taxi.csv").write_text(
        "timestamp,value\n"
        + "".join(f"2014-07-01 {h:02d}:{m:02d}:00,{h}\n" for h in range(5) for m in (0, 30))
    )
    (series,) = load_series(tmp_path)
    assert series.bucket == 30 * 60_000_000
    assert JobInput("taxi", [series]).origin == 0
    with pytest.raises(ValueError, match="two rows"):
        bucket_length([Series("q", {0: 1})])


@pytest.mark.unit
def test_the_dip_detector_declares_an_outage_from_the_watermark_alone(tmp_path: Path) -> None:
    """Searches stop; only the low watermark moves on, and the dip is declared by timers."""
    start = parse_time("2015-03-01 00:00:00")
    steady = {start + i * BUCKET_MICROS: 30 for i in range(3 * 288)}
    silent_from = start + 3 * DAY
    series = [Series("q", steady)]
    names = Names("outage")
    topology = zeitgeist_topology(names)
    steps: list[tuple[str, Record] | Watermark] = [
        (names.searches, e) for e in replayed(series, tmp_path)
    ]
    steps.append(Watermark(silent_from + 2 * HOUR))  # two silent hours, input not ended
    runs = run_topology(topology, steps)
    dips = [
        json.loads(r.value)
        for r in runs[names.computation("dip_detector")].records(names.anomalies)
    ]
    assert len(dips) == 1, dips
    assert dips[0]["kind"] == "dip"
    assert dips[0]["observed"] == 0
    assert silent_from <= dips[0]["bucket"] < silent_from + HOUR
    assert runs[names.computation("dip_detector")].fired_timers, "judged without a timer"


@pytest.mark.unit
def test_a_user_puts_the_detector_on_a_stream_of_their_own(tmp_path: Path) -> None:
    """``add_anomaly_detection`` on a user's topology: requests keyed by the service that
    served them, counted by the endpoint in their value (a key extractor)."""
    params = ModelParams(threshold=5.0, dip_threshold=2.5)
    traffic = generate(seed=5, queries=2, days=5)
    topology = Topology("shop", streams=["requests"])
    added = add_anomaly_detection(
        topology,
        "requests",
        name="shop_traffic",
        anomalies="alerts",
        key=lambda r: r.value.decode(),
        params=params,
        origin=min(s.start for s in traffic.series) % params.bucket,
    )
    assert added.computations == (
        "shop_traffic_window_counter",
        "shop_traffic_model",
        "shop_traffic_spike_detector",
        "shop_traffic_dip_detector",
    )
    assert topology.streams() >= {"requests", "shop_traffic.counts", "alerts"}
    steps: list[tuple[str, Record] | Watermark] = []
    horizon = None
    for event in replayed(traffic.series, tmp_path):
        hour = event.timestamp // HOUR
        if horizon is not None and hour > horizon:
            steps.append(Watermark(hour * HOUR))
        horizon = hour
        # The record's key is the service; the endpoint (what is counted) is its value.
        steps.append(("requests", dataclasses.replace(event, key="checkout")))
    steps.append(Watermark(MAX_EVENT_TIME))
    runs = run_topology(topology, steps)
    alerts = [
        json.loads(r.value) for name in added.computations[2:] for r in runs[name].records("alerts")
    ]
    found = sorted(Detection(a["query"], a["kind"], a["bucket"]) for a in alerts)
    assert found == sorted(reference_detections(traffic.series, params))
    assert {a["kind"] for a in alerts} == {"spike", "dip"}
    for alert in alerts:
        assert alert["run"] == "shop_traffic"
        assert alert["bucket_end"] - alert["bucket"] == params.bucket
        assert parse_time(alert["bucket_end_time"]) == alert["bucket_end"]
        evidence = alert["evidence"]
        assert evidence["value"] >= evidence["bar"] > 0
        line = alert["explanation"]
        assert line.startswith(f"{alert['query']}: {alert['observed']:,} in the 5 minutes from ")
        direction = "above" if alert["kind"] == "spike" else "below"
        assert f"{alert['kind']}: traffic {direction} expectation over the last " in line
        assert "\n" not in line


@pytest.mark.unit
def test_the_job_scores_an_input_offline_without_the_stack(tmp_path: Path) -> None:
    traffic = generate(seed=5, queries=2, days=6)
    series = [_coarser(s, 6) for s in traffic.series]
    for one in series:
        rows = [f"{format_time(b)},{c}" for b, c in sorted(one.counts.items())]
        (tmp_path / f"{one.query}.csv").write_text("timestamp,value\n" + "\n".join(rows) + "\n")
    (tmp_path / "labels.json").write_text(
        json.dumps(
            {
                f"x/{s.query}.csv": [[format_time(a), format_time(b)] for a, b in s.windows]
                for s in series
            }
        )
    )
    shown = io.StringIO()
    with contextlib.redirect_stdout(shown):
        assert zeitgeist_main(["--series", str(tmp_path), "--offline"]) == 0
    report = run_offline(JobInput("x", load_series(tmp_path)))
    params = JobInput("x", series).params()  # 30-minute buckets
    found = sum(len(trace(s, params).detections) for s in series)
    assert report.anomalies == found > 0
    assert report.overall.windows == sum(len(s.windows) for s in series)
    table = shown.getvalue()
    assert "found by the offline reference" in table
    assert f"{report.anomalies:>9} {report.overall.found:>4}/{report.overall.windows:<4}" in table


@pytest.mark.unit
def test_series_without_anomalies_stay_quiet_and_nyc_taxi_is_read_in_half_hours() -> None:
    """NAB's series that fit the model and were never used to choose it
    (``data/nab-check``): the five without anomalies get no alarm from the defaults, and
    nyc_taxi's 30-minute buckets are found (its scores are bench/zeitgeist_cv.py's)."""
    checks = {s.query: s for s in load_series(NAB_CHECK)}
    quiet = [s for s in checks.values() if not s.windows]
    assert len(quiet) == 5
    for one in quiet:
        assert JobInput(one.query, [one]).params() == ModelParams()  # 5-minute buckets
        assert trace(one, ModelParams()).detections == [], one.query
    taxi = JobInput("taxi", [checks["nyc_taxi"]])
    assert (taxi.bucket, len(checks["nyc_taxi"].windows)) == (30 * 60_000_000, 5)
    assert taxi.params().warmup == 96  # two days of half hours


@pytest.mark.unit
def test_an_anomaly_explains_itself_in_one_line() -> None:
    bucket = parse_time("2015-03-02 14:05:00")
    spike = Prediction(bucket, 1204, 293.4, 1.0)
    line = explain("AAPL", spike, Declaration("spike", 3, 9.31, 7.04), BUCKET_MICROS)
    assert line == (
        "AAPL: 1,204 in the 5 minutes from 2015-03-02 14:05:00 UTC, 4.1 times the 293 "
        "expected; spike: traffic above expectation over the last 15 minutes (evidence 9.3, "
        "bar 7.0)"
    )
    dip = Prediction(bucket, 0, 12.2, 1.0)
    line = explain("IBM", dip, Declaration("dip", 4, 6.5, 6.0), 6 * BUCKET_MICROS)
    assert line == (
        "IBM: 0 in the 30 minutes from 2015-03-02 14:05:00 UTC, against 12 expected; dip: "
        "traffic below expectation over the last 2 hours (evidence 6.5, bar 6.0)"
    )


@pytest.mark.unit
def test_open_buckets_grow_both_ways_and_round_trip() -> None:
    codec = OpenBucketsCodec()
    start = parse_time("2015-03-01 00:00:00")
    buckets = OpenBuckets(start)
    for bucket in (start, start, start + 3 * BUCKET_MICROS, start - 2 * BUCKET_MICROS):
        buckets.add(bucket)
    again = codec.decode(codec.encode(buckets))
    assert again.base == start - 2 * BUCKET_MICROS
    assert list(again.counts) == [1, 0, 2, 0, 0, 1]
    assert again.take(start) == 2
    assert (again.base, list(again.counts)) == (start + BUCKET_MICROS, [0, 0, 1])
    assert again.take(start - 10 * BUCKET_MICROS) == 0


@pytest.mark.unit
def test_the_window_counter_keeps_one_timer_a_key_and_emits_every_bucket_in_order() -> None:
    start = parse_time("2015-03-01 00:00:00")
    five = 5 * BUCKET_MICROS
    searches = [start + five, start, start + five, start + 2 * five + 1]
    open_run = run_computation(
        WindowCounter("counts"), [record("IBM", b"IBM", t) for t in searches], outputs=["counts"]
    )
    # One timer, at the end of the earliest bucket open, however many buckets are open: a
    # timer tagged per bucket would leave a tombstone per bucket in the store.
    assert [(t.tag, t.timestamp) for t in open_run.pending_timers] == [
        ("close", start + BUCKET_MICROS - 1)
    ]
    run = run_computation(
        WindowCounter("counts"),
        [*(record("IBM", b"IBM", t) for t in searches), Watermark(start + DAY)],
        outputs=["counts"],
    )
    assert [json.loads(v) for v in run.values("counts")] == [
        {"bucket": start, "count": 1},
        {"bucket": start + five, "count": 2},
        {"bucket": start + 2 * five, "count": 1},
    ]
    assert [t.timestamp for t in run.fired_timers] == [
        start + BUCKET_MICROS - 1,
        start + five + BUCKET_MICROS - 1,
        start + 2 * five + BUCKET_MICROS - 1,
    ]
    assert run.pending_timers == []


@pytest.mark.unit
def test_a_wildly_timed_search_is_a_dead_letter_not_a_huge_state(tmp_path: Path) -> None:
    start = parse_time("2015-03-01 00:00:00")
    run = run_computation(
        WindowCounter("counts"),
        [
            record("IBM", b"IBM", start),
            record("IBM", b"IBM", start + 400 * DAY),
            Watermark(start + DAY),
        ],
        outputs=["counts"],
    )
    assert [json.loads(v) for v in run.values("counts")] == [{"bucket": start, "count": 1}]
    (letter,) = run.dead_letters
    assert "days away from the open buckets" in letter.error_message


@pytest.mark.unit
def test_the_job_progress_feeds_its_console_the_batches_the_injection_and_the_topology() -> None:
    screen = io.StringIO()  # not a terminal: the console prints plain lines
    progress = JobProgress("nab", console=Console(screen, live=False))
    names = Names("progress")
    stats = InjectorStats(emitted=40)
    running = SimpleNamespace(
        topology=zeitgeist_topology(names), injectors={"logs": SimpleNamespace(stats=stats)}
    )
    march = parse_time("2015-03-01 00:00:00")
    with progress:
        progress.logs_written(1, 100, 1, "logs")
        for _ in range(2):  # every half second: the topology and the injection, shown once
            progress.watch(cast(RunningTopology, running))
        progress.on_batch(
            BatchMetrics(
                computation=names.computation("window_counter"),
                batch_id=0,
                inputs=40,
                input_watermark=march,
            )
        )
        progress.anomaly(
            {
                "query": "IBM",
                "kind": "spike",
                "bucket_time": "2015-03-01 00:00:00",
                "observed": 9,
                "expected": 2.0,
                "score": 7.0,
            }
        )
    lines = screen.getvalue().splitlines()
    assert lines[0] == "[nab] 1 queries, 100 search events in 1 log files under logs"
    assert lines[1].startswith("  anomaly: IBM        spike 2015-03-01 00:00:00 UTC")
    # The console's last status, as it stops: what the job fed it.
    assert re.fullmatch(
        r"\[0:\d\d\] injected 40 of 100 searches \(40%\); "
        r"window_counter: input watermark 2015-03-01 00:00:00 UTC, [\d,]+ records/s, 1 batch; "
        r"model: input watermark none yet, 0 records/s, 0 batches; "
        r"spike_detector: .*; dip_detector: .*",
        lines[2],
    ), lines
    assert len(lines) == 3, lines


@pytest.mark.unit
@pytest.mark.parametrize(
    ("tail_of", "quantile"),
    [("normal", 3.719), ("exponential", 9.210)],  # each one's 1 - 1e-4 quantile
)
def test_a_peaks_over_threshold_bar_passes_ordinary_evidence_about_risk_often(
    tail_of: str, quantile: float
) -> None:
    """The "pot" bar fitted on a stream of ordinary evidence (standard normal, or
    exponential: a light and a heavier tail) sits near the distribution's quantile at
    ``risk``, and what passes it is about that rare; never below the floor."""
    rng = random.Random(11)

    def draw() -> float:
        return rng.gauss(0, 1) if tail_of == "normal" else rng.expovariate(1)

    params = ModelParams(bar="pot", risk=1e-4)
    tail = [0.0, 1.0, 0.0, 0.0, 0]
    for _ in range(100_000):
        pot_step(tail, draw(), 0.0, params)
    bar = pot_bar(tail, 0.0, params)
    assert quantile * 0.9 < bar < quantile * 1.25, bar
    passed = sum(1 for _ in range(300_000) if draw() >= bar) / 300_000
    assert passed < 3e-4, passed  # at most three times the risk (a bar errs high, not low)
    assert pot_bar(tail, 50.0, params) == 50.0  # the floor (the threshold) holds
