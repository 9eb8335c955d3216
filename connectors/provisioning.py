"""Provisioning: make what a run needs exist, whichever entry point comes first.

A run needs a Cassandra keyspace and interval table (state, timers, pending productions and
injector checkpoints), the compacted watermark topic, and a Kafka topic per stream. Every
entry point that may be the first on a fresh cluster goes through :func:`provision`: a
topology's start and each computation added to it (:mod:`millstream.spark`), an injector
(``connect_injector``), and ``millstream produce``. It is idempotent and safe to run from
several processes at once: whatever exists is left as it is.

Why it reads the schema afresh: a cassandra-driver session caches the cluster's schema and
learns of a change made elsewhere only from a pushed event, applied up to two seconds later
(``Cluster.schema_event_refresh_window``). ``CREATE KEYSPACE IF NOT EXISTS`` that finds the
keyspace another process has just created answers without a schema change, so nothing
refreshes the cache, and a check against it says the keyspace does not exist. That is how the
main job's first run on a fresh machine failed: its injector connected, the topology created
the keyspace, and the injector's own ``IF NOT EXISTS`` then found it without seeing it. Here
the keyspace and table are read back from the cluster (after schema agreement) before the
table is made and before anyone prepares a statement on it.
"""

from __future__ import annotations

from collections.abc import Iterable

from millstream.connectors import cassandra as cassandra_connector
from millstream.connectors import kafka
from millstream.engine.config import MillstreamConfig, RunSettings
from millstream.engine.errors import StoreError
from millstream.engine.stores.cassandra import create_schema

__all__ = ["provision"]


def provision(
    config: MillstreamConfig,
    settings: RunSettings | None = None,
    *,
    streams: Iterable[str] = (),
    store: bool = True,
    watermark_topic: bool = True,
    timeout: float = 30.0,
) -> None:
    """Make sure what a run needs exists; leave what exists as it is.

    ``settings`` (default ``config.run``) says where and how much:

    - with ``store``: the keyspace (created only with ``settings.create_keyspace``:
      SimpleStrategy, ``config.cassandra_replication`` replicas) and its interval table,
      visible to every node (schema agreement);
    - with ``watermark_topic``: the compacted watermark topic (an existing one must be
      compacted: :func:`millstream.connectors.kafka.create_watermark_topic`) and the topic
      transactional productions commit their markers on;
    - a topic for each of ``streams``, with ``settings.partitions_of(stream)`` partitions.

    Raises :class:`~millstream.engine.errors.StoreError` if the keyspace is missing and
    ``settings.create_keyspace`` is off, and what the clients raise if Kafka or Cassandra
    cannot be reached.
    """
    settings = settings or config.run
    if store:
        _provision_store(config, settings)
    if watermark_topic:
        kafka.create_watermark_topic(config, timeout=timeout)
        kafka.create_transaction_marker_topic(config, timeout=timeout)
    by_count: dict[int, list[str]] = {}
    for stream in sorted(set(streams)):
        by_count.setdefault(settings.partitions_of(stream), []).append(kafka.stream_topic(stream))
    for count, topics in sorted(by_count.items()):
        kafka.create_topics(config, topics, partitions=count, timeout=timeout)


def _provision_store(config: MillstreamConfig, settings: RunSettings) -> None:
    keyspace, table = settings.keyspace, settings.table
    cluster, session = cassandra_connector.connect(config)
    try:
        if settings.create_keyspace:
            cassandra_connector.create_keyspace(session, keyspace, config.cassandra_replication)
        # The session's cached schema may predate the keyspace (see the module docstring).
        cluster.refresh_keyspace_metadata(keyspace)
        if keyspace not in cluster.metadata.keyspaces:
            raise StoreError(
                f"keyspace {keyspace!r} does not exist and [run] create_keyspace is off; "
                "create it (with the replication your cluster needs), or set "
                "create_keyspace = true in [run] (MILLSTREAM_RUN_CREATE_KEYSPACE=1) to have "
                "a development keyspace made"
            )
        create_schema(session, keyspace, table)
        # Made by another process just now: wait until every node knows it.
        cluster.refresh_table_metadata(keyspace, table)
    finally:
        cluster.shutdown()
