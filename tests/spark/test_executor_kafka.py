"""The executor's Kafka clients against a real broker (``millstream.spark.executor``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from types import SimpleNamespace

import pytest

from millstream.engine.config import MillstreamConfig
from millstream.spark import executor
from millstream.spark.executor import TaskSettings

pytestmark = pytest.mark.integration

CLIENTS = 8
"""Fresh clients tried. In a plain process about a quarter of them, unprimed, answered their
first end offsets only after 1 or 3 s; under pytest none of 24 did (the race is librdkafka's,
between its threads), so this checks what the warm-up leaves, not the race itself."""


def test_a_primed_admin_answers_a_batchs_first_read_ahead_at_once(
    services: MillstreamConfig,
    kafka_topic: Callable[..., str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The warm-up's request (``_prime_end_offsets``) takes a fresh admin client through
    librdkafka's first leader lookup, which its bootstrap connection may lose for 1 to 3 s,
    and answers each partition's end: once it has, the read-ahead of a batch asks the same
    client, and its end offsets come in one round trip."""
    topic = kafka_topic(partitions=2)
    settings = TaskSettings(services, "keyspace", "table", "run", "keyspace.table")
    places = [(topic, 0), (topic, 1)]
    firsts: list[float] = []
    for _ in range(CLIENTS):
        # What committed_ends_from_kafka uses of a process's resources, made afresh.
        resources = SimpleNamespace(reader=None, admin=None, stuck_at={})
        monkeypatch.setattr(executor, "_resources", lambda _settings, r=resources: r)
        try:
            primed = executor._prime_end_offsets(resources, settings, {topic})  # type: ignore[arg-type]
            assert {(tp.topic, tp.partition) for tp in primed} == set(places)
            for future in primed.values():
                assert future.result(timeout=30).offset == 0
            admin = resources.admin
            assert admin is not None
            started = time.monotonic()
            ends = executor.committed_ends_from_kafka(settings, places)
            firsts.append(time.monotonic() - started)
            assert ends == {(topic, 0): 0, (topic, 1): 0}
            assert resources.admin is admin  # the warmed client, not one made afresh
        finally:
            if resources.reader is not None:
                resources.reader.close()
    assert max(firsts) < 0.5, [round(first, 3) for first in firsts]
