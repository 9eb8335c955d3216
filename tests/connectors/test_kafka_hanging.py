"""The rule that tells a hanging transaction from a live one, and the sweeper that aborts
hanging ones (a fake admin: the real broker is test_kafka_hanging_on_the_broker.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence

import pytest

from millstream.connectors.kafka.hanging import (
    CONSUMER_OFFSETS_TOPIC,
    HangingTransactionSweeper,
    OpenTransaction,
    find_hanging,
    hanging_after,
)
from millstream.engine.clock import ManualClock

pytestmark = pytest.mark.unit

NOW_MS = 1_800_000_000_000
MINUTE_MS = 60_000


def open_on(topic: str, partition: int, producer: int, silent_ms: int) -> OpenTransaction:
    return OpenTransaction(topic, partition, producer, 0, 7, NOW_MS - silent_ms, 3)


class FakeAdmin:
    """The broker's and coordinators' answers, and the aborts asked for."""

    def __init__(
        self,
        open_transactions: list[OpenTransaction],
        ids: dict[int, str] | None = None,
        counted: dict[str, set[tuple[str, int]]] | None = None,
    ) -> None:
        self.open = open_transactions
        self.ids = ids or {}
        self.counted = counted or {}
        self.aborted: list[OpenTransaction] = []
        self.asked: list[Sequence[tuple[str, int]]] = []
        self.asked_ids: list[set[int]] = []
        self.closed = False

    def partitions(self, topics: Sequence[str]) -> list[tuple[str, int]]:
        return [(t, p) for t in topics for p in range(2)]

    def open_transactions(self, partitions: Sequence[tuple[str, int]]) -> list[OpenTransaction]:
        self.asked.append(partitions)
        return [t for t in self.open if (t.topic, t.partition) in partitions]

    def transactional_ids(self, producer_ids: Iterable[int]) -> dict[int, str]:
        wanted = set(producer_ids)
        self.asked_ids.append(wanted)
        return {p: i for p, i in self.ids.items() if p in wanted}

    def transaction_partitions(
        self, transactional_ids: Iterable[str]
    ) -> dict[str, set[tuple[str, int]]]:
        return {i: self.counted[i] for i in transactional_ids if i in self.counted}

    def abort(self, transaction: OpenTransaction) -> None:
        self.aborted.append(transaction)
        self.open.remove(transaction)

    def close(self) -> None:
        self.closed = True


def test_an_old_transaction_of_a_producer_no_coordinator_knows_hangs() -> None:
    stray = open_on("out", 0, 11, 10 * MINUTE_MS)
    admin = FakeAdmin([stray])
    found = find_hanging(admin, [("out", 0)], now_ms=NOW_MS, older_than_ms=MINUTE_MS)
    assert found == [stray]


def test_a_transaction_its_coordinator_still_counts_is_left_however_old() -> None:
    live = open_on("out", 0, 11, 60 * MINUTE_MS)
    admin = FakeAdmin([live], ids={11: "millstream.a"}, counted={"millstream.a": {("out", 0)}})
    assert find_hanging(admin, [("out", 0)], now_ms=NOW_MS, older_than_ms=MINUTE_MS) == []


def test_a_partition_the_coordinator_no_longer_counts_hangs_though_its_producer_lives() -> None:
    # The producer's current transaction is on another partition: this one was lost.
    lost = open_on("out", 1, 11, 5 * MINUTE_MS)
    admin = FakeAdmin([lost], ids={11: "millstream.a"}, counted={"millstream.a": {("out", 0)}})
    assert find_hanging(admin, [("out", 1)], now_ms=NOW_MS, older_than_ms=MINUTE_MS) == [lost]


def test_a_recent_transaction_is_not_even_looked_up() -> None:
    fresh = open_on("out", 0, 11, MINUTE_MS - 1)
    admin = FakeAdmin([fresh])
    assert find_hanging(admin, [("out", 0)], now_ms=NOW_MS, older_than_ms=MINUTE_MS) == []
    assert admin.asked_ids == []


def test_a_transaction_may_hang_after_twice_the_transaction_timeout_and_a_minute_at_least() -> None:
    assert hanging_after(30.0) == 60.0
    assert hanging_after(90.0) == 180.0


def test_a_sweep_aborts_the_hanging_transactions_of_the_topics_and_the_consumer_offsets() -> None:
    stray = open_on("out", 1, 11, 10 * MINUTE_MS)
    marker = open_on(CONSUMER_OFFSETS_TOPIC, 0, 11, 10 * MINUTE_MS)  # the same producer
    live = open_on("out", 0, 13, 10 * MINUTE_MS)
    other = open_on("elsewhere", 0, 14, 10 * MINUTE_MS)
    admin = FakeAdmin([stray, marker, live, other], ids={13: "t"}, counted={"t": {("out", 0)}})
    told: list[OpenTransaction] = []
    sweeper = HangingTransactionSweeper(
        lambda: admin,
        lambda: ["out"],
        ManualClock(NOW_MS * 1000),
        older_than=60.0,
        on_abort=told.append,
    )
    assert sorted(sweeper.sweep(), key=str) == sorted([stray, marker], key=str)
    assert told == admin.aborted
    assert admin.open == [live, other]
    assert sweeper.aborted == admin.aborted
    assert sweeper.sweep() == []
    sweeper.stop()
    assert admin.closed


def test_a_topology_without_transactional_streams_sweeps_nothing() -> None:
    def no_admin() -> FakeAdmin:
        raise AssertionError("no admin client is made")

    sweeper = HangingTransactionSweeper(no_admin, list, ManualClock(NOW_MS * 1000), older_than=60.0)
    assert sweeper.sweep() == []


def test_the_sweeper_sweeps_on_its_thread_until_stopped_and_survives_a_failed_sweep() -> None:
    stray = open_on("out", 0, 11, 10 * MINUTE_MS)
    admin = FakeAdmin([stray])
    swept = threading.Event()
    calls = 0

    def topics() -> list[str]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ConnectionError("Kafka is down")
        swept.set()
        return ["out"]

    sweeper = HangingTransactionSweeper(
        lambda: admin, topics, ManualClock(NOW_MS * 1000), older_than=60.0, every=0.01
    )
    sweeper.start()
    assert swept.wait(10.0)
    sweeper.stop()
    assert admin.aborted == [stray]
    assert admin.closed
    stopped_at = calls
    time.sleep(0.1)  # ten periods: a sweeper still running would have swept again
    assert calls == stopped_at
    # Started again (process_available does, each call): it sweeps again.
    swept.clear()
    sweeper.start()
    assert swept.wait(10.0)
    sweeper.stop()


def test_on_the_consumer_offsets_only_millstreams_own_hanging_transactions_count() -> None:
    # Another application's, maybe hidden from us by its ACLs: not the driver's to end.
    foreign = open_on(CONSUMER_OFFSETS_TOPIC, 3, 21, 10 * MINUTE_MS)
    # A marker of ours whose producer also hangs on a stream...
    marker = open_on(CONSUMER_OFFSETS_TOPIC, 4, 22, 10 * MINUTE_MS)
    output = open_on("out", 0, 22, 10 * MINUTE_MS)
    # ...and one whose coordinator names it ours, but no longer counts that partition.
    named = open_on(CONSUMER_OFFSETS_TOPIC, 5, 23, 10 * MINUTE_MS)
    admin = FakeAdmin(
        [foreign, marker, output, named],
        ids={23: "millstream.ks.table.count.3"},
        counted={"millstream.ks.table.count.3": {("out", 1)}},
    )
    partitions = [("out", 0), *((CONSUMER_OFFSETS_TOPIC, p) for p in range(6))]
    found = find_hanging(admin, partitions, now_ms=NOW_MS, older_than_ms=MINUTE_MS)
    assert sorted(found, key=str) == sorted([marker, output, named], key=str)
