"""Apache Cassandra 5.0 nodes from its Maven artifacts, tuned to start fast and stay small.

A node lives under its root (``<home>/cassandra/`` for the single node, ``<home>/cluster/
cassandra-N/`` for node N of a replicated stack): ``conf/`` is rewritten on every start, the
data directories (``data/``, ``commitlog/``, ``saved_caches/``, ``hints/``, ``cdc_raw/``) are
only ever created. A node binds its own loopback address alone and opens no JMX port.

In a replicated stack node 1 is the seed and the others join it one after another, each
bootstrapping like any new node of a production cluster; a node restarted later keeps its
tokens and data and rejoins.

A node stopped by ``millstream down`` forgets what Cassandra 5.0 keeps forever and reads
at every start (:func:`tidy_stopped_node`): the Paxos state of dropped tables and the
compaction history. Left alone, a node's start grew from 10 s to 60 s over a few days of
test runs.
"""

from __future__ import annotations

import json
import re
import secrets
import socket
import ssl
import struct
import time
from dataclasses import replace
from pathlib import Path

from millstream.devtools.local.security import SECURE_USER
from millstream.devtools.local.service import LocalService, ServiceStatus
from millstream.devtools.local.wire import read_exactly
from millstream.engine.config import Secret
from millstream.engine.errors import ConfigError, ServiceStartError

__all__ = [
    "DATA_DIRS",
    "JVM17_MODULE_OPTIONS",
    "CassandraService",
    "cql_ping",
    "prune_paxos_state",
    "tidy_stopped_node",
]

_MAIN_CLASS = "org.apache.cassandra.service.CassandraDaemon"
_HEAP = "1G"
# Cassandra calls mlockall(MCL_CURRENT) at startup, and where RLIMIT_MEMLOCK allows it (root,
# most containers) every committed page becomes resident and pinned: with -Xms1G an idle node
# sat at 1.5 GiB RSS, with -Xms256m at about 730 MiB. The heap still grows to -Xmx on demand.
_INITIAL_HEAP = "256m"
# The two stacks get different names, so a node of one can never gossip its way into the other.
_CLUSTER_NAME = "millstream-local"
_REPLICATED_CLUSTER_NAME = "millstream-local-cluster"
_SECURE_CLUSTER_NAME = "millstream-local-secure"
# The superuser PasswordAuthenticator creates on a new cluster. A secure node logs in as it
# once, to create the millstream role, then disables it.
_DEFAULT_SUPERUSER = ("cassandra", "cassandra")

# Created by prepare(), never emptied: they hold the node's data and identity.
DATA_DIRS = ("data", "commitlog", "saved_caches", "hints", "cdc_raw")

# Paxos v2 keeps the keys of each table with uncommitted LWTs in files named
# <keyspace>-<table>-<table id>-<generation>.paxos (and .crc) here, for Paxos repair. Cassandra
# 5.0 never deletes those of a dropped table, and at start it lists this directory once per
# table id the files name: with the 3,600 tables a few days of test runs dropped, that took
# 36 s of a 60 s start (a thread dump showed UncommittedTableData.load listing it).
_PAXOS_STATE_DIR = Path("data", "system", "_paxos_repair_state")
_PAXOS_STATE_FILE = re.compile(
    r".*-(?P<id>[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})-\d+\.paxos(\.crc)?"
)
# system.compaction_history, a log of every compaction for `nodetool compactionhistory`. At
# every start Cassandra 5.0.9 copies all its rows onto themselves (SystemKeyspaceMigrator41,
# "Migrated 31795 rows from legacy compaction_history to compaction_history": 12 s), which
# also renews their 7-day TTL, so they never expire and each start copies more.
_COMPACTION_HISTORY = "compaction_history-"

# The JPMS section of Cassandra 5.0's conf/jvm17-server.options: Java 17 denies the access to
# JDK internals that Cassandra and its libraries (Netty, Chronicle, jamm) rely on otherwise.
JVM17_MODULE_OPTIONS = (
    "-Djdk.attach.allowAttachSelf=true",
    "--add-exports=java.base/jdk.internal.misc=ALL-UNNAMED",
    "--add-exports=java.management.rmi/com.sun.jmx.remote.internal.rmi=ALL-UNNAMED",
    "--add-exports=java.rmi/sun.rmi.registry=ALL-UNNAMED",
    "--add-exports=java.rmi/sun.rmi.server=ALL-UNNAMED",
    "--add-exports=java.sql/java.sql=ALL-UNNAMED",
    "--add-exports=java.base/java.lang.ref=ALL-UNNAMED",
    "--add-exports=jdk.unsupported/sun.misc=ALL-UNNAMED",
    "--add-exports=jdk.compiler/com.sun.tools.javac.file=ALL-UNNAMED",
    "--add-exports=jdk.attach/sun.tools.attach=ALL-UNNAMED",
    "--add-opens=java.base/java.lang.module=ALL-UNNAMED",
    "--add-opens=java.base/jdk.internal.loader=ALL-UNNAMED",
    "--add-opens=java.base/jdk.internal.ref=ALL-UNNAMED",
    "--add-opens=java.base/jdk.internal.reflect=ALL-UNNAMED",
    "--add-opens=java.base/jdk.internal.math=ALL-UNNAMED",
    "--add-opens=java.base/jdk.internal.module=ALL-UNNAMED",
    "--add-opens=java.base/jdk.internal.util.jar=ALL-UNNAMED",
    "--add-opens=jdk.management/com.sun.management.internal=ALL-UNNAMED",
    "--add-opens=java.base/sun.nio.ch=ALL-UNNAMED",
    "--add-opens=java.base/java.io=ALL-UNNAMED",
    "--add-opens=java.base/java.lang.reflect=ALL-UNNAMED",
    "--add-opens=jdk.compiler/com.sun.tools.javac=ALL-UNNAMED",
    "--add-opens=java.base/java.lang=ALL-UNNAMED",
    "--add-opens=java.base/java.util=ALL-UNNAMED",
)

# The rest of jvm-server.options / jvm17-server.options that matters for one small node.
# Left out on purpose: -XX:+AlwaysPreTouch (would make the whole heap resident at once),
# -XX:+UseNUMA, the 16m G1 regions tuned for large heaps, and -Dcassandra.jmx.local.port
# (without it Cassandra opens no JMX port at all; millstream never uses nodetool).
_JVM_OPTIONS = (
    "-ea",  # Cassandra's own safety asserts, on in every stock install
    "-da:net.openhft...",  # Chronicle's asserts leak memory by design
    "-XX:+UseG1GC",
    "-XX:+ParallelRefProcEnabled",
    "-XX:MaxGCPauseMillis=300",
    "-XX:+UseThreadPriorities",
    "-XX:+PerfDisableSharedMem",  # no hsperfdata writes stalling GC (jvm-server.options)
    "-XX:+ExitOnOutOfMemoryError",  # a node that ran out of heap may corrupt data: stop it
    # 256k is Cassandra's default on x86_64, but aarch64 and ppc64le JVMs refuse less than
    # ~384k; 512k starts everywhere and costs only unused reserved address space.
    "-Xss512k",
    "-Dio.netty.tryReflectionSetAccessible=true",
    "-Dio.netty.allocator.useCacheForAllThreads=true",
    "-Dio.netty.allocator.maxOrder=11",
    "-Dcassandra-foreground=yes",  # otherwise the daemon closes stdout, our only crash log
)

# A lone seed node has nobody to gossip with: skip the settle wait and the ring delay, and it
# has no peers to tell it is going away.
_SINGLE_NODE_GOSSIP = (
    "-Dcassandra.skip_wait_for_gossip_to_settle=0",
    "-Dcassandra.ring_delay_ms=100",
    "-Dcassandra.shutdown_announce_in_ms=0",
)
# The nodes of a replicated stack need a real ring delay: a joining node's shadow round with
# the seed gives up after twice the delay, a node without tokens yet (one that is joining)
# is dropped from gossip once silent for that long, and a joining node waits that long for
# its pending ranges to reach the others before it streams. At 100 ms a joining node gave up
# on the seed while the seed, busy starting on two cores, took 2 s to answer; 5 s leaves a
# margin over gossip's 1 s rounds and costs 5 s per joining node (and once at the seed's
# first start, which waits that long to learn tokens before picking its own). Gossip need
# not settle: before taking clients a node waits for its peers anyway (Cassandra's startup
# connectivity check). Shutdowns are announced (Cassandra's default), so that `down` of one
# node is seen by the others at once.
_CLUSTER_GOSSIP = (
    "-Dcassandra.skip_wait_for_gossip_to_settle=0",
    "-Dcassandra.ring_delay_ms=5000",
)

# No <shutdownHook>: Cassandra stops logback itself at the end of its drain, and logback's own
# hook would close the log before the drain is written to it.
_LOGBACK = """\
<configuration scan="false" debug="false">
  <appender name="SYSTEMLOG" class="ch.qos.logback.core.rolling.RollingFileAppender">
    <filter class="ch.qos.logback.classic.filter.ThresholdFilter">
      <level>INFO</level>
    </filter>
    <file>{logs}/system.log</file>
    <rollingPolicy class="ch.qos.logback.core.rolling.FixedWindowRollingPolicy">
      <fileNamePattern>{logs}/system.log.%i.zip</fileNamePattern>
      <minIndex>1</minIndex>
      <maxIndex>3</maxIndex>
    </rollingPolicy>
    <triggeringPolicy class="ch.qos.logback.core.rolling.SizeBasedTriggeringPolicy">
      <maxFileSize>20MB</maxFileSize>
    </triggeringPolicy>
    <encoder>
      <pattern>%-5level [%thread] %date{{ISO8601}} %F:%L - %msg%n</pattern>
    </encoder>
  </appender>
  <appender name="STDOUT" class="ch.qos.logback.core.ConsoleAppender">
    <filter class="ch.qos.logback.classic.filter.ThresholdFilter">
      <level>WARN</level>
    </filter>
    <encoder>
      <pattern>%-5level [%thread] %date{{ISO8601}} %F:%L - %msg%n</pattern>
    </encoder>
  </appender>
  <root level="INFO">
    <appender-ref ref="SYSTEMLOG"/>
    <appender-ref ref="STDOUT"/>
  </root>
</configuration>
"""


class CassandraService(LocalService):
    backend = "cassandra"
    profile = "cassandra"
    # 5-10 s on two cores (measured, first start included); the margin is for slow CI disks.
    start_timeout = 120.0
    # Cassandra's idle request workers (its shared executor pool) look for work in timed
    # sleeps of 10 us to 1 ms for some 10 ms after each task, and each stage a request passes
    # through starts that again: at ten LWTs a second the node spent 10 ms of CPU on one (1.1
    # ms back to back). Let the kernel end those sleeps up to 1 ms late: 2.7 ms, for at most
    # about 1 ms more a request (bench/paced_lwts.py, docs/guides/local-stack.md).
    timer_slack_ns = 1_000_000
    # What before_down read for down: the tables live just before the stop, and when.
    _live_tables: tuple[set[str], float] | None = None

    @property
    def _conf_dir(self) -> Path:
        return self.root / "conf"

    @property
    def _log_dir(self) -> Path:
        return self.root / "logs"

    def ports(self) -> list[tuple[str, int]]:
        return [
            ("native transport", self.config.cassandra_port),
            ("storage", self.config.cassandra_storage_port),
        ]

    def address(self) -> str:
        return f"{self.host}:{self.config.cassandra_port}"

    def cassandra_yaml(self) -> str:
        """The node's cassandra.yaml: its loopback address only, our ports, every directory
        under its root; in a replicated stack, node 1 as the seed."""
        root = self.root
        node = self.node
        storage_port = self.config.cassandra_storage_port
        seed = f"{node.hosts[0]}:{storage_port}"
        if node.secure:
            cluster_name = _SECURE_CLUSTER_NAME
        else:
            cluster_name = _REPLICATED_CLUSTER_NAME if node.replicated else _CLUSTER_NAME
        settings: list[tuple[str, object]] = [
            ("cluster_name", cluster_name),
            # Token count is fixed at first boot; 16 with the allocator is 5.0's default. The
            # allocator balances the ranges for the replication factor the keyspaces get.
            ("num_tokens", 16),
            ("allocate_tokens_for_local_replication_factor", node.replication),
            ("partitioner", "org.apache.cassandra.dht.Murmur3Partitioner"),
            ("endpoint_snitch", "SimpleSnitch"),
            ("listen_address", self.host),
            ("rpc_address", self.host),
            ("storage_port", storage_port),
            ("start_native_transport", True),
            ("native_transport_port", self.config.cassandra_port),
            # A seed never bootstraps (the single node is its own seed); the other nodes of a
            # replicated stack take their token ranges from the ring as any new node does.
            ("auto_bootstrap", node.number != 1),
            ("data_file_directories", [str(root / "data")]),
            ("commitlog_directory", str(root / "commitlog")),
            ("saved_caches_directory", str(root / "saved_caches")),
            ("hints_directory", str(root / "hints")),
            ("cdc_raw_directory", str(root / "cdc_raw")),
            ("cdc_enabled", False),
            # The design requires Paxos v2 for every LWT. Paxos state is purged at compaction
            # by "gc_grace" ("repaired" is only safe with regular Paxos repairs, which nobody
            # runs on a development node). Its state of a live table lives gc_grace_seconds,
            # as "legacy"'s TTLs do, but that of a dropped table 3 hours, not the 10 days of the
            # TTL "legacy" wrote: in a day of tests and benchmarks that each drop their
            # keyspaces the dropped tables' last commits filled system.paxos to 134 MiB, and
            # Leveled compaction rewrote all of it after each of its flushes (every DROP
            # flushes it), 1.2 s of a core each time. Cassandra allows the switch at any time.
            ("paxos_variant", "v2"),
            ("paxos_state_purging", "gc_grace"),
            # A write is acknowledged only once its commit log entry is on disk. "periodic"
            # (Cassandra's default, made for replicated clusters) acknowledges first: a single
            # node killed lost the LWTs of its last ~100 ms (between commit log sync markers),
            # among them sequencer commits whose productions Kafka had already delivered.
            ("commitlog_sync", "batch"),
            ("commitlog_total_space", "512MiB"),
            # Keep it light: two cores, a 1G heap, a laptop's disk.
            ("concurrent_reads", 8),
            ("concurrent_writes", 16),
            ("concurrent_counter_writes", 4),
            ("concurrent_materialized_view_writes", 2),
            ("concurrent_compactors", 1),
            ("memtable_flush_writers", 1),
            ("key_cache_size", "16MiB"),
            ("row_cache_size", "0MiB"),
            ("counter_cache_size", "0MiB"),
            # Tests create and drop keyspaces all day; snapshots of them would only fill the disk.
            ("auto_snapshot", False),
            ("authenticator", "PasswordAuthenticator" if node.secure else "AllowAllAuthenticator"),
            # Authenticated roles may do anything: millstream's one role creates keyspaces.
            ("authorizer", "AllowAllAuthorizer"),
        ]
        if node.secure:
            settings.append(
                (
                    "client_encryption_options",
                    {
                        "enabled": True,
                        "optional": False,  # no plaintext clients
                        "ssl_context_factory": {
                            "class_name": "org.apache.cassandra.security.PEMBasedSslContextFactory"
                        },
                        # The private key (unencrypted) and the certificate, one PEM file.
                        "keystore": str(self.security.server_pem),
                        "require_client_auth": "false",
                    },
                )
            )
        lines = [
            "# Written by millstream on every start; edits here are lost.",
            *(f"{key}: {_yaml_value(value)}" for key, value in settings),
            "seed_provider:",
            "  - class_name: org.apache.cassandra.locator.SimpleSeedProvider",
            "    parameters:",
            f"      - seeds: {_yaml_value(seed)}",
        ]
        return "\n".join(lines) + "\n"

    def logback_xml(self) -> str:
        return _LOGBACK.format(logs=_xml_text(str(self._log_dir)))

    def prepare(self) -> None:
        if self.node.secure:
            self.security.ensure(self.host)
        for directory in (self._conf_dir, self._log_dir, *(self.root / d for d in DATA_DIRS)):
            directory.mkdir(parents=True, exist_ok=True)
        _write(self._conf_dir / "cassandra.yaml", self.cassandra_yaml())
        _write(self._conf_dir / "logback.xml", self.logback_xml())

    def argv(self, classpath: list[Path]) -> list[str]:
        jvm = self.java_argv(
            classpath,
            _HEAP,
            *JVM17_MODULE_OPTIONS,
            *_JVM_OPTIONS,
            *(_CLUSTER_GOSSIP if self.node.replicated else _SINGLE_NODE_GOSSIP),
            # The default superuser exists at once, not 10 s after start (a secure node
            # logs in as it on its first start).
            *(("-Dcassandra.superuser_setup_delay_ms=0",) if self.node.secure else ()),
            *_jamm_agent(classpath),
            f"-Dcassandra.config={(self._conf_dir / 'cassandra.yaml').as_uri()}",
            f"-Dcassandra.storagedir={self.root}",
            f"-Dcassandra.logdir={self._log_dir}",
            f"-Dlogback.configurationFile={self._conf_dir / 'logback.xml'}",
            *self.config.cassandra_java_options,
        )
        jvm[jvm.index(f"-Xms{_HEAP}")] = f"-Xms{_INITIAL_HEAP}"
        return [*jvm, _MAIN_CLASS]

    def healthy(self) -> bool:
        # Cassandra opens the native port only at the end of startup; the query then proves
        # that the node serves reads of its system tables. A secure node answers over TLS
        # verified against the local CA, and asks for credentials (role set-up comes later).
        if self.node.secure:
            context = ssl.create_default_context(cafile=str(self.security.ca_file))
            return cql_ping(self.host, self.config.cassandra_port, tls=context)
        return cql_ping(self.host, self.config.cassandra_port)

    def up(self) -> ServiceStatus:
        status = super().up()
        if self.node.secure:
            self._ensure_role()
        # It serves clients, so it joined its ring: from now on it restarts with its tokens.
        self._joined.touch()
        return status

    def before_down(self) -> None:
        """Read the live tables now, while every node of the stack answers (:meth:`down`
        needs them once the node has stopped)."""
        self._live_tables = self._live()

    def down(self) -> bool:
        """Stop the node; once it has stopped, forget what Cassandra would otherwise read at
        every start (:func:`tidy_stopped_node`), given the tables live just before the stop
        (read by :meth:`before_down`, or now)."""
        live = self._live_tables if self._live_tables is not None else self._live()
        self._live_tables = None
        stopped = super().down()
        if stopped and live is not None:
            tables, since = live
            pruned = tidy_stopped_node(self.root, tables, since)
            if pruned:
                self.progress(
                    f"{self.name}: deleted the Paxos state of dropped tables ({pruned} files)"
                )
        return stopped

    def _live(self) -> tuple[set[str], float] | None:
        return self._table_ids() if self.process.running_pid() is not None else None

    def _table_ids(self) -> tuple[set[str], float] | None:
        """The ids of the node's tables and when they were read, or None (with a word why)
        if the node does not answer: then nothing is pruned."""
        from cassandra import DriverException
        from cassandra.cluster import NoHostAvailable

        from millstream.connectors.cassandra import connect

        since = time.time()
        try:
            cluster, session = connect(self.client_config())
        except (NoHostAvailable, ConfigError) as exc:
            self.progress(f"{self.name}: not pruning its Paxos state: {exc}")
            return None
        try:
            rows = session.execute("SELECT id FROM system_schema.tables")
            return {str(row.id) for row in rows}, since
        except (DriverException, NoHostAvailable) as exc:
            self.progress(f"{self.name}: not pruning its Paxos state: {exc}")
            return None
        finally:
            cluster.shutdown()

    def _ensure_role(self, timeout: float = 60.0) -> None:
        """Make sure role millstream logs in with its generated password: on a new node,
        log in as the default superuser, create the role (a superuser too) and disable the
        default one (its well-known password) for good."""
        from millstream.connectors.cassandra import connect

        client = self.client_config()
        try:
            cluster, _ = connect(client)
        except ConfigError:
            pass  # refused: the role does not exist yet
        else:
            cluster.shutdown()
            return
        self.progress(f"{self.name}: creating role {SECURE_USER}")
        name, password = _DEFAULT_SUPERUSER
        default = replace(client, cassandra_username=name, cassandra_password=Secret(password))
        deadline = time.monotonic() + timeout
        while True:
            try:
                cluster, session = connect(default)
                break
            except ConfigError:
                # The default superuser is created just after the native port opens.
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.5)
        try:
            assert client.cassandra_password is not None
            session.execute(
                f"CREATE ROLE IF NOT EXISTS {SECURE_USER} WITH LOGIN = true AND SUPERUSER = true "
                "AND PASSWORD = %s",
                (client.cassandra_password.reveal(),),
            )
            session.execute(
                f"ALTER ROLE {name} WITH LOGIN = false AND PASSWORD = %s",
                (secrets.token_hex(24),),
            )
        finally:
            cluster.shutdown()

    def starts_alone(self) -> bool:
        """A node that never joined its ring does: it bootstraps, which Cassandra allows one
        node at a time, and picks its tokens knowing those of all nodes started before it.
        Nodes that joined before restart together, which also spares each of them the wait
        for its peers (the connectivity check before a node takes clients waits up to 10 s)."""
        return not self._joined.is_file()

    @property
    def _joined(self) -> Path:
        # Beside the data directories, not in them (Cassandra reads those as keyspaces).
        return self.root / "joined"


def tidy_stopped_node(root: Path, live: set[str], since: float) -> int:
    """Delete, under a stopped node's ``root``, the Paxos state of tables not ``live`` (see
    :func:`prune_paxos_state`) and the compaction history; return how many Paxos state
    files went. Only for a node stopped by us: nothing may write these files meanwhile."""
    for table in (root / "data" / "system").glob(f"{_COMPACTION_HISTORY}*"):
        # A log for operators, read by no query of ours; emptied whole (sstables and any
        # transaction log of an interrupted compaction), it starts again from nothing.
        for path in table.iterdir():
            if path.is_file():
                path.unlink()
    return prune_paxos_state(root / _PAXOS_STATE_DIR, live, since)


def prune_paxos_state(directory: Path, live: set[str], since: float) -> int:
    """Delete the Paxos state files in ``directory`` of tables not in ``live`` (table ids)
    and last written before ``since`` (when ``live`` was read, so that a table created after
    keeps its files); return how many."""
    pruned = 0
    try:
        entries = list(directory.iterdir())
    except FileNotFoundError:
        return 0
    for path in entries:
        match = _PAXOS_STATE_FILE.fullmatch(path.name)
        if match is None or match["id"] in live:
            continue
        try:
            if path.stat().st_mtime < since:
                path.unlink()
                pruned += 1
        except FileNotFoundError:
            continue
    return pruned


# -- a minimal CQL native protocol v4 client, just enough to run one query ---------------
#
# Cheaper and quieter than cassandra-driver for a health check polled every second: no
# control connection, no schema fetch, no event loop thread, no warnings. Protocol v4 is
# served by every Cassandra from 2.2 to 5.0.

_V4_REQUEST = 0x04
_V4_RESPONSE = 0x84
_OP_STARTUP, _OP_READY, _OP_AUTHENTICATE, _OP_QUERY, _OP_RESULT = 0x01, 0x02, 0x03, 0x07, 0x08
_RESULT_ROWS = 0x0002
_CONSISTENCY_ONE = 0x0001
_HEALTH_QUERY = "SELECT release_version FROM system.local"


def cql_ping(host: str, port: int, timeout: float = 2.0, tls: ssl.SSLContext | None = None) -> bool:
    """Whether the node at host:port runs ``SELECT release_version FROM system.local``.

    With ``tls``, over TLS with that context (verifying the node's certificate for
    ``host``); a node that then asks for credentials serves clients, which is a yes.
    """
    try:
        with socket.create_connection((host, port), timeout=timeout) as raw:
            conn = raw if tls is None else tls.wrap_socket(raw, server_hostname=host)
            conn.settimeout(timeout)
            _send(conn, 1, _OP_STARTUP, _string_map({"CQL_VERSION": "3.0.0"}))
            opcode = _receive(conn, 1)[0]
            if tls is not None and opcode == _OP_AUTHENTICATE:
                return True
            if opcode != _OP_READY:
                return False
            query = _long_string(_HEALTH_QUERY) + struct.pack(">HB", _CONSISTENCY_ONE, 0)
            _send(conn, 2, _OP_QUERY, query)
            opcode, body = _receive(conn, 2)
            # Anything but a RESULT of kind Rows (an ERROR while bootstrapping, say) is a no.
            return opcode == _OP_RESULT and struct.unpack_from(">i", body)[0] == _RESULT_ROWS
    except (OSError, ValueError, struct.error):
        return False


def _send(conn: socket.socket, stream: int, opcode: int, body: bytes) -> None:
    conn.sendall(struct.pack(">BBhBi", _V4_REQUEST, 0, stream, opcode, len(body)) + body)


def _receive(conn: socket.socket, stream: int) -> tuple[int, bytes]:
    version, _flags, got_stream, opcode, length = struct.unpack(">BBhBi", read_exactly(conn, 9))
    if version != _V4_RESPONSE or got_stream != stream or not 0 <= length < 1 << 20:
        raise ValueError("not a CQL v4 response to our request")
    return opcode, read_exactly(conn, length)


def _string_map(values: dict[str, str]) -> bytes:
    out = struct.pack(">H", len(values))
    for key, value in values.items():
        for text in (key, value):
            encoded = text.encode()
            out += struct.pack(">H", len(encoded)) + encoded
    return out


def _long_string(text: str) -> bytes:
    encoded = text.encode()
    return struct.pack(">i", len(encoded)) + encoded


# -- helpers ---------------------------------------------------------------------------------


def _jamm_agent(classpath: list[Path]) -> list[str]:
    """Cassandra sizes memtables and caches with jamm, most accurately as a Java agent."""
    for jar in classpath:
        if jar.name.startswith("jamm-") and jar.suffix == ".jar":
            return [f"-javaagent:{jar}"]
    raise ServiceStartError(
        "the Cassandra classpath resolved by Maven has no jamm-*.jar (Cassandra's memory meter, "
        "loaded as a Java agent), so the cached classpath is damaged: delete the "
        "cassandra-*.classpath file in millstream's artifact cache and run again."
    )


def _yaml_value(value: object) -> str:
    # JSON is a subset of YAML 1.2 and SnakeYAML reads it, so json.dumps quotes paths and
    # strings safely (spaces, colons, '#') without a YAML library.
    return json.dumps(value)


def _xml_text(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _write(path: Path, text: str) -> None:
    """Replace a config file atomically, so a crash never leaves a half-written one."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text, encoding="utf-8")
    partial.replace(path)
