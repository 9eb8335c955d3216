"""Run an injector process on the real services: Kafka for records and watermark reports,
Cassandra for its fenced checkpoint.

::

    from millstream.engine.config import load_config
    from millstream.injectors import LogFileSource, LogLine
    from millstream.injectors.connect import connect_injector

    source = LogFileSource("/var/log/searches", parse, "searches")
    with connect_injector(load_config(), "search-logs", source) as injector:
        injector.run()  # until stop() from another thread, or Ctrl-C

The streams' topics are created if missing (``partitions`` each); so are the keyspace
(development replication, like ``run_topology``) and the interval table holding the
checkpoint. With ``metrics_port``, the process's Prometheus metrics
(:mod:`millstream.injectors.prometheus`) are served at
``http://<metrics_address>:<port>/metrics`` while the block runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

from millstream.connectors import cassandra as cassandra_connector
from millstream.connectors import kafka as kafka_connector
from millstream.connectors.prometheus import DEFAULT_METRICS_ADDRESS
from millstream.connectors.services import reaching
from millstream.engine.clock import Clock, SystemClock
from millstream.engine.config import MillstreamConfig
from millstream.engine.stores.cassandra import (
    DEFAULT_KEYSPACE,
    DEFAULT_TABLE,
    CassandraIntervalStore,
    create_schema,
)
from millstream.injectors.process import InjectorOptions, InjectorProcess
from millstream.injectors.source import Source

__all__ = ["connect_injector"]


@contextmanager
def connect_injector(
    config: MillstreamConfig,
    name: str,
    source: Source,
    options: InjectorOptions | None = None,
    *,
    keyspace: str = DEFAULT_KEYSPACE,
    table: str = DEFAULT_TABLE,
    partitions: int = 2,
    create_keyspace: bool = True,
    clock: Clock | None = None,
    metrics_port: int | None = None,
    metrics_address: str = DEFAULT_METRICS_ADDRESS,
) -> Iterator[InjectorProcess]:
    """An :class:`InjectorProcess` wired to ``config``'s services (not started yet); the
    connections close when the block ends. ``metrics_port`` (``None`` or 0: off) serves its
    metrics meanwhile; the process's ``metrics`` is their registry."""
    clock = clock or SystemClock()
    with reaching(config):  # a service not running: say which, and what to do
        cluster, session = cassandra_connector.connect(config)
    try:
        if create_keyspace:
            cassandra_connector.create_keyspace(session, keyspace, config.cassandra_replication)
        create_schema(session, keyspace, table)
        store = CassandraIntervalStore(session, keyspace, clock, table=table)
        sink = kafka_connector.KafkaProductionSink(config)
        channel = kafka_connector.KafkaWatermarkTopic(config)
        try:
            with ExitStack() as serving:
                registry = None
                if metrics_port:
                    from prometheus_client import CollectorRegistry

                    from millstream.connectors.prometheus import serve_metrics

                    registry = CollectorRegistry()
                    serving.enter_context(serve_metrics(registry, metrics_port, metrics_address))
                process = InjectorProcess(
                    name,
                    source,
                    store=store,
                    sink=sink,
                    watermarks=channel,
                    clock=clock,
                    options=options,
                    metrics=registry,
                )
                with reaching(config):
                    kafka_connector.create_topics(
                        config,
                        [kafka_connector.stream_topic(s) for s in process.streams],
                        partitions=partitions,
                    )
                yield process
        finally:
            channel.close()
            sink.close()
    finally:
        cluster.shutdown()
