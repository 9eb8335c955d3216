"""Factory fixtures for the engine tests: records, clocks, stores, sinks and workers.

Test modules import the helper types from here for annotations only (under
``TYPE_CHECKING``); at run time everything comes through the fixtures.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import pytest

from millstream.engine.clock import ManualClock
from millstream.engine.codecs import JsonCodec
from millstream.engine.computation import Computation
from millstream.engine.protocol import IntervalWorker
from millstream.engine.records import Record, injector_record_id
from millstream.engine.store import IntervalStore
from millstream.engine.stores.memory.store import MemoryIntervalStore
from millstream.engine.testing import TestingSink
from millstream.engine.topology import ComputationOptions, ComputationSpec, InputStream

JSON = JsonCodec()


@dataclass
class RecordFactory:
    """``make(key, value, timestamp, n)``: record IDs are unique unless ``n`` repeats."""

    numbers: itertools.count[int] = field(default_factory=lambda: itertools.count(1_000_000))

    def __call__(
        self, key: str, value: bytes = b"", timestamp: int = 1, n: int | None = None
    ) -> Record:
        offset = next(self.numbers) if n is None else n
        return Record(key, value, timestamp, injector_record_id("test", 0, offset))


@dataclass
class Workers:
    """Makes specs and workers of one computation sharing a store, a sink and a clock."""

    store: MemoryIntervalStore
    sink: TestingSink
    clock: ManualClock

    def spec(
        self,
        computation: Computation,
        outputs: Iterable[str] = ("out",),
        options: ComputationOptions | None = None,
        name: str = "comp",
    ) -> ComputationSpec:
        return ComputationSpec(
            name=name,
            computation=computation,
            inputs=(InputStream("in"),),
            outputs=tuple(outputs),
            options=options or ComputationOptions(key_intervals=1),
        )

    def worker(self, spec: ComputationSpec, interval: int = 0) -> IntervalWorker:
        return IntervalWorker(spec, interval, store=self.store, sink=self.sink, clock=self.clock)

    def state(self, spec: ComputationSpec) -> dict[str, object]:
        """Committed state per key, decoded as JSON."""
        return {key: JSON.decode(value) for key, value in self.store.states(spec.name).items()}


WorkersFactory = Callable[..., Workers]


@pytest.fixture
def make_record() -> RecordFactory:
    return RecordFactory()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(1_000)


@pytest.fixture
def store(clock: ManualClock) -> MemoryIntervalStore:
    return MemoryIntervalStore(clock)


@pytest.fixture
def sink() -> TestingSink:
    return TestingSink()


@pytest.fixture
def workers(store: MemoryIntervalStore, sink: TestingSink, clock: ManualClock) -> Workers:
    return Workers(store, sink, clock)


@pytest.fixture
def make_workers(
    store: MemoryIntervalStore, sink: TestingSink, clock: ManualClock
) -> WorkersFactory:
    """``make_workers(store=None, sink=None, max_batch_bytes=None)``: workers on other parts."""

    def make(
        store_: MemoryIntervalStore | None = None,
        sink_: TestingSink | None = None,
        *,
        max_batch_bytes: int | None = None,
    ) -> Workers:
        if max_batch_bytes is not None:
            store_ = MemoryIntervalStore(clock, max_batch_bytes=max_batch_bytes)
        return Workers(store_ or store, sink_ or sink, clock)

    return make


START = 1_000_000  # the backends' manual clock


@dataclass
class Backend:
    """A backend under test: ``store(max_batch_bytes)`` makes a store on ``clock``."""

    name: str
    clock: ManualClock
    make: Callable[[int | None], IntervalStore]

    def store(self, max_batch_bytes: int | None = None) -> IntervalStore:
        return self.make(max_batch_bytes)


@pytest.fixture(
    params=[
        pytest.param("memory", marks=pytest.mark.unit),
        pytest.param("cassandra", marks=pytest.mark.integration),
    ]
)
def backend(request: pytest.FixtureRequest) -> Backend:
    clock = ManualClock(START)
    if request.param == "memory":

        def memory(limit: int | None) -> IntervalStore:
            if limit is None:
                return MemoryIntervalStore(clock)
            return MemoryIntervalStore(clock, max_batch_bytes=limit)

        return Backend("memory", clock, memory)

    # Only the Cassandra case needs the services, so unit runs never start them.
    from millstream.engine.stores.cassandra import CassandraIntervalStore

    session = request.getfixturevalue("cassandra")
    table = request.getfixturevalue("store_table")

    def cassandra(limit: int | None) -> IntervalStore:
        if limit is None:
            return CassandraIntervalStore(session, table.keyspace, clock, table=table.name)
        return CassandraIntervalStore(
            session, table.keyspace, clock, table=table.name, max_batch_bytes=limit
        )

    return Backend("cassandra", clock, cassandra)
