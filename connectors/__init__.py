"""The backends: millstream on Kafka and Cassandra.

The names a job needs are importable from here (the front door): where the services are and
how a run is deployed (:func:`load_config`, :class:`MillstreamConfig`, :class:`RunSettings`),
making what a run needs exist (:func:`provision`), reading a stream's records
(:func:`read_stream`), and sending a program's logs to a file of its run (:func:`route_logs`,
:class:`LogRouting`). The rest lives in one module per concern: the Kafka plumbing
(:mod:`~millstream.connectors.kafka`), Cassandra connections
(:mod:`~millstream.connectors.cassandra`), metrics endpoints
(:mod:`~millstream.connectors.prometheus`), the Spark connector jars
(:mod:`~millstream.connectors.maven`), where services are unreachable
(:mod:`~millstream.connectors.services`).
"""

from millstream.connectors.logs import LogRouting, route_logs
from millstream.connectors.provisioning import provision
from millstream.connectors.stream_reader import read_stream
from millstream.engine.config import MillstreamConfig, RunSettings, load_config

__all__ = [
    "LogRouting",
    "MillstreamConfig",
    "RunSettings",
    "load_config",
    "provision",
    "read_stream",
    "route_logs",
]
