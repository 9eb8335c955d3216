"""Test a custom injector in-process: the real injector loop over in-memory endpoints.

::

    from millstream.injectors.testing import injector_harness

    harness = injector_harness("numbers", Numbers())
    harness.process.start()
    harness.process.step()
    assert [r.key for r in harness.records("numbers")] == ["0", "1", ...]
    assert harness.reports()[-1].watermark == 10_000_000

The harness's store, sink and watermark topic outlive a process, so a test can "crash" one
(drop it) and start another on the same endpoints (:meth:`InjectorHarness.restart`), or run
two copies to see the older one fenced. With ``metrics=registry`` (a
``prometheus_client.CollectorRegistry``) the current process's Prometheus metrics are
collected into it (:mod:`millstream.injectors.prometheus`), the restarted one's after a
restart.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

from millstream.engine.clock import ManualClock
from millstream.engine.deadletters import DeadLetter, decode_dead_letter
from millstream.engine.records import Record
from millstream.engine.stores.memory.store import MemoryIntervalStore
from millstream.engine.testing import TestingSink
from millstream.engine.watermark_topic import MemoryWatermarkTopic
from millstream.engine.watermarks import (
    ExpectedSet,
    Offsets,
    WatermarkReport,
    latest_expected_set,
)
from millstream.injectors.process import InjectorOptions, InjectorProcess
from millstream.injectors.source import Source

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from millstream.injectors.prometheus import InjectorCollector

__all__ = ["InjectorHarness", "MemoryWatermarkChannel", "injector_harness", "sent_offsets"]


def sent_offsets(sink: TestingSink, streams: Sequence[str]) -> Offsets:
    """The end offsets of ``streams`` as ``sink`` wrote them: one partition each, every copy
    it delivered counted (resends too, as on a Kafka topic)."""
    counts = dict.fromkeys(streams, 0)
    for production in sink.sent:
        if production.stream in counts:
            counts[production.stream] += 1
    return {stream: {0: count} for stream, count in counts.items()}


class MemoryWatermarkChannel(MemoryWatermarkTopic):
    """Deprecated: a :class:`~millstream.engine.watermark_topic.MemoryWatermarkTopic` with
    ``end_offsets=functools.partial(sent_offsets, sink)``; this alias goes in 0.3."""

    def __init__(self, sink: TestingSink) -> None:
        warnings.warn(
            "millstream.injectors.testing.MemoryWatermarkChannel is deprecated: use "
            "millstream.engine.watermark_topic.MemoryWatermarkTopic",
            DeprecationWarning,
            stacklevel=2,
        )
        super().__init__(partial(sent_offsets, sink))
        self.sink = sink


@dataclass
class InjectorHarness:
    """Shared endpoints and the current process; see the module docstring."""

    name: str
    clock: ManualClock
    store: MemoryIntervalStore
    sink: TestingSink
    channel: MemoryWatermarkTopic
    process: InjectorProcess
    retired: list[InjectorProcess] = field(default_factory=list)
    collector: InjectorCollector | None = None

    def new_process(
        self,
        source: Source,
        options: InjectorOptions | None = None,
        wait: Callable[[float], object] | None = None,
    ) -> InjectorProcess:
        """Another process on the same endpoints (the old one stays, e.g. as a zombie)."""
        return InjectorProcess(
            self.name,
            source,
            store=self.store,
            sink=self.sink,
            watermarks=self.channel.reader(),
            clock=self.clock,
            options=options or self.process.options,
            wait=wait,
        )

    def restart(self, source: Source, options: InjectorOptions | None = None) -> InjectorProcess:
        """Replace the current process by a fresh one (as after a crash) and start it."""
        self.retired.append(self.process)
        self.process = self.new_process(source, options)
        if self.collector is not None:
            self.collector.process = self.process
        self.process.start()
        return self.process

    def records(self, stream: str) -> list[Record]:
        """What consumers of ``stream`` see: each record ID once, in first-sent order."""
        return [p.record for p in self.sink.delivered(stream)]

    def dead_letters(self) -> list[DeadLetter]:
        stream = self.process.dead_letter_stream
        return [decode_dead_letter(r.value) for r in self.records(stream)]

    def reports(self) -> list[WatermarkReport]:
        return self.channel.reports()

    def expected_set(self) -> ExpectedSet | None:
        return latest_expected_set(self.channel.messages, self.name)


def injector_harness(
    name: str,
    source: Source,
    options: InjectorOptions | None = None,
    *,
    clock: ManualClock | None = None,
    metrics: CollectorRegistry | None = None,
) -> InjectorHarness:
    """A harness whose process runs ``source`` as injector ``name`` (not started yet); see
    the module docstring for ``metrics``. Without ``options`` the process checkpoints and
    reports after every step (``checkpoint_interval=0``), so a test sees each step's
    effect at once; give options with an interval, and advance ``harness.clock``, to test
    the injector as it runs in production."""
    options = options or InjectorOptions(checkpoint_interval=0)
    clock = clock or ManualClock(1_000_000)
    store = MemoryIntervalStore(clock)
    sink = TestingSink()
    channel = MemoryWatermarkTopic(partial(sent_offsets, sink))
    process = InjectorProcess(
        name, source, store=store, sink=sink, watermarks=channel, clock=clock, options=options
    )
    collector = None
    if metrics is not None:
        from millstream.injectors.prometheus import InjectorCollector

        collector = InjectorCollector(process)
        metrics.register(collector)
    return InjectorHarness(name, clock, store, sink, channel, process, collector=collector)
