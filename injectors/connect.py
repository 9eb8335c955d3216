"""Run an injector process on the real services: Kafka for records and watermark reports,
Cassandra for its fenced checkpoint.

::

    from millstream.connectors import load_config
    from millstream.injectors import LogFileSource, connect_injector

    source = LogFileSource("/var/log/searches", parse, "searches")
    with connect_injector(load_config(), "search-logs", source) as injector:
        injector.run()  # until stop() from another thread, or Ctrl-C

Where its checkpoint lives and how its topics are made is the run's deployment,
:class:`~millstream.engine.config.RunSettings` (default ``config.run``, the ``[run]`` table):
the streams' topics, the keyspace (with ``create_keyspace``) and the interval table holding
the checkpoint are provisioned first (:func:`millstream.connectors.provision`), so an
injector may start before, after or alongside the topology that reads it. With
``settings.metrics_port``, the process's Prometheus metrics
(:mod:`millstream.injectors.prometheus`) are served at
``http://<metrics_address>:<port>/metrics`` while the block runs. A topology's job can run its
injectors itself: ``RunningTopology.add_injector`` (:mod:`millstream.spark`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from typing import Any

from cassandra.cluster import Cluster, Session

from millstream.connectors import cassandra as cassandra_connector
from millstream.connectors import kafka as kafka_connector
from millstream.connectors.provisioning import provision
from millstream.connectors.services import start_through_outage
from millstream.engine.clock import Clock, SystemClock
from millstream.engine.config import MillstreamConfig, RunSettings
from millstream.engine.stores.cassandra import CassandraIntervalStore
from millstream.injectors.process import InjectorOptions, InjectorProcess, injector_streams
from millstream.injectors.source import Source

__all__ = ["connect_injector"]


def connect_injector(
    config: MillstreamConfig,
    name: str,
    source: Source,
    options: InjectorOptions | None = None,
    settings: RunSettings | None = None,
    *,
    clock: Clock | None = None,
    **deprecated: Any,
) -> AbstractContextManager[InjectorProcess]:
    """An :class:`InjectorProcess` wired to ``config``'s services (not started yet); the
    connections close when the block ends. ``settings`` (default ``config.run``) says where
    its checkpoint lives and serves its metrics meanwhile if it names a port; the process's
    ``metrics`` is their registry.

    The keywords ``keyspace``, ``table``, ``partitions``, ``create_keyspace``,
    ``metrics_port`` and ``metrics_address`` are deprecated (``settings`` holds them) and go
    in 0.3.
    """
    settings = (settings or config.run).with_deprecated_keywords("connect_injector", deprecated)
    return _connected(
        config, name, source, options or InjectorOptions(), settings, clock or SystemClock()
    )


@contextmanager
def _connected(
    config: MillstreamConfig,
    name: str,
    source: Source,
    options: InjectorOptions,
    settings: RunSettings,
    clock: Clock,
) -> Iterator[InjectorProcess]:
    def start() -> tuple[Cluster, Session]:
        provision(config, settings, streams=injector_streams(name, source, options))
        return cassandra_connector.connect(config)

    # Restarted while Kafka or Cassandra restarts: it starts once they are back.
    cluster, session = start_through_outage(
        config, f"injector {name!r} starting", start, options.outage_timeout
    )
    try:
        store = CassandraIntervalStore(session, settings.keyspace, clock, table=settings.table)
        sink = kafka_connector.KafkaProductionSink(config)
        # Not created again here, out of the outage's reach: provision created or checked it,
        # and the first write (a retried step) makes sure of it once more.
        channel = kafka_connector.KafkaWatermarkTopic(config, create=False)
        try:
            with ExitStack() as serving:
                registry = None
                if settings.metrics_port:
                    from prometheus_client import CollectorRegistry

                    from millstream.connectors.prometheus import serve_metrics

                    registry = CollectorRegistry()
                    serving.enter_context(
                        serve_metrics(registry, settings.metrics_port, settings.metrics_address)
                    )
                yield InjectorProcess(
                    name,
                    source,
                    store=store,
                    sink=sink,
                    watermarks=channel,
                    clock=clock,
                    options=options,
                    metrics=registry,
                )
        finally:
            channel.close()
            sink.close()
    finally:
        cluster.shutdown()
