"""Telling an outage from a failure, and waiting one out for a bounded time."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from millstream.engine.errors import FencedError, ServiceOutageError, UnknownOutcomeError
from millstream.engine.outages import Outage, is_outage

pytestmark = pytest.mark.unit


class NoHostAvailable(Exception):  # noqa: N818  (the Cassandra driver's name)
    """Stands in for cassandra.cluster.NoHostAvailable: matched by name."""


@pytest.mark.parametrize(
    "error",
    [
        NoHostAvailable("Unable to connect to any servers"),
        UnknownOutcomeError("commit timed out", marker=b"m"),
        TimeoutError("could not read the watermark topic within 30 s"),
        RuntimeError('KafkaError{code=_TRANSPORT,val=-195,str="Connection refused"}'),
        # A partition between leaders as a broker of a cluster comes back (ListOffsets).
        RuntimeError('KafkaError{code=OFFSET_NOT_AVAILABLE,val=78,str="Broker: Leader..."}'),
        # A killed broker's handle destroyed under a request (the CI's 3-broker cluster run).
        RuntimeError(
            'cimpl.KafkaException: KafkaError{code=_DESTROY_BROKER,val=-137,str="Failed to get'
            ' watermark offsets: Local: Broker handle destroyed without termination"}'
        ),
        # A Python worker's error as the driver sees it: text inside a Py4J error.
        RuntimeError(
            "PythonException: An exception was thrown from the Python worker: Traceback ...\n"
            "cassandra.cluster.NoHostAvailable: ('Unable to complete the operation', {})"
        ),
    ],
)
def test_unreachable_services_are_outages(error: Exception) -> None:
    assert is_outage(error)


@pytest.mark.parametrize(
    "error",
    [
        FencedError("interval 3 of 'tally' was acquired by another worker"),
        # A fenced zombie stays fenced even when its text also names a timeout.
        RuntimeError("FencedError: interval 3 ... after OperationTimedOut"),
        ValueError("user code failed"),
        RuntimeError("Python worker exited unexpectedly (crashed)"),
    ],
)
def test_failures_that_retrying_cannot_mend_are_not_outages(error: Exception) -> None:
    assert not is_outage(error)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_an_outage_is_waited_out_with_growing_pauses_until_its_timeout() -> None:
    clock = Clock()
    outage = Outage("batch 7", 20.0, sleep=clock.sleep, monotonic=lambda: clock.now)

    def wait_forever() -> None:
        while True:
            outage.wait(TimeoutError("down"))

    with pytest.raises(ServiceOutageError, match=r"batch 7: .*unreachable for 2\d s.*down"):
        wait_forever()
    assert clock.slept[:5] == [0.5, 1.0, 2.0, 4.0, 5.0]
    assert max(clock.slept) == 5.0
    assert outage.waits == len(clock.slept)


def test_retry_returns_once_the_service_answers_and_starts_afresh_after() -> None:
    clock = Clock()
    outage = Outage("report", 60.0, sleep=clock.sleep, monotonic=lambda: clock.now)
    answers: Iterator[str | Exception] = iter(
        [TimeoutError("down"), TimeoutError("down"), "published"]
    )

    def publish() -> str:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert outage.retry(publish) == "published"
    assert clock.slept == [0.5, 1.0]
    outage.wait(TimeoutError("down again"))  # a new stretch: the pause starts small again
    assert clock.slept[-1] == 0.5


def reconnecting(clock: Clock, reconnected: list[int]) -> Outage:
    """An outage on ``clock`` (reconnecting after 3 waits or 20 s) that notes in
    ``reconnected`` the number of waits at each reconnect."""
    outage = Outage(
        "batch",
        600.0,
        sleep=clock.sleep,
        monotonic=lambda: clock.now,
        reconnect=lambda: reconnected.append(outage.waits),
        reconnect_after=20.0,
    )
    return outage


def test_a_long_outage_gets_new_clients_every_few_waits() -> None:
    clock, reconnected = Clock(), list[int]()
    outage = reconnecting(clock, reconnected)
    for _ in range(7):
        outage.wait(TimeoutError("down"))
    assert reconnected == [3, 6]


def test_attempts_that_fail_slowly_get_new_clients_after_some_seconds() -> None:
    """Each attempt retried a wedged client's metadata request for its 30 s timeout: waiting
    for the third wait would leave the client wedged for a minute and a half."""
    clock = Clock()
    reconnected: list[tuple[int, float]] = []
    outage = Outage(
        "batch",
        600.0,
        sleep=clock.sleep,
        monotonic=lambda: clock.now,
        reconnect=lambda: reconnected.append((outage.waits, clock.now)),
        reconnect_after=20.0,
    )
    outage.wait(TimeoutError("down"))
    assert reconnected == []
    clock.now += 30.0  # the next attempt failed after 30 s
    outage.wait(TimeoutError("down"))
    assert [waits for waits, _ in reconnected] == [2]
    clock.now += 5.0
    outage.wait(TimeoutError("down"))  # the third wait: the count rule
    clock.now += 5.0
    outage.wait(TimeoutError("down"))  # 20 s have not passed since
    assert [waits for waits, _ in reconnected] == [2, 3]


def test_an_attempt_that_spent_long_failing_gets_new_clients_at_its_first_wait() -> None:
    """A batch began as a frozen broker resumed; its wedged client failed the metadata
    request for its whole 30 s: the stretch counts from the attempt's start."""
    clock, reconnected = Clock(), list[int]()
    outage = reconnecting(clock, reconnected)
    outage.attempting()
    clock.now += 30.0
    outage.wait(TimeoutError("Failed to get metadata"))
    assert reconnected == [1]
    outage.over()
    outage.attempting()
    clock.now += 1.0  # fails fast (connection refused): no reconnect for that
    outage.wait(TimeoutError("down"))
    assert reconnected == [1]


def test_retry_lets_other_errors_through_at_once() -> None:
    outage = Outage("batch", 60.0, sleep=lambda _s: pytest.fail("must not wait"))

    def fenced() -> None:
        raise FencedError("taken over")

    with pytest.raises(FencedError):
        outage.retry(fenced)


@pytest.mark.parametrize(
    ("error", "service"),
    [
        (NoHostAvailable("Unable to connect to any servers"), "Cassandra"),
        (UnknownOutcomeError("commit timed out", marker=b"m"), "Cassandra"),
        (RuntimeError('KafkaError{code=_TRANSPORT,val=-195,str="Connection refused"}'), "Kafka"),
        (RuntimeError("org.apache.kafka.common.errors.TimeoutException: metadata"), "Kafka"),
        (TimeoutError("no answer"), "Kafka or Cassandra"),
    ],
)
def test_an_outage_names_the_service_it_waits_for(
    error: Exception, service: str, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    outage = Outage("batch 7", 60.0, sleep=clock.sleep, monotonic=lambda: clock.now)

    def wait_forever() -> None:
        while True:
            outage.wait(error)

    caplog.set_level("WARNING", logger="millstream.engine.outages")
    with pytest.raises(ServiceOutageError) as failed:
        wait_forever()
    waits = [m for m in caplog.messages if ": waiting for " in m]
    assert waits[0].startswith(f"batch 7: waiting for {service} (0 s so far): ")
    # What to do, once, when the outage has lasted 30 s: not for a timeout or two.
    advised = [m for m in waits if "`millstream up` starts it" in m]
    assert len(advised) == 1
    assert advised[0].startswith(f"batch 7: waiting for {service} (3")
    assert "so far; if it stopped, `millstream status` shows the local stack" in advised[0]
    assert f"{service} unreachable for " in str(failed.value)
    assert "`millstream up` starts it" in str(failed.value)
