"""Session-scoped real services and per-test factories for topics and keyspaces.

The local stack comes up once per session (reusing services that already run
under the configured home) and whatever this session started is stopped at the
end. Set ``MILLSTREAM_EXTERNAL_SERVICES=1`` to test against the Kafka and
Cassandra named by the configuration instead of starting local ones.

Under pytest-xdist (``scripts/test`` runs two workers) the workers share one
stack: the first that needs it starts it, under a file lock, and the controller,
which outlives the workers, stops what they started (:class:`SharedStack`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from millstream.connectors import cassandra as cassandra_connector
from millstream.connectors import kafka as kafka_connector
from millstream.engine.config import MillstreamConfig, load_config
from tests.jvm_options import SHORT_LIVED_JVM
from tests.store_tables import StoreTable
from tests.watermark_topics import delete_watermark_topics

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


def _running(stack: LocalStack) -> set[str]:
    return {status.name for status in stack.status() if status.pid is not None}


def _stack_up(stack: LocalStack, progress: Callable[[str], None]) -> None:
    started = time.monotonic()
    stack.up()
    progress(f"up in {time.monotonic() - started:.0f}s")


def _restore(stack: LocalStack, already_running: set[str]) -> None:
    """Stop what ran not before, bring back what ran before and a test left dead."""
    if not already_running:
        stack.down()  # all nodes of a backend at once (see LocalStack.down)
        return
    for service in stack.services:
        if service.name not in already_running:
            service.down()
        elif service.process.running_pid() is None:
            service.up()


@contextmanager
def running_stack(
    pytestconfig: pytest.Config, stack: LocalStack, progress: Callable[[str], None]
) -> Iterator[None]:
    """``stack`` up (reusing services that already run), its progress shown live (a first
    run fetches ~200 MB). At the end, what this started is stopped, also when ``up`` failed
    half way, and a service that ran before and a test left dead is brought back."""
    already_running = _running(stack)
    capture = pytestconfig.pluginmanager.getplugin("capturemanager")
    try:
        with capture.global_and_fixture_disabled():
            _stack_up(stack, progress)
        yield
    finally:
        with capture.global_and_fixture_disabled():
            _restore(stack, already_running)


class SharedStack:
    """The single-node stack shared by the workers of one pytest-xdist run.

    The controller makes a directory for the run before it starts the workers, which find
    it through ``MILLSTREAM_TEST_SHARED_DIR``. A worker's first :meth:`up` takes the lock
    and brings the stack up (the other worker, waiting on the lock, finds it running), and
    writes down which services ran before it. The controller's :meth:`restore`, once every
    worker has finished, stops the others and brings back a service that ran before and a
    test left dead, as :func:`running_stack` does for a run without workers.
    """

    VARIABLE = "MILLSTREAM_TEST_SHARED_DIR"

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._ran_before = directory / "ran-before"

    @classmethod
    def create(cls) -> SharedStack:
        shared = cls(Path(tempfile.mkdtemp(prefix="millstream-tests-")))
        os.environ[cls.VARIABLE] = str(shared.directory)
        return shared

    @classmethod
    def of_this_worker(cls) -> SharedStack | None:
        directory = os.environ.get(cls.VARIABLE)
        return cls(Path(directory)) if directory else None

    def up(self, stack: LocalStack, progress: Callable[[str], None]) -> None:
        with (self.directory / "lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released as the file closes
            if not self._ran_before.exists():
                self._ran_before.write_text("\n".join(sorted(_running(stack))))
            _stack_up(stack, progress)

    def restore(self, stack: LocalStack) -> None:
        if self._ran_before.exists():
            _restore(stack, set(self._ran_before.read_text().split()))
        shutil.rmtree(self.directory, ignore_errors=True)


# How many machine locks this worker holds (see _machine_lock): a stack started while it
# holds one must not wait for another.
_machine_locks_held = 0


@contextmanager
def _machine_lock(directory: Path, exclusive: bool) -> Iterator[None]:
    """The machine shared (``exclusive=False``) with the other worker's tests, or had alone.

    A readers-writer lock of two ``flock`` files: every test holds ``machine`` shared, and an
    exclusive module holds it exclusively. The ``turnstile``, held by a module waiting for the
    machine (and as long as it has it), stops tests of the other worker from starting
    meanwhile, so that the module gets its turn as soon as the test running ends.
    """
    with (
        (directory / "turnstile").open("w") as turnstile,
        (directory / "machine").open("w") as machine,
    ):
        global _machine_locks_held
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        if exclusive:
            fcntl.flock(machine, fcntl.LOCK_EX)
        else:
            fcntl.flock(machine, fcntl.LOCK_SH)
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        _machine_locks_held += 1
        try:
            yield  # both released as the files close
        finally:
            _machine_locks_held -= 1


@pytest.fixture(scope="module", autouse=True)
def _machine_to_itself(request: pytest.FixtureRequest) -> Iterator[None]:
    """Under two workers, a module marked ``exclusive`` runs, fixtures included, while no
    test of the other worker does."""
    shared = SharedStack.of_this_worker()
    if shared is None or request.node.get_closest_marker("exclusive") is None:
        yield
        return
    with _machine_lock(shared.directory, exclusive=True):
        yield


@pytest.fixture(autouse=True)
def _machine_shared(request: pytest.FixtureRequest) -> Iterator[None]:
    """Under two workers, every other integration test waits while an exclusive module runs
    (a test without services goes on: it loads one core for a moment)."""
    shared = SharedStack.of_this_worker()
    node = request.node
    if (
        shared is None
        or node.get_closest_marker("exclusive") is not None
        or node.get_closest_marker("integration") is None
    ):
        yield
        return
    with _machine_lock(shared.directory, exclusive=False):
        yield


def _file(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A worker writes down, for the controller's scheduler (which sees test ids only, no
    markers), the files of the modules marked ``exclusive`` (those asking for a warm stack
    last) and the files without an integration test."""
    # A test of the services must say so: under two workers, one that does not goes on while
    # an exclusive module has the machine (and may be killing a service).
    unmarked = [
        item.nodeid
        for item in items
        if {"services", "start_stack"} & set(getattr(item, "fixturenames", ()))
        and item.get_closest_marker("integration") is None
    ]
    if unmarked:
        raise pytest.UsageError(
            "tests that use the services are not marked integration: " + ", ".join(unmarked)
        )
    shared = SharedStack.of_this_worker()
    if shared is None or not hasattr(config, "workerinput"):
        return
    exclusive: dict[str, int] = {}
    integration: set[str] = set()
    for item in items:
        if (marker := item.get_closest_marker("exclusive")) is not None:
            exclusive[_file(item)] = int(bool(marker.kwargs.get("warm_stack")))
        if item.get_closest_marker("integration") is not None:
            integration.add(_file(item))
    unit = sorted({_file(item) for item in items} - integration)
    worker = config.workerinput["workerid"]
    writing = shared.directory / f"writing-files.{worker}"
    writing.write_text(json.dumps({"exclusive": exclusive, "unit": unit}))
    writing.rename(shared.directory / f"files.{worker}")  # whole or not at all


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile``, with the exclusive modules made one unit handed out first, and the
    files without an integration test next.

    A module that has the machine to itself first waits for the test the other worker is
    running to end, and the other worker's integration tests wait until the module ends
    (:func:`_machine_to_itself`). Run one after another by one worker, the modules wait once;
    handed out first, they run while the other worker gets through the tests that need no
    service (which need no lock either), and they leave the end of the run to tests that
    share the machine. A module marked ``exclusive(warm_stack=True)`` runs after the others,
    on a stack they have warmed (the proving ground's CI tier takes a fifth longer on a
    stack just started).

    Tried and not kept (2026-12-03): only the proving ground exclusive, the replicated
    stack's module and the Zeitgeist slice beside the other worker's integration tests. The
    run took longer (1,588 against 1,546 s of pytest): two workers' integration tests fill
    both cores, and the proving ground's tier, the Zeitgeist slice and the others' tests
    each took a third to four fifths longer beside them.
    """
    shared = config.stash.get(_shared_stack, None)
    if shared is None or config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    directory = shared.directory

    class ExclusiveModulesFirst(LoadFileScheduling):  # type: ignore[misc]  # xdist is untyped
        UNIT = "exclusive modules"
        _files: dict[str, Any] | None = None
        _ordered = False

        def _written(self) -> dict[str, Any]:
            # Read once the workers' collections are in (the scheduler splits no sooner).
            if self._files is None:
                self._files = {"exclusive": {}, "unit": set()}
                for written in directory.glob("files.gw*"):
                    files = json.loads(written.read_text())
                    self._files["exclusive"].update(files["exclusive"])
                    self._files["unit"].update(files["unit"])
            return self._files

        def _split_scope(self, nodeid: str) -> str:
            path = super()._split_scope(nodeid)
            return self.UNIT if path in self._written()["exclusive"] else path

        def _assign_work_unit(self, node: Any) -> None:
            if not self._ordered:
                self._ordered = True
                self._order()
            super()._assign_work_unit(node)

        def _order(self) -> None:
            queue = self.workqueue
            for scope in reversed([s for s in queue if s in self._written()["unit"]]):
                queue.move_to_end(scope, last=False)  # after the exclusive unit, below
            if self.UNIT in queue:
                warm_last = self._written()["exclusive"]
                tests = queue[self.UNIT]
                order = sorted(tests, key=lambda nodeid: warm_last[nodeid.split("::", 1)[0]])
                queue[self.UNIT] = {nodeid: tests[nodeid] for nodeid in order}
                queue.move_to_end(self.UNIT, last=False)

    return ExclusiveModulesFirst(config, log)


def _xdist_controller(config: pytest.Config) -> bool:
    """Whether this process hands the tests to pytest-xdist workers (and runs none)."""
    workers = config.getoption("numprocesses", default=None)
    return bool(workers) and not hasattr(config, "workerinput")


_shared_stack = pytest.StashKey[SharedStack]()
_driver_scratch = pytest.StashKey[Path]()


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault("SPARK_SUBMIT_OPTS", SHORT_LIVED_JVM)  # the workers inherit it
    if "SPARK_LOCAL_DIRS" not in os.environ:
        # The Spark drivers of the session (in its processes and in those its tests start and
        # kill -9) keep their temporary files here, not in /tmp, and the session removes them.
        scratch = Path(tempfile.mkdtemp(prefix="millstream-tests-"))
        os.environ["SPARK_LOCAL_DIRS"] = str(scratch)
        os.environ["SPARK_SUBMIT_OPTS"] += f" -Djava.io.tmpdir={scratch}"
        config.stash[_driver_scratch] = scratch
    if _xdist_controller(config) and os.environ.get("MILLSTREAM_EXTERNAL_SERVICES") != "1":
        config.stash[_shared_stack] = SharedStack.create()


@pytest.hookimpl(trylast=True)  # after pytest-xdist's own, which waits for the workers
def pytest_sessionfinish(session: pytest.Session) -> None:
    shared = session.config.stash.get(_shared_stack, None)
    if shared is not None:
        from millstream.devtools.local.stack import LocalStack

        shared.restore(LocalStack(load_config(), _progress))
    scratch = session.config.stash.get(_driver_scratch, None)
    if scratch is not None:
        shutil.rmtree(scratch, onerror=_gone_already)


def _gone_already(function: Callable[..., Any], path: str, error: Any) -> None:
    """Let :func:`shutil.rmtree` pass over files a JVM deleted as it exited meanwhile
    (``error`` is ``sys.exc_info()``; Python 3.11 has no ``onexc``)."""
    if not isinstance(error[1], FileNotFoundError):
        raise error[1]


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
            delete_watermark_topics(config)
            return
        from millstream.devtools.local.stack import LocalStack

        stack = LocalStack(config, _progress)
        shared = SharedStack.of_this_worker()
        if shared is not None:
            capture = pytestconfig.pluginmanager.getplugin("capturemanager")
            # Started while an exclusive module of the other worker runs, the stack's JVMs
            # would take the cores from its faults and timings (the replicated stack's
            # proving ground): it waits for the machine, unless this worker holds it already
            # (a fixture asking for the services in the middle of a test).
            waiting = (
                contextlib.nullcontext()
                if _machine_locks_held
                else _machine_lock(shared.directory, exclusive=False)
            )
            with waiting, capture.global_and_fixture_disabled():
                shared.up(stack, _progress)
            yield config
            delete_watermark_topics(config)
            return
        with running_stack(pytestconfig, stack, _progress):
            yield config
            delete_watermark_topics(config)


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
        created.append(_test_keyspace(services, cassandra))
        return created[-1]

    yield make
    for name in created:
        _drop_test_keyspace(services, cassandra, name)


def _test_keyspace(services: MillstreamConfig, cassandra: Session) -> str:
    """A unique keyspace of the configured replication, made now."""
    name = unique_name("test")
    cassandra_connector.create_keyspace(cassandra, name, services.cassandra_replication)
    return name


def _drop_test_keyspace(services: MillstreamConfig, cassandra: Session, name: str) -> None:
    """Drop a keyspace of :func:`_test_keyspace`, and the transaction markers named after it."""
    cassandra_connector.drop_keyspace(cassandra, name)
    kafka_connector.delete_transaction_markers(services, name)


@pytest.fixture(scope="module")
def store_keyspace(services: MillstreamConfig, cassandra: Session) -> Iterator[str]:
    """A keyspace the module's tests make their interval tables in (:func:`store_table`),
    dropped after the module.

    A table of its own isolates a test's store as a keyspace of its own does (the fences
    table's rows are per interval table), at one schema change instead of four: each change
    flushes and compacts Cassandra's schema tables, about a third of a second of the node's
    CPU, and a keyspace a test made and dropped cost it two and a half seconds.
    """
    from millstream.engine.stores.cassandra.schema import execute_schema_change, fences_cql

    name = _test_keyspace(services, cassandra)
    try:
        execute_schema_change(cassandra, fences_cql(name))
        yield name
    finally:
        _drop_test_keyspace(services, cassandra, name)


@pytest.fixture
def store_table(cassandra: Session, store_keyspace: str) -> StoreTable:
    """An interval table of the store for this test alone, in the module's keyspace."""
    from millstream.engine.stores.cassandra.schema import create_schema

    table = StoreTable(store_keyspace, unique_name("intervals"))
    create_schema(cassandra, table.keyspace, table.name)
    return table


@pytest.fixture(scope="session")
def spark(services: MillstreamConfig) -> Iterator[SparkSession]:
    from millstream.spark.session import spark_session

    session = spark_session(services, app_name="millstream-tests", progress=_progress)
    try:
        yield session
    finally:
        session.stop()
