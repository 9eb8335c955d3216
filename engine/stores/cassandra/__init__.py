"""The Cassandra interval store: one partition per key interval, written only by LWTs.

``store`` holds :class:`CassandraIntervalStore` (its docstring maps the store onto the table),
``chain`` how its writes are fenced and their unknown outcomes resolved, ``schema`` the
table's CQL and prepared statements, ``rows`` how rows encode the model.
"""

from millstream.engine.stores.cassandra.schema import (
    DEFAULT_KEYSPACE,
    DEFAULT_TABLE,
    FENCES_TABLE,
    create_schema,
    execute_schema_change,
    fences_cql,
    schema_cql,
)
from millstream.engine.stores.cassandra.store import (
    DEFAULT_ACQUIRE_ATTEMPTS,
    DEFAULT_MAX_BATCH_BYTES,
    MAX_BATCH_STATEMENTS,
    CassandraIntervalStore,
    StoreStats,
)

__all__ = [
    "DEFAULT_ACQUIRE_ATTEMPTS",
    "DEFAULT_KEYSPACE",
    "DEFAULT_MAX_BATCH_BYTES",
    "DEFAULT_TABLE",
    "FENCES_TABLE",
    "MAX_BATCH_STATEMENTS",
    "CassandraIntervalStore",
    "StoreStats",
    "create_schema",
    "execute_schema_change",
    "fences_cql",
    "schema_cql",
]
