"""Stalls of transactional outputs: the rule (unit) and the offsets on the real broker."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest

from millstream.connectors.kafka import StableOffsetWatch, TransactionStalls
from millstream.connectors.kafka.clients import producer
from millstream.connectors.kafka.stalls import StallTracker, stable_offsets
from millstream.connectors.kafka.topics import admin_client
from millstream.engine.clock import ManualClock
from millstream.engine.config import MillstreamConfig
from tests.waiting import wait_until

SECOND = 1_000_000


@pytest.mark.unit
def test_a_partition_behind_but_moving_is_no_stall() -> None:
    tracker = StallTracker(stall_after=10)
    assert tracker.observe({("t", 0): (5, 8)}, 0) == TransactionStalls(unstable=3)
    # Its LSO moved: a live producer committing transactions one after another.
    assert tracker.observe({("t", 0): (8, 12)}, 30 * SECOND) == TransactionStalls(unstable=4)
    assert tracker.observe({("t", 0): (12, 12)}, 60 * SECOND) == TransactionStalls()


@pytest.mark.unit
def test_a_stuck_last_stable_offset_is_one_stall_until_it_moves() -> None:
    tracker = StallTracker(stall_after=10)
    tracker.observe({("t", 0): (5, 8), ("t", 1): (3, 3)}, 0)
    assert tracker.observe({("t", 0): (5, 9)}, 9 * SECOND).stalled == 0
    assert tracker.observe({("t", 0): (5, 9)}, 10 * SECOND) == TransactionStalls(1, 1, 10.0, 4)
    # Still the same stall: counted once, its age grows.
    assert tracker.observe({("t", 0): (5, 9)}, 25 * SECOND) == TransactionStalls(1, 0, 25.0, 4)
    # Aborted by the next owner: the LSO passes the abort marker.
    assert tracker.observe({("t", 0): (10, 10)}, 26 * SECOND) == TransactionStalls()
    tracker.observe({("t", 0): (10, 11)}, 27 * SECOND)
    assert tracker.observe({("t", 0): (10, 11)}, 40 * SECOND).new == 1


@pytest.mark.integration
def test_an_open_transaction_of_a_dead_producer_is_seen_as_a_stall(
    services: MillstreamConfig, kafka_topic: Callable[..., str]
) -> None:
    topic = kafka_topic(partitions=2)
    clock = ManualClock(0)
    watch = StableOffsetWatch(services, [topic], clock, stall_after=10, every=5)
    plain = producer(services)
    plain.produce(topic, b"committed", partition=1)
    plain.flush(30)
    dead = producer(services, **{"transactional.id": f"stall-test-{uuid.uuid4()}"})
    dead.init_transactions(30)
    dead.begin_transaction()
    dead.produce(topic, b"never-committed", partition=0)
    dead.flush(30)  # written, its transaction left open: the producer "died"

    first = watch.probe()
    assert first == TransactionStalls(unstable=1)
    clock.advance(4 * SECOND)
    assert watch.probe() is None  # within `every` of the last probe
    clock.advance(7 * SECOND)
    assert watch.probe() == TransactionStalls(stalled=1, new=1, longest=11.0, unstable=1)

    dead.abort_transaction(30)
    # The coordinator writes the abort marker to the partition after it answers EndTxn, so
    # the LSO passes it a moment after abort_transaction returns.
    expected = {(topic, 0): (2, 2), (topic, 1): (1, 1)}
    # Partition 0: the aborted message and its abort marker, both passed by the LSO.
    wait_until(
        lambda: f"stable offsets {expected}, not {stable_offsets(admin_client(services), [topic])}",
        lambda: stable_offsets(admin_client(services), [topic]) == expected,
    )
    clock.advance(5 * SECOND)
    assert watch.probe() == TransactionStalls()
