"""``millstream ui`` in a real browser (headless Chromium) against the real Kafka: it shows
what the watermark topic and the streams hold, updates live without a reload, pauses,
switches themes, reconnects by itself after the server's restart, and shows every
user-controlled name as text, never running it.

It also takes the screenshots of docs/guides/live-view.md, of a second view showing a
topology with real content (Kafka and Cassandra): into ``$MILLSTREAM_SCREENSHOTS`` if set
(``MILLSTREAM_SCREENSHOTS=docs/images/live-view`` remakes the documentation's), else into the
test's temporary directory."""

from __future__ import annotations

import base64
import dataclasses
import itertools
import json
import math
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement

from millstream.connectors import kafka as kafka_connector
from millstream.connectors.streams import parse_line, produce_lines
from millstream.engine.clock import ManualClock
from millstream.engine.config import MillstreamConfig
from millstream.engine.errors import FencedError
from millstream.engine.layout import IntervalLayout
from millstream.engine.productions import Production
from millstream.engine.rebalance import finish_change
from millstream.engine.records import Record
from millstream.engine.state import KeyChanges
from millstream.engine.stores.cassandra import CassandraIntervalStore, create_schema
from millstream.engine.timers import TimeDomain, Timer
from millstream.engine.watermarks import WatermarkReport
from millstream.engine.watermarks.report import Offsets
from tests.ui.conftest import ViewProcess
from tests.waiting import wait_until
from tests.watermark_topics import delete_watermark_topics

pytestmark = pytest.mark.integration

S = 1_000_000
# A computation's name and an output stream's name that would run script if used as markup.
SCRIPT_NAME = "<script>window.pwned='script'</script>"
IMAGE_NAME = "<img src=x onerror=\"window.pwned='img'\">"


@pytest.fixture
def watermark_config(
    services: MillstreamConfig, unique: Callable[[str], str]
) -> Iterator[MillstreamConfig]:
    """A watermark topic of the test's own (the view shows nothing of the other tests)."""
    config = dataclasses.replace(services, kafka_watermark_topic=unique("ui_watermarks"))
    kafka_connector.KafkaWatermarkTopic(config).close()  # creates it, compacted
    yield config
    delete_watermark_topics(config)


def publish(config: MillstreamConfig, *reports: WatermarkReport) -> None:
    """The reports, written as a driver writes them (keyed by source), without waking any
    consumer: a stream named like markup has no wake-up topic."""
    writer = kafka_connector.producer(config)
    for report in reports:
        writer.produce(config.kafka_watermark_topic, report.encode(), report.source.encode())
    assert writer.flush(30) == 0


# Chooses a stream in the record browser once the page offers it; whether it did.
SELECT_STREAM = """
const select = document.getElementById('scan-stream');
if (![...select.options].some((o) => o.value === arguments[0])) return false;
select.value = arguments[0];
return true;
"""


# Chooses a predictions stream to chart once the page offers it, and charts it.
SELECT_CHART = """
const select = document.getElementById('chart-stream');
if (![...select.options].some((o) => o.value === arguments[0])) return false;
select.value = arguments[0];
select.dispatchEvent(new Event('change'));
return true;
"""


def prediction(key: str, i: int) -> str:
    value = {"bucket": i * 300 * S, "observed": 10 + i % 3, "expected": 10.0, "scale": 0.3}
    return json.dumps({"key": key, "value": value, "timestamp": i * 300 * S})


def note(key: str, n: int) -> str:
    return json.dumps({"key": key, "value": {"n": n}})


def shown_seq(browser: webdriver.Chrome) -> int:
    return int(browser.execute_script("return Number(document.body.dataset.seq || 0)"))


def backlog(browser: webdriver.Chrome) -> str:
    """The first computation's backlog as shown (each snapshot replaces the table's rows)."""
    return str(
        browser.execute_script(
            "return document.querySelector('#computations tbody tr td:nth-child(8)').textContent"
        )
    )


def served_seq(view: ViewProcess) -> int:
    with urllib.request.urlopen(view.address + "api/snapshot", timeout=10) as response:
        return int(json.load(response)["seq"])


def test_the_view_shows_the_topology_live_and_names_as_text(
    demo: Demo,
    screenshots: Path,
    browser: webdriver.Chrome,
    view: Callable[[MillstreamConfig], ViewProcess],
    watermark_config: MillstreamConfig,
    kafka_topic: Callable[..., str],
    unique: Callable[[str], str],
) -> None:
    config = watermark_config
    searches = kafka_topic(partitions=2)
    writer = kafka_connector.producer(config)
    for i in range(7):
        writer.produce(searches, b"{}", f"k{i}".encode(), partition=i % 2)
    assert writer.flush(30) == 0
    now = int(time.time() * S)
    feed = WatermarkReport("injector/feed/0", (searches,), now - 5 * S, 1)
    source = f"computation/shop/{SCRIPT_NAME}"

    def counter(watermark: int, sequence: int, consumed: int) -> WatermarkReport:
        return WatermarkReport(
            source,
            (IMAGE_NAME,),
            watermark,
            sequence,
            held_by="input",
            consumed={searches: {0: consumed, 1: 3}},
            input_watermark=watermark,
        )

    publish(config, feed, counter(now - 120 * S, 1, 1))
    server = view(config)
    browser.get(server.address)

    # The topology: the injector, both streams and the computation, its name as text.
    wait_until("a first snapshot shown", lambda: shown_seq(browser) >= 1)
    table = browser.find_element(By.CSS_SELECTOR, "#computations tbody")
    wait_until("the computation's name shown as text", lambda: SCRIPT_NAME in table.text)
    titles = browser.execute_script(
        "return [...document.querySelectorAll('#graph g.node title')].map(t => t.textContent)"
    )
    assert f"computation {SCRIPT_NAME}" in titles
    assert f"stream {IMAGE_NAME}" in titles
    streams = browser.find_element(By.CSS_SELECTOR, "#streams tbody").text
    assert IMAGE_NAME in streams
    assert searches in streams
    # Backlog: 4 records on partition 0 past the consumed 1, none on partition 1 (3 of 3).
    assert backlog(browser) == "3"
    held = browser.find_element(By.ID, "held").text
    assert (
        f"computation {SCRIPT_NAME} \u2190 stream {searches} (partition 0: 3 records unread) "
        "\u2190 injector feed"
    ) in held
    # Nothing of the names ran or became an element.
    assert browser.execute_script("return window.pwned === undefined")
    assert browser.find_elements(By.TAG_NAME, "img") == []
    assert [s.get_attribute("src") for s in browser.find_elements(By.TAG_NAME, "script")] == [
        server.address + "assets/app.js"
    ]
    assert browser.find_element(By.ID, "connection").text == "live"

    # A computation's key intervals, from the store: its name as text, and what the store said
    # (the session's keyspace may hold no table for it: then the page says why).
    # Found and clicked in one script: each snapshot draws the table's rows anew, and a row
    # found first could be replaced before a separate click reached it (a stale element).
    assert browser.execute_script(CLICK_LINK, "#computations", SCRIPT_NAME)
    assert browser.find_element(By.ID, "detail-title").text == f"Computation {SCRIPT_NAME}"
    detail = browser.find_element(By.ID, "detail-status")
    wait_until("the store's answer", lambda: detail.text)
    assert detail.text.startswith(("Keyspace ", "Could not read the store: ")), detail.text
    browser.find_element(By.ID, "detail-close").click()

    # Live: a new report shows without a reload.
    publish(config, counter(now - 10 * S, 2, 4))
    wait_until("the backlog drained", lambda: backlog(browser) == "0")
    assert browser.execute_script("return performance.getEntriesByType('navigation').length") == 1

    # Pause: the page holds what it shows while the server goes on.
    browser.find_element(By.ID, "pause").click()
    paused_at = shown_seq(browser)
    wait_until("the server going on", lambda: served_seq(server) >= paused_at + 3)
    assert shown_seq(browser) == paused_at
    assert "paused" in browser.find_element(By.ID, "updated").text
    browser.find_element(By.ID, "pause").click()
    wait_until("the page going on after resume", lambda: shown_seq(browser) > paused_at)

    # Themes: light and dark, by CSS variables.
    theme = browser.find_element(By.ID, "theme")
    backgrounds = {}
    for _ in range(2):
        theme.click()
        chosen = browser.execute_script("return document.documentElement.dataset.theme")
        backgrounds[chosen] = browser.execute_script(
            "return getComputedStyle(document.body).backgroundColor"
        )
    assert backgrounds == {"light": "rgb(255, 255, 255)", "dark": "rgb(20, 23, 28)"}

    # The record browser: a stream's newest records, decoded, keys as text; then a live tail.
    notes = unique("ui_notes")
    try:
        produce_lines(config, notes, [note(SCRIPT_NAME, 1), note("plain", 2)], source="ui")
        wait_until("the stream offered", lambda: browser.execute_script(SELECT_STREAM, notes))
        browser.find_element(By.ID, "scan-read").click()
        records = browser.find_element(By.CSS_SELECTOR, "#records tbody")
        wait_until("two records", lambda: len(records.find_elements(By.TAG_NAME, "tr")) == 2)
        assert SCRIPT_NAME in records.text
        assert '{"n":2}' in records.text
        assert "read 2 messages" in browser.find_element(By.ID, "scan-status").text
        browser.find_element(By.ID, "scan-tail").click()
        produce_lines(config, notes, [note("later", 3)], source="ui-later")
        wait_until("the tailed record", lambda: "later" in records.text)
        assert browser.find_element(By.ID, "scan-status").text.startswith("Tailing: ")
        browser.find_element(By.ID, "scan-stop").click()
        assert browser.find_element(By.ID, "scan-tail").text == "Tail live"
        assert browser.execute_script("return window.pwned === undefined")
        assert browser.find_elements(By.TAG_NAME, "img") == []
    finally:
        kafka_connector.delete_topics(config, [notes])

    # A detector's predictions stream charts a key: its points, the key as text.
    predictions = unique("ui_detector") + ".predictions"
    try:
        produce_lines(
            config,
            predictions,
            [prediction(SCRIPT_NAME, i) for i in range(30)] + [prediction("other", 0)],
            source="ui",
        )
        chosen = wait_until(
            "the chart offered", lambda: browser.execute_script(SELECT_CHART, predictions)
        )
        assert chosen
        status = browser.find_element(By.ID, "chart-status")
        wait_until("the chart drawn", lambda: "30 buckets" in status.text)
        assert status.text.startswith(f"Key {SCRIPT_NAME}: 30 buckets")
        keys = browser.execute_script(
            "return [...document.getElementById('chart-key').options].map((o) => o.text)"
        )
        assert keys == [SCRIPT_NAME, "other"]
        assert len(browser.find_elements(By.CSS_SELECTOR, "#chart polyline.observed")) == 1
        assert browser.execute_script("return window.pwned === undefined")
    finally:
        kafka_connector.delete_topics(config, [predictions])

    # The server restarts: the page says so, then reconnects by itself.
    server.stop()
    connection = browser.find_element(By.ID, "connection")
    wait_until("the page noticing the server gone", lambda: connection.text == "reconnecting")
    server.start()
    wait_until("the page reconnected by itself", lambda: connection.text == "live")
    before = shown_seq(browser)
    wait_until("snapshots from the restarted server", lambda: shown_seq(browser) != before)

    # Meanwhile, the second view's topology had time to stall: each view in a screenshot.
    screenshot_each_view(browser, demo, screenshots)


# -- The screenshots of each view ----------------------------------------------------------
# A second view shows a topology of its own with real content: an injector, two computations
# (one of them stalled: the view calls a computation stalled once its watermark has stood
# still for 30 s of the view's clock while its input waited, so this view starts with the
# test and its page is shot after the rest), their streams on Kafka and one computation's key
# intervals written to Cassandra by the real store.

TOPOLOGY = "zeitgeist"
WINDOW_COUNTER = f"computation/{TOPOLOGY}/window_counter"
DETECTOR = f"computation/{TOPOLOGY}/detector"
QUERIES = ("election results", "flights", "football", "recipes", "weather")
BUCKET = 300 * S
INTERVALS_TABLE = "intervals"
DEDUP_TTL = 3600 * S
# The window's size in CSS pixels (the images' width): wide enough for the commits table,
# tall enough for the whole page, so that each shot is a clip of what the window shows.
SHOT_SIZE = (1400, 3200)
SHOTS = (
    "overview.png",
    "topology-table.png",
    "intervals.png",
    "commits.png",
    "streams.png",
    "records.png",
    "series.png",
    "events.png",
)

# Counters as a driver publishes them with its reports (MetricCounts, batches, ...).
COUNTER_STATS = {
    "inputs": 5_630,
    "processed": 5_610,
    "duplicates": 12,
    "late": 3,
    "dead_letters": 2,
    "committed_keys": 1_480,
    "pending": 1,
    "intervals": 123,
    "cache_hits": 117,
    "transactions": 41,
    "batches": 41,
    "failed_attempts": 0,
    "rebalances": 0,
}
DETECTOR_STATS = {
    "inputs": 2_210,
    "processed": 2_210,
    "committed_keys": 2_210,
    "intervals": 80,
    "cache_hits": 78,
    "transactions": 40,
    "batches": 40,
    "failed_attempts": 2,
    "sequencer_conflicts": 1,
}


@dataclasses.dataclass(frozen=True)
class Demo:
    """The topology the screenshots show, and the view (``server``) showing it:
    injector ``searches`` → ``window_counter`` → ``counts`` → ``detector`` → predictions
    and anomalies. ``window_counter``'s watermark is held by its key interval 2 (a timer);
    ``detector`` has stopped reading ``counts`` and will stall."""

    config: MillstreamConfig
    server: ViewProcess
    keyspace: str
    streams: dict[str, str]  # by role: searches, counts, dead-letters, predictions, anomalies
    now: int

    def stream(self, role: str) -> str:
        return self.streams[role]


def line(key: str, value: Any, timestamp: int) -> str:
    return json.dumps({"key": key, "value": value, "timestamp": timestamp})


def searches(now: int, count: int, start: int = 0) -> list[str]:
    """``count`` searches of the queries in turn, one a second up to ``now``."""
    return [
        line(QUERIES[n % len(QUERIES)], {"user": f"u{n % 17}"}, now - (count - i) * S)
        for i, n in enumerate(range(start, start + count))
    ]


def expected_count(query: int, bucket: int) -> float:
    """The count expected of query number ``query`` in bucket number ``bucket``: a wave."""
    return 40.0 + 10 * query + 15 * math.sin(bucket / 6 + query)


def predictions(now: int) -> tuple[list[str], list[str]]:
    """36 buckets of predictions per query, and the anomalies of the first query: a spike
    (three times what was expected) and a dip."""
    first = now // BUCKET * BUCKET - 36 * BUCKET
    lines, anomalies = [], []
    for q, query in enumerate(QUERIES):
        for i in range(36):
            bucket = first + i * BUCKET
            expected = expected_count(q, i)
            observed = round(expected + (i * 7 % 5 - 2) * 2)
            kind = {29: "spike", 14: "dip"}.get(i) if q == 0 else None
            if kind == "spike":
                observed = round(3 * expected)
            elif kind == "dip":
                observed = 4
            value = {"bucket": bucket, "observed": observed, "expected": expected, "scale": 0.45}
            lines.append(line(query, value, bucket + BUCKET - 1))
            if kind is not None:
                times = observed / expected
                explanation = (
                    f"{query}: {observed} in the 5 minutes from "
                    f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime(bucket // S))} UTC, "
                    + (
                        f"{times:.1f} times the {expected:.0f} expected"
                        if kind == "spike"
                        else f"against {expected:.0f} expected"
                    )
                )
                anomaly = {
                    "query": query,
                    "kind": kind,
                    "bucket": bucket,
                    "observed": observed,
                    "expected": round(expected, 2),
                    "explanation": explanation,
                }
                anomalies.append(line(query, anomaly, bucket + BUCKET - 1))
    return lines, anomalies


def counts(now: int) -> list[str]:
    """Twelve buckets of counts per query, as window_counter writes them."""
    first = now // BUCKET * BUCKET - 12 * BUCKET
    return [
        line(query, {"bucket": b, "count": round(expected_count(q, i))}, b + BUCKET - 1)
        for i, b in enumerate(range(first, first + 12 * BUCKET, BUCKET))
        for q, query in enumerate(QUERIES)
    ]


def produce(config: MillstreamConfig, source: str, lines: dict[str, list[str]]) -> None:
    """Each stream's JSON lines as records, as ``millstream produce`` sends them (to topics
    that exist), in one round trip for all."""
    writer = kafka_connector.producer(config)
    for stream, said in lines.items():
        for number, text in enumerate(said, start=1):
            record, data = parse_line(text, number, stream=stream, now=0, source=source)
            writer.produce(stream, data, record.key.encode())
    assert writer.flush(30) == 0


def end_offsets(config: MillstreamConfig, streams: dict[str, str]) -> Offsets:
    """The end offsets of the streams searches and counts."""
    reader = kafka_connector.consumer(config, "ui-screenshots")
    try:
        return kafka_connector.end_offsets(reader, [streams["searches"], streams["counts"]])
    finally:
        reader.close()


def window_counter_report(
    streams: dict[str, str], now: int, sequence: int, stats: dict[str, int], consumed: Offsets
) -> WatermarkReport:
    return WatermarkReport(
        WINDOW_COUNTER,
        (streams["counts"], streams["dead-letters"]),
        counter_watermark(now),
        sequence,
        held_by="interval 2",
        input_watermark=now - 9 * S,
        hot=((2, 412), (3, 206), (1, 95)),
        behind=((2, counter_watermark(now)),),
        consumed={streams["searches"]: consumed[streams["searches"]]},
        stats=stats,
        driver="driver-7f3a",
        workers={"10.0.4.17:31877": (2, 3), "10.0.4.18:30412": (1,)},
    )


def detector_report(
    streams: dict[str, str], now: int, driver: str, stats: dict[str, int], consumed: Offsets
) -> WatermarkReport:
    """detector's report: its watermark stands still (its driver stopped reading ``counts``,
    9 records short on partition 1), and a restart keeps it."""
    unread = dict(consumed[streams["counts"]])
    unread[1] -= 9
    return WatermarkReport(
        DETECTOR,
        (streams["predictions"], streams["anomalies"]),
        now - 190 * S,
        40,
        held_by="input",
        input_watermark=now - 190 * S,
        hot=((0, 61), (1, 44)),
        consumed={streams["counts"]: unread},
        stats=stats,
        driver=driver,
    )


def counter_watermark(now: int) -> int:
    """window_counter's watermark: the event-time timer of its interval 2 that holds it."""
    return now - 65 * S


def keys_owned(layout: IntervalLayout, interval: int, count: int) -> list[str]:
    candidates = (f"query-{n}" for n in itertools.count())
    return list(itertools.islice((k for k in candidates if layout.owns(interval, k)), count))


def write_intervals(cassandra: Any, demo: Demo) -> None:
    """window_counter's key intervals, as its workers leave them in the store: two intervals,
    0 split into 2 and 3 (just now, in 2 s); then keys' state, timers and dedup IDs,
    in interval 2 the timer holding the watermark and a pending production, in 1 a wall-time
    timer, and in 3 a zombie's commit refused (another worker took its lease over)."""
    store = CassandraIntervalStore(
        cassandra, demo.keyspace, ManualClock(demo.now), table=INTERVALS_TABLE
    )
    computation = "window_counter"
    initial = store.layout(computation, 2)
    split = initial.begin_split(0, at=demo.now - 3 * S)
    assert store.write_layout(computation, split, initial)
    layout = finish_change(store, computation, split, dedup_ttl=DEDUP_TTL, now=demo.now - S)
    due = counter_watermark(demo.now)
    for interval, count in ((1, 4), (2, 6), (3, 3)):
        keys = keys_owned(layout, interval, count)
        changes = [
            KeyChanges(
                key,
                state=json.dumps({"count": n + 1}).encode(),
                timers={"bucket": Timer(key, "bucket", due + (interval != 2 or n > 0) * BUCKET)},
                dedup_ids=[uuid.uuid4().bytes for _ in range(n + 1)],
            )
            for n, key in enumerate(keys)
        ]
        if interval == 1:
            flush = Timer(keys[0], "flush", demo.now + 45 * S, TimeDomain.WALL_TIME)
            changes[0].timers["flush"] = flush
        if interval == 2:
            produced = Record(keys[0], b'{"count": 3}', due, uuid.uuid4().bytes)
            changes[0].productions.append(Production(demo.stream("counts"), produced))
        lease = store.acquire(computation, interval)
        if interval == 3:
            zombie, lease = lease, store.acquire(computation, interval)
            with pytest.raises(FencedError):
                store.commit(zombie, [KeyChanges(keys[0], state=b"{}")], dedup_ttl=DEDUP_TTL)
        store.commit(lease, changes, dedup_ttl=DEDUP_TTL)


@pytest.fixture
def demo(
    services: MillstreamConfig,
    view: Callable[..., ViewProcess],
    unique: Callable[[str], str],
    cassandra: Any,
    cassandra_keyspace: Callable[[], str],
) -> Iterator[Demo]:
    """:class:`Demo`: its streams, its own watermark topic and keyspace (removed after the
    test), and its view, started first (its clock has to run 30 s for the stall)."""
    keyspace = cassandra_keyspace()
    create_schema(cassandra, keyspace, INTERVALS_TABLE)
    config = dataclasses.replace(
        services,
        kafka_watermark_topic=unique("ui_demo_watermarks"),
        run=dataclasses.replace(services.run, keyspace=keyspace, table=INTERVALS_TABLE),
    )
    prefix = unique("zg")[:9]  # short: the names show in the graph
    roles = ("searches", "counts", "dead-letters", "predictions", "anomalies")
    streams = {role: f"{prefix}.{role}" for role in roles}
    try:
        kafka_connector.KafkaWatermarkTopic(config).close()  # creates it, compacted
        now = int(time.time() * S)
        forecast, anomalies = predictions(now)
        kafka_connector.create_topics(config, [streams["searches"], streams["counts"]], 2)
        kafka_connector.create_topics(config, [streams[r] for r in roles[2:]], 1)
        lines = {
            "searches": searches(now, 80),
            "counts": counts(now),
            "dead-letters": [line("flights", "not JSON: {", now)] * 2,
            "predictions": forecast,
            "anomalies": anomalies,
        }
        produce(config, "ui", {streams[role]: said for role, said in lines.items()})
        ends = end_offsets(config, streams)
        publish(
            config,
            *(
                WatermarkReport(
                    f"injector/searches/{process}",
                    (streams["searches"],),
                    now - lag * S,
                    1,
                )
                for process, lag in ((0, 3), (1, 9))
            ),
            window_counter_report(streams, now, 41, COUNTER_STATS, ends),
            detector_report(streams, now, "driver-2c91", DETECTOR_STATS, ends),
        )
        shown = Demo(config, view(config, "--topology", TOPOLOGY), keyspace, streams, now)
        write_intervals(cassandra, shown)
        yield shown
    finally:
        delete_watermark_topics(config)
        kafka_connector.delete_topics(config, list(streams.values()))


def advance(demo: Demo) -> None:
    """What happens next: more searches, read by window_counter in a batch that failed once,
    dead-lettered two records and split an interval; detector's driver restarted (its
    watermark still stands)."""
    config = demo.config
    more = {
        demo.stream("searches"): searches(demo.now, 40, 80),
        demo.stream("dead-letters"): [line("flights", "{", demo.now)] * 2,
    }
    produce(config, "ui-later", more)
    ends = end_offsets(config, demo.streams)
    stats = {
        **COUNTER_STATS,
        "inputs": COUNTER_STATS["inputs"] + 42,
        "processed": COUNTER_STATS["processed"] + 40,
        "committed_keys": COUNTER_STATS["committed_keys"] + 25,
        "dead_letters": COUNTER_STATS["dead_letters"] + 2,
        "late": COUNTER_STATS["late"] + 1,
        "batches": COUNTER_STATS["batches"] + 1,
        "transactions": COUNTER_STATS["transactions"] + 1,
        "intervals": COUNTER_STATS["intervals"] + 3,
        "cache_hits": COUNTER_STATS["cache_hits"] + 2,
        "failed_attempts": 1,
        "rebalances": 1,
    }
    restarted = {"batches": 1, "transactions": 1, "intervals": 2}
    publish(
        config,
        window_counter_report(demo.streams, demo.now, 42, stats, ends),
        detector_report(demo.streams, demo.now, "driver-e04b", restarted, ends),
    )


# The box from the top of one element to the bottom of another, 8 pixels more above and below
# where their shown neighbours leave room, and the page's width, in page pixels; the window's
# height.
BOX = """
const [first, last] = arguments, page = document.documentElement;
const top = (e) => e.getBoundingClientRect().top + window.scrollY;
const bottom = (e) => e.getBoundingClientRect().bottom + window.scrollY;
const shown = (e, next) => {
  while (e && !e.getClientRects().length) {
    e = next ? e.nextElementSibling : e.previousElementSibling;
  }
  return e;
};
const [before, after] = [shown(first.previousElementSibling), shown(last.nextElementSibling, true)];
const y = Math.max(top(first) - 8, before ? bottom(before) : 0);
const end = Math.min(bottom(last) + 8, after ? top(after) : Infinity);
return [y, end - y, page.clientWidth, window.innerHeight];
"""

# Whether the page shows a computation's report after advance(): its failed attempt counted,
# its backlog read.
COUNTER_CAUGHT_UP = """
const row = [...document.querySelectorAll('#commits tbody tr')]
  .find((r) => r.cells[0].textContent === arguments[0]);
const table = [...document.querySelectorAll('#computations tbody tr')]
  .find((r) => r.cells[1].textContent === arguments[0]);
return Boolean(row && table && row.querySelector('td.counted.failed_attempts')
  && table.cells[7].textContent === '0');
"""

# The texts of names shown on more than one line (a text node's box per line).
BROKEN_NAMES = """
const broken = [];
for (const name of document.querySelectorAll('.name')) {
  if (!name.offsetParent) continue;  // hidden
  const texts = document.createTreeWalker(name, NodeFilter.SHOW_TEXT);
  for (let text = texts.nextNode(); text; text = texts.nextNode()) {
    const range = document.createRange();
    range.selectNodeContents(text);
    if (range.getClientRects().length > 1) broken.push(text.textContent);
  }
}
return broken;
"""

# Clicks the button (a link) of a table's row that shows this text, if the row is there.
CLICK_LINK = """
const link = [...document.querySelectorAll(arguments[0] + ' button.link')]
  .find((b) => b.textContent === arguments[1]);
if (link) link.click();
return Boolean(link);
"""


def shoot(
    browser: webdriver.Chrome, path: Path, first: WebElement, last: WebElement | None = None
) -> None:
    """A PNG of the page from the top of ``first`` to the bottom of ``last`` (its whole
    width), scrolled to the top so that the sticky header hides nothing."""
    browser.execute_script("window.scrollTo(0, 0)")
    y, height, width, window = browser.execute_script(BOX, first, last or first)
    if y + height > window:  # the page grew past the window: the window grows too
        size = browser.get_window_size()
        browser.set_window_size(size["width"], size["height"] + y + height - window + 100)
        y, height, width, window = browser.execute_script(BOX, first, last or first)
    assert height > 0, f"{path.name}: nothing to shoot"
    clip = {"x": 0, "y": y, "width": width, "height": height, "scale": 1}
    shot = browser.execute_cdp_cmd("Page.captureScreenshot", {"format": "png", "clip": clip})
    path.write_bytes(base64.b64decode(shot["data"]))


def section_of(browser: webdriver.Chrome, element_id: str) -> WebElement:
    element: WebElement = browser.execute_script(
        "return document.getElementById(arguments[0]).closest('section')", element_id
    )
    return element


def text_of(browser: webdriver.Chrome, selector: str) -> str:
    """The text of the first element ``selector`` finds, read at once (the page replaces its
    elements with each snapshot)."""
    return str(
        browser.execute_script(
            "const e = document.querySelector(arguments[0]); return e ? e.innerText : ''",
            selector,
        )
    )


def rows(browser: webdriver.Chrome, table: str) -> list[str]:
    """The text of each row of ``table``, read at once."""
    return list(
        browser.execute_script(
            "return [...document.querySelectorAll(arguments[0] + ' tbody tr')]"
            ".map((r) => r.textContent)",
            table,
        )
    )


def screenshot_each_view(browser: webdriver.Chrome, demo: Demo, directory: Path) -> None:
    """Each view of the page in ``directory``, while it shows the demo topology."""
    browser.set_window_size(*SHOT_SIZE)
    browser.get(demo.server.address)
    theme = browser.find_element(By.ID, "theme")
    while browser.execute_script("return document.documentElement.dataset.theme") != "light":
        theme.click()
    wait_until("the demo's computations", lambda: len(rows(browser, "#computations")) == 2)
    advance(demo)
    wait_until(
        "window_counter's next report shown",
        lambda: browser.execute_script(COUNTER_CAUGHT_UP, "window_counter"),
    )

    # A series: counts against the expected band, a spike and a dip marked.
    assert browser.execute_script(SELECT_CHART, demo.stream("predictions"))
    status = browser.find_element(By.ID, "chart-status")
    wait_until("the chart with its anomalies", lambda: "2 anomalies" in status.text)
    assert status.text.startswith(f"Key {QUERIES[0]}: 36 buckets")
    assert len(browser.find_elements(By.CSS_SELECTOR, "#chart polygon.band")) == 1
    assert len(browser.find_elements(By.CSS_SELECTOR, "#chart circle.anomaly")) == 2
    shoot(browser, directory / "series.png", section_of(browser, "charts"))

    # The topology as a table.
    browser.find_element(By.ID, "view-toggle").click()
    wait_until("the topology's table", lambda: len(rows(browser, "#nodes")) == 8)
    shoot(browser, directory / "topology-table.png", section_of(browser, "nodes"))
    browser.find_element(By.ID, "view-toggle").click()

    # window_counter's key intervals, from the store; the interval holding its watermark
    # marked. Then closed, and the computation no longer selected.
    assert browser.execute_script(CLICK_LINK, "#computations", "window_counter")
    detail = browser.find_element(By.ID, "detail-status")
    wait_until("the key intervals", lambda: len(rows(browser, "#intervals")) == 4)
    assert detail.text.startswith(f"Keyspace {demo.keyspace}, table {INTERVALS_TABLE}; ")
    assert "latest changes: split of interval 0 into 2 and 3" in detail.text
    holding = browser.execute_script(
        "return [...document.querySelectorAll('#intervals tr.holds')]"
        ".map((r) => r.cells[0].textContent)"
    )
    assert holding == ["2"]
    shoot(browser, directory / "intervals.png", section_of(browser, "detail"))
    browser.find_element(By.ID, "detail-close").click()
    assert not browser.find_elements(By.CSS_SELECTOR, "#graph g.node.selected")

    # The commits.
    assert browser.find_elements(By.CSS_SELECTOR, "#commits td.counted.failed_attempts")
    shoot(browser, directory / "commits.png", section_of(browser, "commits"))

    # The streams, then the record browser finding one query's counts.
    dead_letters = demo.stream("dead-letters") + "0: 4"  # a row's text: its name, its end
    wait_until(
        "the new dead letters",
        lambda: any(r.startswith(dead_letters) for r in rows(browser, "#streams")),
    )
    shoot(browser, directory / "streams.png", section_of(browser, "streams"))
    assert browser.execute_script(SELECT_STREAM, demo.stream("counts"))
    browser.find_element(By.ID, "scan-key").send_keys(QUERIES[0])
    browser.find_element(By.ID, "scan-read").click()
    wait_until("one query's twelve counts", lambda: len(rows(browser, "#records")) == 12)
    assert "12 matched" in browser.find_element(By.ID, "scan-status").text
    shoot(browser, directory / "records.png", section_of(browser, "browser"))

    # Once detector stalls: the headline, the graph with the path that holds it in red, the
    # paths and the computations; then the timeline.
    wait_until(
        "the detector stalled",
        lambda: browser.find_elements(By.CSS_SELECTOR, "#computations tr.health-stalled"),
        timeout=45,
    )
    wait_until(
        "its holding path drawn",
        lambda: len(browser.find_elements(By.CSS_SELECTOR, "#graph g.node.held-path")) == 3,
    )
    assert len(browser.find_elements(By.CSS_SELECTOR, "#graph path.edge.held-path")) == 2
    assert text_of(browser, "#held li.health-stalled") == (
        f"computation detector \u2190 stream {demo.stream('counts')} (partition 1: 9 records "
        "unread) \u2190 computation window_counter (interval 2)"
    )
    assert text_of(browser, "#headline .card.bad") == "Stalled\n1"
    shoot(
        browser,
        directory / "overview.png",
        browser.find_element(By.TAG_NAME, "header"),
        section_of(browser, "computations"),
    )
    events = browser.find_element(By.ID, "events")
    said = (
        "watermark has not moved",
        "driver restarted",
        "1 batch attempt failed",
        "2 records dead-lettered",
        "split or merged",
    )
    wait_until(f"the timeline saying {said}", lambda: all(s in events.text for s in said))
    shoot(browser, directory / "events.png", section_of(browser, "events"))

    for name in SHOTS:
        assert (directory / name).read_bytes().startswith(b"\x89PNG"), name

    # At a laptop's 1280 px, every view filled in: no name breaks mid-word, and a table wider
    # than the page scrolls in its own box, never the page.
    browser.set_window_size(1280, SHOT_SIZE[1])
    assert browser.execute_script(BROKEN_NAMES) == []
    assert browser.execute_script(
        "return document.documentElement.scrollWidth <= document.documentElement.clientWidth"
    ), "the page scrolls sideways at 1280 px"
