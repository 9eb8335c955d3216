"""An injector process waits out Kafka and Cassandra outages: nothing lost, nothing repeated,
and a clear error naming the service once the outage outlasts ``outage_timeout``."""

from __future__ import annotations

from collections.abc import Callable, Sequence, Set
from typing import Any

import pytest
from cassandra.cluster import NoHostAvailable
from confluent_kafka import KafkaError, KafkaException

from millstream.engine.errors import ServiceOutageError
from millstream.engine.productions import Production
from millstream.engine.sequencer import Lease
from millstream.engine.stores.memory.store import FaultPoint, UnknownOutcome
from millstream.injectors import InjectorOptions, InjectorProcess
from millstream.injectors.checkpoint import CheckpointStore
from millstream.injectors.testing import InjectorHarness, injector_harness
from tests.injectors.test_process import SECOND, Numbers, values

pytestmark = pytest.mark.unit


def kafka_down() -> KafkaException:
    return KafkaException(KafkaError(KafkaError._ALL_BROKERS_DOWN))


def cassandra_down() -> NoHostAvailable:
    return NoHostAvailable("Unable to connect to any servers", {"127.0.0.1:9042": "refused"})


def failing(
    times: int, error: Callable[[], Exception], then: Callable[..., object]
) -> Callable[..., object]:
    """``then``, after raising ``error()`` on the first ``times`` calls."""
    calls = [0]

    def call(*args: object, **kwargs: object) -> object:
        calls[0] += 1
        if calls[0] <= times:
            raise error()
        return then(*args, **kwargs)

    return call


def waiting_process(
    harness: InjectorHarness, options: InjectorOptions | None = None
) -> tuple[InjectorProcess, list[float]]:
    """A process on the harness whose outage waits advance the harness's clock."""
    waited: list[float] = []

    def wait(seconds: float) -> None:
        waited.append(seconds)
        harness.clock.advance(int(seconds * SECOND))

    return harness.new_process(Numbers(per_poll=3), options, wait=wait), waited


def stored_position(harness: InjectorHarness) -> object:
    return CheckpointStore(harness.store, harness.name, "0").acquire().position


def checkpoint_commits(harness: InjectorHarness, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the checkpoint writes that reached the store."""
    commits: list[int] = []
    commit = harness.store.commit

    def counted(*args: Any, **kwargs: Any) -> object:
        result = commit(*args, **kwargs)
        commits.append(1)
        return result

    monkeypatch.setattr(harness.store, "commit", counted)
    return commits


def test_a_producer_failing_while_kafka_is_down_is_waited_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    harness = injector_harness("nums", Numbers(per_poll=3))
    process, waited = waiting_process(harness)
    process.start()
    commits = checkpoint_commits(harness, monkeypatch)
    send = harness.sink.send
    monkeypatch.setattr(harness.sink, "send", failing(4, kafka_down, send))
    process.step()
    assert len(waited) == 4
    # Each record sent once (the failed sends took nothing), checkpointed once after.
    assert [values([p.record]) for p in harness.sink.sent] == [[0], [1], [2]]
    assert sorted(values(harness.records("numbers"))) == [0, 1, 2]
    assert len(commits) == 1
    assert process.stats.checkpoints == 1
    assert stored_position(harness) == {"next": 3}


def test_kafka_down_longer_than_the_outage_timeout_stops_naming_kafka(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    harness = injector_harness("nums", Numbers(per_poll=3))
    process, waited = waiting_process(harness, InjectorOptions(outage_timeout=20.0))
    process.start()

    def down(_productions: Sequence[Production], _timeout: float) -> Set[bytes]:
        raise kafka_down()

    monkeypatch.setattr(harness.sink, "send", down)
    with pytest.raises(ServiceOutageError, match=r"Kafka unreachable for 2[0-9] s") as raised:
        process.step()
    assert "outage timeout 20 s" in str(raised.value)
    assert sum(waited) >= 20.0
    assert process.stats.checkpoints == 0
    assert stored_position(harness) is None


def test_a_checkpoint_while_cassandra_is_down_is_waited_out() -> None:
    harness = injector_harness("nums", Numbers(per_poll=3))
    process, waited = waiting_process(harness)
    process.start()
    for _ in range(3):
        harness.store.inject(
            FaultPoint.BEFORE_COMMIT, lambda: (_ for _ in ()).throw(cassandra_down())
        )
    process.step()
    assert len(waited) == 3
    assert process.stats.checkpoints == 1
    assert stored_position(harness) == {"next": 3}


def test_unknown_outcomes_of_a_checkpoint_are_resolved_however_many_in_a_row(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    harness = injector_harness("nums", Numbers(per_poll=3))
    process, waited = waiting_process(harness)
    process.start()
    # More than the five the process used to allow before it stopped.
    for _ in range(7):
        harness.store.inject_unknown_outcome(UnknownOutcome.NOT_APPLIED)
    harness.store.inject_unknown_outcome(UnknownOutcome.APPLIED)
    # The resolution itself fails while Cassandra is away, and is asked again, not skipped.
    resolve = harness.store.was_applied
    asked: list[bytes] = []

    def was_applied(lease: Lease, marker: bytes) -> bool:
        asked.append(marker)
        return resolve(lease, marker)

    monkeypatch.setattr(harness.store, "was_applied", failing(2, cassandra_down, was_applied))
    process.step()
    assert len(waited) == 10
    assert len(asked) == 8
    assert len(set(asked)) == 8
    assert process.stats.checkpoints == 1
    assert stored_position(harness) == {"next": 3}
    assert sorted(values(harness.records("numbers"))) == [0, 1, 2]
    assert len(harness.sink.sent) == 3


def test_cassandra_down_longer_than_the_outage_timeout_stops_naming_cassandra() -> None:
    harness = injector_harness("nums", Numbers(per_poll=3))
    process, _waited = waiting_process(harness, InjectorOptions(outage_timeout=20.0))
    process.start()
    for _ in range(100):
        harness.store.inject(
            FaultPoint.BEFORE_COMMIT, lambda: (_ for _ in ()).throw(cassandra_down())
        )
    with pytest.raises(ServiceOutageError, match=r"Cassandra unreachable for 2[0-9] s"):
        process.step()
    assert stored_position(harness) is None


def test_a_watermark_report_while_kafka_is_down_is_waited_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    harness = injector_harness("nums", Numbers(per_poll=3))
    process, waited = waiting_process(harness)
    process.start()
    reports = len(harness.reports())
    channel = process.watermarks
    monkeypatch.setattr(channel, "publish", failing(3, kafka_down, channel.publish))
    process.step()
    assert len(waited) == 3
    assert len(harness.reports()) == reports + 1
    assert harness.reports()[-1].watermark == 3 * SECOND


def test_the_report_a_starting_injector_makes_is_waited_out_while_kafka_does_not_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Restarted while a broker is down (a supervisor's restart): its first report, which may
    create the streams' wake topics, times out as an admin request does, and is retried."""
    harness = injector_harness("nums", Numbers(per_poll=3))
    process, waited = waiting_process(harness)
    channel = process.watermarks
    reports = len(harness.reports())

    def admin_timeout() -> KafkaException:
        return KafkaException(
            KafkaError(KafkaError._TIMED_OUT, "Kafka did not answer an admin request within 30 s")
        )

    monkeypatch.setattr(channel, "publish", failing(2, admin_timeout, channel.publish))
    process.start()
    assert len(waited) == 2
    assert len(harness.reports()) == reports + 1
