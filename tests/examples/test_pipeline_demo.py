"""The main job end to end, as `scripts/main` runs it, on its own topic and keyspace."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from millstream.connectors import kafka as kafka_connector
from millstream.engine.config import MillstreamConfig

if TYPE_CHECKING:
    from cassandra.cluster import Session

pytestmark = pytest.mark.integration

DEMO = Path(__file__).resolve().parents[2] / "examples" / "pipeline_demo.py"


@pytest.fixture
def demo_names(
    services: MillstreamConfig, cassandra: Session, unique: Callable[[str], str]
) -> Iterator[tuple[str, str]]:
    topic, keyspace = unique("demo"), unique("demo")
    yield topic, keyspace
    kafka_connector.delete_topics(services, [topic])
    cassandra.execute(f"DROP KEYSPACE IF EXISTS {keyspace}")
    shutil.rmtree(services.home / "checkpoints" / f"pipeline-demo-{topic}", ignore_errors=True)


def _run_demo(topic: str, keyspace: str, events: int, seed: int) -> str:
    result = subprocess.run(
        [
            sys.executable,
            str(DEMO),
            "--events",
            str(events),
            "--seed",
            str(seed),
            "--topic",
            topic,
            "--keyspace",
            keyspace,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-4000:]
    return result.stdout


def test_each_run_counts_exactly_the_new_events(
    demo_names: tuple[str, str], cassandra: Session
) -> None:
    topic, keyspace = demo_names
    first = _run_demo(topic, keyspace, 300, seed=1)
    assert re.search(r"Spark counted 300 new events", first), first
    second = _run_demo(topic, keyspace, 200, seed=2)
    assert re.search(r"Spark counted 200 new events", second), second

    total = sum(row.n for row in cassandra.execute(f"SELECT n FROM {keyspace}.query_counts"))
    assert total == 500
