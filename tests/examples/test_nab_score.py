"""NAB's standard score, pinned to NAB's own published per-file scores.

``data/nab-published`` holds, from NAB at commit ea702d75 (MIT, its ``LICENSE.txt``): the
standard-profile scores and flagged rows of four published detectors on the five tweet series
the job ships and on four series of other categories (a 30-minute one, two artificial ones,
one of them without windows, and a road-traffic one with irregular rows), and those series.
"""

from __future__ import annotations

import csv
import io
import json
import sys
from collections import defaultdict
from pathlib import Path

import pytest
from zeitgeist.evaluation import JobInput, Report, print_reports, score_series
from zeitgeist.series import (
    STANDARD_PROFILE,
    Detection,
    NabProfile,
    NabScore,
    Series,
    nab_score,
    parse_time,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

pytestmark = pytest.mark.unit

PUBLISHED = Path(__file__).parent / "data" / "nab-published"
TWEETS = EXAMPLES / "zeitgeist" / "data" / "nab"
HOUR = 3_600_000_000


def _rows(path: Path) -> list[int]:
    with path.open() as lines:
        return [parse_time(row["timestamp"]) for row in csv.DictReader(lines)]


def _windows(labels: list[list[str]]) -> list[tuple[int, int]]:
    return [(parse_time(s.split(".")[0]), parse_time(e.split(".")[0])) for s, e in labels]


def _published() -> list[tuple[str, str, float]]:
    with (PUBLISHED / "scores.csv").open() as lines:
        return [(r["Detector"], r["File"], float(r["Score"])) for r in csv.DictReader(lines)]


def test_it_reproduces_nabs_published_scores_of_four_detectors_on_nine_series() -> None:
    labels = json.loads((TWEETS / "labels.json").read_text())
    labels.update(json.loads((PUBLISHED / "series" / "labels.json").read_text()))
    flagged: dict[tuple[str, str], list[int]] = defaultdict(list)
    with (PUBLISHED / "detections.csv").open() as lines:
        for row in csv.DictReader(lines):
            flagged[row["detector"], row["file"]].append(parse_time(row["timestamp"]))
    published = _published()
    assert {d for d, _, _ in published} == {"ARTime", "contextOSE", "knncad", "numenta"}
    assert len({f for _, f, _ in published}) == 9
    by_file: dict[str, float] = defaultdict(float)
    for detector, name, expected in published:
        category, file_name = name.split("/")
        path = TWEETS / file_name if category == "realTweets" else PUBLISHED / "series" / name
        result = nab_score(_rows(path), _windows(labels[name]), flagged[detector, name])
        # The published figures carry about six significant digits.
        assert result.raw == pytest.approx(expected, abs=1e-5), (detector, name)
        if category == "realTweets":
            by_file[detector] += result.raw
    # Normalised over the five tweet series (15 windows), as the table in nab-extra shows.
    artime = NabScore(by_file["ARTime"], 15)
    assert artime.normalised == pytest.approx(80.17, abs=0.01)


def test_only_a_windows_first_detection_counts_and_probation_counts_nothing() -> None:
    rows = [n * HOUR for n in range(100)]  # probation: the first 15 rows
    windows = [(40 * HOUR, 49 * HOUR)]
    assert nab_score(rows, windows, []).raw == -1.0  # the window missed
    first = nab_score(rows, windows, [40 * HOUR])
    assert first.raw == pytest.approx(1.0)  # its first row: the perfect detection
    assert first.normalised == pytest.approx(100.0)
    assert nab_score(rows, windows, [40 * HOUR, 41 * HOUR, 49 * HOUR]).raw == first.raw
    late = nab_score(rows, windows, [49 * HOUR]).raw
    assert 0.0 < late < first.raw  # the window's last row: still a catch, worth less
    assert nab_score(rows, windows, [3 * HOUR, 40 * HOUR]).raw == first.raw  # in probation
    # A detection between rows flags the row before it.
    assert nab_score(rows, windows, [40 * HOUR + 1]).raw == first.raw


def test_a_false_alarm_costs_more_the_further_it_is_from_a_window() -> None:
    rows = [n * HOUR for n in range(200)]  # probation: the first 30 rows
    windows = [(40 * HOUR, 49 * HOUR)]
    caught = nab_score(rows, windows, [40 * HOUR]).raw
    before = nab_score(rows, windows, [40 * HOUR, 35 * HOUR]).raw - caught
    assert before == pytest.approx(-STANDARD_PROFILE.fp)  # no window before it: the most
    just_after = nab_score(rows, windows, [40 * HOUR, 50 * HOUR]).raw - caught
    far_after = nab_score(rows, windows, [40 * HOUR, 150 * HOUR]).raw - caught
    assert before == far_after
    assert before < just_after < 0.0
    # Without windows only the alarms score, and there is nothing to normalise by.
    quiet = nab_score(rows, [], [100 * HOUR, 120 * HOUR])
    assert (quiet.raw, quiet.windows, quiet.normalised) == (-0.22, 0, None)


def test_scores_add_up_per_profile_only() -> None:
    total = NabScore(1.0, 2) + NabScore(-1.0, 3)
    assert (total.raw, total.windows) == (0.0, 5)
    assert total.normalised == pytest.approx(50.0)
    with pytest.raises(ValueError, match="profiles"):
        _ = total + NabScore(0.0, 1, NabProfile(tp=1.0, fp=0.22, fn=1.0))


def test_the_jobs_table_prints_the_nab_score_per_series_and_in_all() -> None:
    rows = {n * HOUR: 10 for n in range(100)}
    job = JobInput(
        "two",
        [Series("a", rows, [(40 * HOUR, 49 * HOUR)]), Series("b", rows, [(60 * HOUR, 69 * HOUR)])],
    )
    found = [Detection("a", "spike", 40 * HOUR), Detection("b", "spike", 90 * HOUR)]
    per_series = score_series(job, found)
    assert per_series["a"][1].normalised == pytest.approx(100.0)
    b_score, b_nab = per_series["b"]
    assert (b_score.found, b_score.false_alarms) == (0, 1)
    assert b_nab.raw < -1.0  # missed, and an alarm after the window
    report = Report(
        "two", 2, 2_000, 2_000, 1.0, 2, b_score + per_series["a"][0], {}, per_series=per_series
    )
    out = io.StringIO()
    print_reports([report], out)
    lines = {line.split()[0]: line.split() for line in out.getvalue().splitlines() if line}
    assert lines["a"][-1] == "100.0"
    assert float(lines["b"][-1]) < 0.0
    assert float(lines["two"][-3]) == pytest.approx(report.nab.normalised, abs=0.05)


def test_the_anchor_benchmark_prints_the_published_detectors_as_nab_extra_tabulates_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``bench/nab_anchors.py`` against the table in NAB-extra's README (found / false alarm
    runs / NAB), computed apart from it."""
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "bench" / "nab_anchors.py"
    spec = importlib.util.spec_from_file_location("nab_anchors", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks itself up there
    spec.loader.exec_module(module)
    module.main([])
    rows = {
        line.split()[0]: line.split()[1:]
        for line in capsys.readouterr().out.splitlines()
        if line and line[0].isalpha() and "/" in line
    }
    assert rows["ARTime"] == ["15/15", "39", "1.00", "0.28", "80.2"]
    assert rows["contextOSE"] == ["11/15", "7", "0.73", "0.61", "64.4"]
    assert rows["expose"] == ["5/15", "42", "0.33", "0.11", "11.5"]
    assert "Zeitgeist" in rows


def test_the_anchor_benchmark_scores_zeitgeist_together_with_each_published_detector(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--ensembles``: a union finds every window either part found, and no fewer."""
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "bench" / "nab_anchors.py"
    spec = importlib.util.spec_from_file_location("nab_anchors_ensembles", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    module.main(["--ensembles"])
    found = {
        line.rsplit(maxsplit=5)[0].strip(): int(line.rsplit(maxsplit=5)[1].split("/")[0])
        for line in capsys.readouterr().out.splitlines()
        if line and line[0].isalpha() and "/" in line
    }
    published = [name for name in found if "Zeitgeist" not in name]
    assert len(published) == 15
    ours = found["Zeitgeist (in-sample)"]
    for name in published:
        assert found[f"Zeitgeist + {name}"] >= max(found[name], ours), name
    # Exactly the windows of both: ARTime finds all 15 alone, so together they do too.
    assert found["Zeitgeist + ARTime"] == 15
