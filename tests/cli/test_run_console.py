"""`millstream run` as a person sees it: its progress on the console, the logs of Spark, Kafka
and the JVM in the run's log file."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from millstream.connectors import kafka as kafka_connector
from millstream.engine.config import MillstreamConfig
from millstream.engine.records import encode_record
from tests.spark.test_runner import EXAMPLES, events, produce, search_pipeline

pytestmark = pytest.mark.integration


def test_a_run_shows_its_progress_and_no_spark_log_line(
    services: MillstreamConfig,
    unique: Callable[[str], str],
    cassandra_keyspace: Callable[[], str],
    tmp_path: Path,
) -> None:
    suffix = unique("console").removeprefix("console_")
    names = search_pipeline.names(suffix)
    kafka_connector.create_topics(services, [names["searches"]], partitions=2)
    produce(services, names["searches"], [encode_record(r) for r in events(60)])
    try:
        finished = subprocess.run(
            [
                str(Path(sys.executable).with_name("millstream")),
                "run",
                "search_pipeline:topology",
                "--available-now",
                f"--keyspace={cassandra_keyspace()}",
                f"--checkpoint-root={tmp_path / 'checkpoints'}",
                "--no-create-keyspace",
            ],
            cwd=EXAMPLES,
            env={**os.environ, "SEARCH_PIPELINE_SUFFIX": suffix, "SEARCH_PIPELINE_INTERVALS": "2"},
            capture_output=True,  # not a terminal: plain lines
            text=True,
            timeout=300,
        )
    finally:
        # Every stream of the run, the dead-letter streams included.
        streams = search_pipeline.pipeline_topology(suffix).streams()
        kafka_connector.delete_topics(services, sorted(streams))
    shown = finished.stdout + finished.stderr
    assert finished.returncode == 0, shown[-3000:]

    where = re.search(r"^millstream run: logs go to (\S+\.log) ", finished.stderr, re.MULTILINE)
    assert where is not None, shown[-3000:]
    logged = Path(where[1]).read_text()
    # What Spark and its JVM say is in the file...
    assert "INFO org.apache.spark.SparkContext: Running Spark version" in logged
    assert "WARNING: Using incubator modules" in logged  # the JVM's own stderr
    # ... and none of it on the console, which shows the run's progress in plain lines.
    noise = [
        line
        for line in shown.splitlines()
        if re.search(r"\b(WARN|INFO|ERROR)\b|WARNING:|rdkafka|py4j|Py4J|log4j", line)
    ]
    assert noise == [], shown[-3000:]
    assert "\x1b" not in shown
    status = [line for line in finished.stdout.splitlines() if re.match(r"\[\d+:\d\d\] ", line)]
    assert status, finished.stdout
    assert f"{names['per_user']}: input watermark " in status[-1]
    assert "records/s" in status[-1]
    assert f"  {names['per_user']}: 60 inputs, 60 processed" in finished.stdout
