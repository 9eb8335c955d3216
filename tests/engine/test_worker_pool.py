"""A process's interval workers (worker_pool.WorkerPool): made once, reused with their cache."""

from __future__ import annotations

import threading

import pytest

from millstream.engine.cache import StateCache
from millstream.engine.clock import ManualClock
from millstream.engine.computation import Computation
from millstream.engine.context import Context
from millstream.engine.layout import IntervalLayout
from millstream.engine.protocol import Delivery
from millstream.engine.records import Record, injector_record_id
from millstream.engine.stores.memory.store import MemoryIntervalStore
from millstream.engine.testing import TestingSink
from millstream.engine.topology import ComputationOptions, Topology
from millstream.engine.worker_pool import WorkerPool

pytestmark = pytest.mark.unit


class Echo(Computation):
    def process_record(self, ctx: Context, record: Record) -> None:
        ctx.produce("out", record.value, record.timestamp)


def test_a_worker_is_made_once_per_run_and_interval_and_follows_the_layout() -> None:
    topology = Topology("t", streams=["in"])
    spec = topology.add_computation(
        "echo", Echo(), inputs=["in"], outputs=["out"], options=ComputationOptions(key_intervals=2)
    )
    clock = ManualClock(1_000)
    cache = StateCache()
    lock = threading.Lock()
    sink = TestingSink()
    pool = WorkerPool(MemoryIntervalStore(clock), sink, clock, cache=cache, user_code=lock)

    first, cached = pool.worker(spec, 0)
    assert not cached
    assert first.layout == IntervalLayout.initial(2)
    assert (first._cache, first._user_code) == (cache, lock)
    again, cached = pool.worker(spec, 0)
    assert cached
    assert again is first
    split = IntervalLayout.initial(2).begin_split(1).finish()
    assert pool.worker(spec, 0, split)[0].layout == split  # told the layout, kept
    assert pool.worker(spec, split.ids[-1], split)[0] is not first
    other_run, cached = pool.worker(spec, 0, run="declared-again")
    assert not cached
    assert other_run is not first
    assert len(pool) == 3

    record = Record("k", b"v", 10, injector_record_id("t", 0, 0))
    interval = split.interval_of("k")
    worker, _ = pool.worker(spec, interval, split)
    assert worker.process([Delivery("k", record)], 0).processed == 1
    assert [p.record.value for p in sink.sent] == [b"v"]
