"""Injectors: bring external data into millstream streams (paper 4.5, 5.2).

A custom injector is a :class:`~millstream.injectors.source.Source`; an
:class:`~millstream.injectors.process.InjectorProcess` runs it with fenced checkpoints,
record IDs from source positions, dead letters and low-watermark reports;
:func:`~millstream.injectors.connect.connect_injector` wires one to Kafka and Cassandra (a
topology's job can run its injectors itself: ``RunningTopology.add_injector``). Shipped
sources: :class:`~millstream.injectors.logfile.LogFileSource` (a directory of log files) and
:class:`~millstream.injectors.pubsub.KafkaFeedSource` (a topic written by ordinary producers).
"""

from typing import Any

from millstream.injectors.connect import connect_injector
from millstream.injectors.logfile import LineParser, LogFileSource, LogLine
from millstream.injectors.process import (
    InjectorOptions,
    InjectorProcess,
    InjectorStats,
    retire_process,
)
from millstream.injectors.pubsub import KafkaFeedSource, Pick
from millstream.injectors.source import (
    Event,
    Poll,
    Position,
    RejectedInput,
    Source,
    SourceRecord,
)

__all__ = [
    "Event",
    "InjectorOptions",
    "InjectorProcess",
    "InjectorStats",
    "KafkaFeedSource",
    "LineParser",
    "LogFileSource",
    "LogLine",
    "Pick",
    "Poll",
    "Position",
    "RejectedInput",
    "Source",
    "SourceRecord",
    "connect_injector",
    "retire_process",
]


def __getattr__(name: str) -> Any:
    if name == "WatermarkChannel":
        from millstream.injectors import process

        return getattr(process, name)  # deprecated: warns
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
