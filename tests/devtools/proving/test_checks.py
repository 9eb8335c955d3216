"""The proving ground's checks: what a plain reader counts, the store's probes, the
injector's outage waits, and outputs read once no transaction is open on them."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from millstream.connectors import kafka as kafka_connector
from millstream.devtools.proving.checks import (
    STORE_WRITES_LOST,
    CheckResult,
    batch_watermark_regressions,
    check_store_probes,
    injector_outage_waits,
    open_transactions,
    plain_duplicates,
    read_plain,
)
from millstream.engine.config import MillstreamConfig


@pytest.mark.unit
def test_the_plain_reader_counts_byte_identical_messages_per_topic() -> None:
    envelope, other = b"\x01record-id-1 value", b"\x01record-id-2 value"
    messages = [
        ("windows", b"k1", envelope),
        ("windows", b"k1", envelope),  # a re-send: counted
        ("windows", b"k1", envelope),  # and again
        ("windows", b"k2", envelope),  # another key: not one
        ("windows", b"k1", other),  # another value: not one
        ("rollups", b"k1", envelope),  # another topic: not one
        ("rollups", None, None),  # a tombstone
        ("rollups", None, None),  # the same tombstone again: counted
        ("rollups", b"", b""),  # empty bytes are not a missing key or value
    ]
    found = plain_duplicates(messages)
    assert found == {"windows": 2, "rollups": 1}
    assert sum(found.values()) == 3
    assert plain_duplicates(messages[3:6]) == {}


def batch(at: float, pid: int, number: int, watermark: int, name: str = "rollup") -> dict[str, Any]:
    return {"at": at, "pid": pid, "batch_id": number, "input_watermark": watermark,
            "computation": name}  # fmt: skip


@pytest.mark.unit
def test_a_zombies_batch_ended_after_its_successor_ran_past_it_is_no_regression() -> None:
    # Seed 97 of the t2 tier: driver 1 was stopped in the middle of batch 3, driver 2 took
    # over and ran batches 3 and 4, then driver 1 went on and ended its batch 3.
    zombie = [
        batch(1.0, 1, 1, 100), batch(2.0, 1, 2, 200), batch(3.0, 2, 3, 300),
        batch(4.0, 2, 4, 400), batch(5.0, 1, 3, 250), batch(6.0, 2, 5, 500),
    ]  # fmt: skip
    assert batch_watermark_regressions(zombie) == ([], 1)
    # Its other computation's batches are not superseded by those of this one.
    other = [*zombie, batch(5.5, 1, 3, 10, name="tally"), batch(5.6, 1, 4, 20, name="tally")]
    assert batch_watermark_regressions(other) == ([], 1)


@pytest.mark.unit
def test_a_lower_watermark_in_one_driver_or_in_the_driver_that_took_over_is_a_regression() -> None:
    within = [batch(1.0, 1, 1, 100), batch(2.0, 1, 2, 90)]
    assert batch_watermark_regressions(within) == (
        ["rollup: driver 1 ran batch 2 under input watermark 90 after 100"],
        0,
    )
    # A newer driver replaying a batch the crashed one ran is never left out.
    replayed = [batch(1.0, 1, 1, 100), batch(2.0, 1, 2, 200), batch(3.0, 2, 2, 150)]
    assert batch_watermark_regressions(replayed) == (
        ["rollup: driver 2 ran batch 2 under input watermark 150 after 200"],
        0,
    )
    # Nor is a zombie's batch that no newer driver had reached when it ended.
    ahead = [batch(1.0, 1, 1, 100), batch(2.0, 2, 1, 300), batch(3.0, 1, 2, 200)]
    assert batch_watermark_regressions(ahead) == (
        ["rollup: driver 1 ran batch 2 under input watermark 200 after 300"],
        0,
    )


@pytest.mark.unit
def test_a_probe_lwt_acknowledged_before_a_crash_and_missing_after_it_fails_the_run() -> None:
    durable = CheckResult()
    check_store_probes([{"acknowledged": 120, "found": 120}], durable)
    assert durable.passed
    assert durable.figures["LWTs acknowledged just before a Cassandra kill"] == 120
    lossy = CheckResult()
    # What a single node with commitlog_sync: periodic did: the last ~100 ms went missing.
    check_store_probes(
        [{"acknowledged": 553, "found": 547}, {"acknowledged": 9, "found": 9}], lossy
    )
    assert not lossy.passed
    assert lossy.counts[STORE_WRITES_LOST] == 6
    assert "553 LWTs acknowledged" in lossy.examples[STORE_WRITES_LOST][0]


@pytest.mark.unit
def test_an_injectors_outage_waits_are_counted_apart_for_its_steps_and_its_starts(
    tmp_path: Path,
) -> None:
    first, second = tmp_path / "injector-1.log", tmp_path / "injector-2.log"
    first.write_text(
        "2026-12-02 07:35:23,647 millstream.engine.outages: injector 'p_injector' process "
        "'1a2b': waiting for Kafka (0 s so far): KafkaException: _TRANSPORT\n"
        "2026-12-02 07:35:24,155 millstream.engine.outages: batch 3: waiting for Kafka\n"
    )
    second.write_text(
        "2026-12-02 07:35:23,647 millstream.engine.outages: injector 'p_injector' starting: "
        "waiting for Cassandra (0 s so far): ServiceOutageError: Cassandra at ...\n" * 2
    )
    assert injector_outage_waits([first, second]) == 1
    assert injector_outage_waits([first, second, tmp_path / "none.log"], starting=True) == 2


@pytest.mark.integration
def test_a_plain_read_committed_reader_counts_a_message_sent_twice(
    services: MillstreamConfig, kafka_topic: Callable[..., str]
) -> None:
    """Read as any Kafka application reads: a message sent twice is one duplicate; an
    aborted transaction's messages are never read; a partition that ends in a transaction's
    commit marker (which no consumer receives) is still read to its end."""
    topic, other = kafka_topic(partitions=2), kafka_topic()
    plain = kafka_connector.producer(services)
    for value in (b"same", b"same", b"different"):
        plain.produce(topic, key=b"k", value=value, partition=0)
    plain.produce(other, key=b"k", value=b"same")
    assert plain.flush(30) == 0
    transactional = Producer(
        {
            **kafka_connector.client_settings(services),
            "transactional.id": f"proving-test-{uuid.uuid4().hex}",
        }
    )
    transactional.init_transactions(30)
    transactional.begin_transaction()
    for _ in range(2):
        transactional.produce(topic, key=b"k", value=b"aborted", partition=1)
    transactional.abort_transaction(30)
    transactional.begin_transaction()
    transactional.produce(topic, key=b"k", value=b"committed", partition=1)
    transactional.commit_transaction(30)

    messages = read_plain(services, [topic, other], timeout=30)
    assert sorted(messages) == sorted(
        [
            (topic, b"k", b"same"),
            (topic, b"k", b"same"),
            (topic, b"k", b"different"),
            (topic, b"k", b"committed"),
            (other, b"k", b"same"),
        ]
    )
    assert plain_duplicates(messages) == {topic: 1}


@pytest.mark.integration
def test_the_checks_read_outputs_once_no_transaction_is_open_on_them(
    services: MillstreamConfig, kafka_topic: Callable[..., str]
) -> None:
    """What a transaction left open hides (it and what others committed after it) is read
    once it ends; one still open after the limit is reported, with where it is."""
    topic = kafka_topic(partitions=2)
    dying = kafka_connector.producer(
        services, **{"transactional.id": f"proving-open-{uuid.uuid4().hex}"}
    )
    dying.init_transactions(30)
    dying.begin_transaction()
    dying.produce(topic, value=b"open", partition=1)
    assert dying.flush(30) == 0
    plain = kafka_connector.producer(services)
    plain.produce(topic, value=b"committed after it", partition=1)
    assert plain.flush(30) == 0

    assert open_transactions(services, [topic], limit=1.0) == {(topic, 1): (0, 2)}
    ends = threading.Timer(2.0, dying.commit_transaction, args=(30,))
    ends.start()
    try:
        started = time.monotonic()
        assert open_transactions(services, [topic], limit=60.0, poll=0.1) == {}
        assert time.monotonic() - started >= 1.5, "it did not wait for the transaction"
    finally:
        ends.join()
    values = [v for _, _, v in read_plain(services, [topic], timeout=30)]
    assert sorted(v for v in values if v is not None) == [
        b"committed after it",
        b"open",
    ]
