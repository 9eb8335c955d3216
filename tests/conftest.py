"""Session-scoped real services and per-test factories for topics and keyspaces.

The local stack comes up once per session (reusing services that already run
under the configured home) and whatever this session started is stopped at the
end. Set ``MILLSTREAM_EXTERNAL_SERVICES=1`` to test against the Kafka and
Cassandra named by the configuration instead of starting local ones.
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING

import pytest

from millstream.connectors import cassandra as cassandra_connector
from millstream.connectors import kafka as kafka_connector
from millstream.engine.config import MillstreamConfig, load_config

if TYPE_CHECKING:
    from cassandra.cluster import Session
    from pyspark.sql import SparkSession

    from millstream.devtools.local.stack import LocalStack


def _progress(message: str) -> None:
    print(f"[services {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def unique_name(prefix: str) -> str:
    """A name no other test (or earlier run) uses; valid as topic and keyspace name."""
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


@pytest.fixture
def unique() -> Callable[[str], str]:
    """Factory of unique names (for topics, keyspaces, checkpoints) for this test."""
    return unique_name


@contextmanager
def running_stack(
    pytestconfig: pytest.Config, stack: LocalStack, progress: Callable[[str], None]
) -> Iterator[None]:
    """``stack`` up (reusing services that already run), its progress shown live (a first
    run fetches ~200 MB). At the end, what this started is stopped, also when ``up`` failed
    half way, and a service that ran before and a test left dead is brought back."""
    already_running = {status.name for status in stack.status() if status.pid is not None}
    capture = pytestconfig.pluginmanager.getplugin("capturemanager")
    started = time.monotonic()
    try:
        with capture.global_and_fixture_disabled():
            stack.up()
            progress(f"up in {time.monotonic() - started:.0f}s")
        yield
    finally:
        with capture.global_and_fixture_disabled():
            if not already_running:
                stack.down()  # all nodes of a backend at once (see LocalStack.down)
            else:
                for service in stack.services:
                    if service.name not in already_running:
                        service.down()
                    elif service.process.running_pid() is None:
                        service.up()


@pytest.fixture(scope="session")
def start_stack(
    pytestconfig: pytest.Config,
) -> Callable[[LocalStack, Callable[[str], None]], AbstractContextManager[None]]:
    """:func:`running_stack` for module fixtures of other stacks (replicated, secured)."""
    return lambda stack, progress: running_stack(pytestconfig, stack, progress)


@pytest.fixture(scope="session")
def services(pytestconfig: pytest.Config) -> Iterator[MillstreamConfig]:
    """The endpoints of running Kafka and Cassandra services, started if need be.

    The session gets a watermark topic of its own (also for the processes its tests start,
    through ``MILLSTREAM_KAFKA_WATERMARK_TOPIC``), removed at its end.
    """
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MILLSTREAM_KAFKA_WATERMARK_TOPIC", unique_name("watermarks"))
        config = load_config()
        if os.environ.get("MILLSTREAM_EXTERNAL_SERVICES") == "1":
            yield config
            _delete_session_topics(config)
            return
        from millstream.devtools.local.stack import LocalStack

        with running_stack(pytestconfig, LocalStack(config, _progress), _progress):
            yield config
            _delete_session_topics(config)


def _delete_session_topics(config: MillstreamConfig) -> None:
    """The session's watermark topic, its transaction marker topic and the wake topics."""
    kafka_connector.delete_wake_topics(config)
    kafka_connector.delete_topics(
        config,
        [config.kafka_watermark_topic, kafka_connector.transaction_marker_topic(config)],
    )


@pytest.fixture
def kafka_topic(services: MillstreamConfig) -> Iterator[Callable[..., str]]:
    """Factory: ``kafka_topic(partitions=1, config=None)`` creates a unique topic."""
    created: list[str] = []

    def make(partitions: int = 1, config: dict[str, str] | None = None) -> str:
        name = unique_name("test")
        kafka_connector.create_topics(services, [name], partitions, topic_config=config)
        created.append(name)
        return name

    yield make
    kafka_connector.delete_topics(services, created)


@pytest.fixture(scope="session")
def cassandra(services: MillstreamConfig) -> Iterator[Session]:
    cluster, session = cassandra_connector.connect(services)
    try:
        yield session
    finally:
        cluster.shutdown()


@pytest.fixture
def cassandra_keyspace(
    services: MillstreamConfig, cassandra: Session
) -> Iterator[Callable[[], str]]:
    """Factory: ``cassandra_keyspace()`` creates a unique keyspace, dropped after the test."""
    created: list[str] = []

    def make() -> str:
        name = unique_name("test")
        cassandra_connector.create_keyspace(cassandra, name, services.cassandra_replication)
        created.append(name)
        return name

    yield make
    for name in created:
        cassandra_connector.drop_keyspace(cassandra, name)
        kafka_connector.delete_transaction_markers(services, name)


@pytest.fixture(scope="session")
def spark(services: MillstreamConfig) -> Iterator[SparkSession]:
    from millstream.spark.session import spark_session

    session = spark_session(services, app_name="millstream-tests", progress=_progress)
    try:
        yield session
    finally:
        session.stop()
