"""The Cassandra interval store: one partition per key interval, written only by LWTs."""

from millstream.engine.stores.cassandra.store import (
    DEFAULT_ACQUIRE_ATTEMPTS,
    DEFAULT_KEYSPACE,
    DEFAULT_MAX_BATCH_BYTES,
    DEFAULT_TABLE,
    MAX_BATCH_STATEMENTS,
    CassandraIntervalStore,
    StoreStats,
    create_schema,
    schema_cql,
)

__all__ = [
    "DEFAULT_ACQUIRE_ATTEMPTS",
    "DEFAULT_KEYSPACE",
    "DEFAULT_MAX_BATCH_BYTES",
    "DEFAULT_TABLE",
    "MAX_BATCH_STATEMENTS",
    "CassandraIntervalStore",
    "StoreStats",
    "create_schema",
    "schema_cql",
]
