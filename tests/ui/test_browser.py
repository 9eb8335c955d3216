"""``millstream ui`` in a real browser (headless Chromium) against the real Kafka: it shows
what the watermark topic and the streams hold, updates live without a reload, pauses,
switches themes, reconnects by itself after the server's restart, and shows every
user-controlled name as text, never running it."""

from __future__ import annotations

import dataclasses
import json
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By

from millstream.connectors import kafka as kafka_connector
from millstream.connectors.streams import produce_lines
from millstream.engine.config import MillstreamConfig
from millstream.engine.watermarks import WatermarkReport
from tests.ui.conftest import ViewProcess

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
    kafka_connector.delete_topics(config, [config.kafka_watermark_topic])


def publish(config: MillstreamConfig, *reports: WatermarkReport) -> None:
    """The reports, written as a driver writes them (keyed by source), without waking any
    consumer: a stream named like markup has no wake-up topic."""
    writer = kafka_connector.producer(config)
    for report in reports:
        writer.produce(config.kafka_watermark_topic, report.encode(), report.source.encode())
    assert writer.flush(30) == 0


def wait_until(condition: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.1)


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
    wait_until(lambda: shown_seq(browser) >= 1, "a first snapshot shown")
    table = browser.find_element(By.CSS_SELECTOR, "#computations tbody")
    wait_until(lambda: SCRIPT_NAME in table.text, "the computation's name shown as text")
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
    browser.find_element(By.CSS_SELECTOR, "#computations button.link").click()
    assert browser.find_element(By.ID, "detail-title").text == f"Computation {SCRIPT_NAME}"
    detail = browser.find_element(By.ID, "detail-status")
    wait_until(lambda: detail.text, "the store's answer")
    assert detail.text.startswith(("Keyspace ", "Could not read the store: ")), detail.text
    browser.find_element(By.ID, "detail-close").click()

    # Live: a new report shows without a reload.
    publish(config, counter(now - 10 * S, 2, 4))
    wait_until(lambda: backlog(browser) == "0", "the backlog drained")
    assert browser.execute_script("return performance.getEntriesByType('navigation').length") == 1

    # Pause: the page holds what it shows while the server goes on.
    browser.find_element(By.ID, "pause").click()
    paused_at = shown_seq(browser)
    wait_until(lambda: served_seq(server) >= paused_at + 3, "the server going on")
    assert shown_seq(browser) == paused_at
    assert "paused" in browser.find_element(By.ID, "updated").text
    browser.find_element(By.ID, "pause").click()
    wait_until(lambda: shown_seq(browser) > paused_at, "the page going on after resume")

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
        wait_until(lambda: browser.execute_script(SELECT_STREAM, notes), "the stream offered")
        browser.find_element(By.ID, "scan-read").click()
        records = browser.find_element(By.CSS_SELECTOR, "#records tbody")
        wait_until(lambda: len(records.find_elements(By.TAG_NAME, "tr")) == 2, "two records")
        assert SCRIPT_NAME in records.text
        assert '{"n":2}' in records.text
        assert "read 2 messages" in browser.find_element(By.ID, "scan-status").text
        browser.find_element(By.ID, "scan-tail").click()
        produce_lines(config, notes, [note("later", 3)], source="ui-later")
        wait_until(lambda: "later" in records.text, "the tailed record")
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
            lambda: browser.execute_script(SELECT_CHART, predictions), "the chart offered"
        )
        assert chosen
        status = browser.find_element(By.ID, "chart-status")
        wait_until(lambda: "30 buckets" in status.text, "the chart drawn")
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
    wait_until(lambda: connection.text == "reconnecting", "the page noticing the server gone")
    server.start()
    wait_until(lambda: connection.text == "live", "the page reconnected by itself")
    before = shown_seq(browser)
    wait_until(lambda: shown_seq(browser) != before, "snapshots from the restarted server")
