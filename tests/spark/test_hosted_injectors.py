"""The injectors a running topology hosts on its driver's threads: one failing stops alone,
its error kept; the rest run until stopped."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace

import pytest

from millstream.connectors import kafka as kafka_connector
from millstream.engine.config import MillstreamConfig
from millstream.engine.errors import TopologyError
from millstream.injectors.source import Poll, Position, Source, SourceRecord
from millstream.spark.hosted_injectors import HostedInjectors
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

SECOND = 1_000_000


class Broken(Source):
    """Emits one record, then its next poll raises."""

    def __init__(self, stream: str) -> None:
        self.streams = (stream,)
        self.polled = 0

    def open(self, position: Position | None) -> None:
        pass

    def poll(self, timeout: float) -> Poll:
        self.polled += 1
        if self.polled > 1:
            raise RuntimeError("the source broke")
        record = SourceRecord(self.streams[0], "k", b"v", SECOND, "n", 0)
        return Poll([record], position={"next": 1}, watermark=SECOND)


class Steady(Source):
    """Never ends: an empty poll each ``timeout`` (up to 50 ms); says when it was closed."""

    def __init__(self, stream: str) -> None:
        self.streams = (stream,)
        self.polls = 0
        self.closed = threading.Event()

    def open(self, position: Position | None) -> None:
        pass

    def poll(self, timeout: float) -> Poll:
        self.polls += 1
        self.closed.wait(min(timeout, 0.05))
        return Poll([], position={"polls": self.polls}, watermark=SECOND)

    def close(self) -> None:
        self.closed.set()


@pytest.fixture
def hosted(
    services: MillstreamConfig,
    cassandra_keyspace: Callable[[], str],
) -> Iterator[tuple[HostedInjectors, list[str]]]:
    settings = replace(services.run, keyspace=cassandra_keyspace())
    injectors = HostedInjectors(services, settings)
    names: list[str] = []
    try:
        yield injectors, names
    finally:
        injectors.stop()
        topics = [t for name in names for t in (name, f"{name}.dead-letters")]
        kafka_connector.delete_topics(
            services, sorted(kafka_connector.stream_topic(t) for t in topics)
        )


def test_a_failing_injector_stops_alone_and_its_error_is_kept(
    hosted: tuple[HostedInjectors, list[str]], unique: Callable[[str], str]
) -> None:
    injectors, names = hosted
    broken_name, steady_name = unique("broken"), unique("steady")
    names += [broken_name, steady_name]
    steady = Steady(steady_name)
    injectors.add(steady_name, steady)
    broken = injectors.add(broken_name, Broken(broken_name))

    failure = wait_until("the broken injector's failure", injectors.failure, 120)
    assert isinstance(failure, RuntimeError)
    assert str(failure) == "the source broke"
    assert broken.stats.emitted == 1
    # The other goes on polling.
    polled = steady.polls
    wait_until("the steady injector to poll on", lambda: steady.polls > polled + 2, 60)
    assert not steady.closed.is_set()
    with pytest.raises(TopologyError, match="already runs"):
        injectors.add(steady_name, Steady(steady_name))
    assert set(injectors.processes) == {broken_name, steady_name}

    injectors.stop(timeout=60)
    assert steady.closed.is_set()
    # Stopped, not merely cut off: no thread of theirs polls on (nor holds the tests' exit).
    ours = {f"injector-{broken_name}", f"injector-{steady_name}"}
    assert not [t for t in threading.enumerate() if t.name in ours]
    assert set(injectors.processes) == {broken_name, steady_name}  # stopped ones stay listed


# A driver whose injector's source never returns from poll (nor heeds stop()).
_STUCK_DRIVER = textwrap.dedent(
    """
    import sys, threading
    from dataclasses import replace
    from millstream.engine.config import load_config
    from millstream.injectors.source import Poll, Position, Source
    from millstream.spark.hosted_injectors import HostedInjectors

    class Stuck(Source):
        def __init__(self, stream: str) -> None:
            self.streams = (stream,)
            self.polling = threading.Event()

        def open(self, position: Position | None) -> None:
            pass

        def poll(self, timeout: float) -> Poll:
            self.polling.set()
            threading.Event().wait()
            raise AssertionError("unreachable")

    config = load_config()
    injectors = HostedInjectors(config, replace(config.run, keyspace=sys.argv[1]))
    source = Stuck(sys.argv[2])
    injectors.add(sys.argv[2], source)
    if not source.polling.wait(120):
        sys.exit("the stuck injector never polled")
    injectors.stop(timeout=1)
    print("stopped", flush=True)
    """
)


def test_an_injector_that_ignores_stop_does_not_keep_the_driver_from_exiting(
    services: MillstreamConfig,
    cassandra_keyspace: Callable[[], str],
    unique: Callable[[str], str],
) -> None:
    name = unique("stuck")
    driver = subprocess.Popen(
        [sys.executable, "-c", _STUCK_DRIVER, cassandra_keyspace(), name],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert driver.stdout is not None
        assert driver.stdout.readline() == "stopped\n"  # stop() returned
        # The interpreter exits with the injector's thread still inside poll.
        _, stderr = driver.communicate(timeout=60)
        assert driver.returncode == 0, stderr[-3000:]
        assert f"injector {name!r} did not stop within 1 s" in stderr
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
        kafka_connector.delete_topics(
            services,
            sorted(kafka_connector.stream_topic(t) for t in (name, f"{name}.dead-letters")),
        )
