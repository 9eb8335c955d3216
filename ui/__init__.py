"""The live view of running topologies: ``millstream ui``.

A read-only web page about the topologies on the configured services, built from what Kafka
holds (the watermark topic and the streams' offsets), never from a driver's memory: the
topology's graph with each computation's watermark lag, rates, backlog and health, what holds
a stuck watermark, the streams and their consumers' lag, and a timeline of what changed,
updated live over Server-Sent Events.

The names a program needs to serve it itself are here: :func:`serve` (what the command
runs), :func:`start_view` (the same from a child process, beside a driver), and the parts:
:class:`KafkaObserver` (reads the services), :class:`Tracker` (turns observations into
snapshots), :class:`SnapshotHub` and :func:`create_app` (the ASGI app).
"""

from millstream.ui.app import DEFAULT_PERIOD, SnapshotHub, TokenGate, create_app, is_loopback
from millstream.ui.observer import KafkaObserver
from millstream.ui.server import DEFAULT_PORT, RunningView, serve, start_view
from millstream.ui.snapshot import Observation, Tracker

__all__ = [
    "DEFAULT_PERIOD",
    "DEFAULT_PORT",
    "KafkaObserver",
    "Observation",
    "RunningView",
    "SnapshotHub",
    "TokenGate",
    "Tracker",
    "create_app",
    "is_loopback",
    "serve",
    "start_view",
]
