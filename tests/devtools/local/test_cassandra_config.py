"""The pure parts of the local Cassandra service: its config files, command line and probe."""

from __future__ import annotations

import json
import os
import socket
import struct
import threading
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from millstream.connectors.maven import MavenArtifacts
from millstream.devtools.local.cassandra import (
    DATA_DIRS,
    JVM17_MODULE_OPTIONS,
    CassandraService,
    cql_ping,
    tidy_stopped_node,
)
from millstream.devtools.local.java import JavaRuntime
from millstream.engine.config import MillstreamConfig
from millstream.engine.errors import ServiceStartError

pytestmark = pytest.mark.unit

NATIVE_PORT = 19142
STORAGE_PORT = 17100


def make_service(home: Path, java_options: tuple[str, ...] = ()) -> CassandraService:
    config = MillstreamConfig(
        home=home,
        cassandra_port=NATIVE_PORT,
        cassandra_storage_port=STORAGE_PORT,
        cassandra_java_options=java_options,
    )
    java = JavaRuntime(Path("/usr/bin/java"), 17)
    artifacts = MavenArtifacts(home / "artifacts", lambda _: None)
    return CassandraService(config, java, artifacts, lambda _: None)


def fake_classpath(tmp_path: Path) -> list[Path]:
    return [tmp_path / "m2" / "cassandra-all-5.0.9.jar", tmp_path / "m2" / "jamm-0.4.0.jar"]


def top_level_settings(text: str) -> dict[str, Any]:
    """The ``key: value`` lines of the generated YAML, whose values are all JSON."""
    settings: dict[str, Any] = {}
    for line in text.splitlines():
        if line.startswith(("#", " ")) or not line.strip():
            continue
        key, _, value = line.partition(": ")
        if value:
            settings[key] = json.loads(value)
    return settings


@pytest.fixture
def service(tmp_path: Path) -> CassandraService:
    return make_service(tmp_path / "home")


# -- cassandra.yaml ------------------------------------------------------------------------


def test_yaml_selects_paxos_v2(service: CassandraService) -> None:
    settings = top_level_settings(service.cassandra_yaml())
    assert settings["paxos_variant"] == "v2"
    # "repaired" purging needs regular Paxos repairs, which a local node never gets; "legacy"
    # kept a dropped table's Paxos state for its 10-day TTL.
    assert settings["paxos_state_purging"] == "gc_grace"


def test_yaml_binds_loopback_only_on_configured_ports(service: CassandraService) -> None:
    text = service.cassandra_yaml()
    settings = top_level_settings(text)
    assert settings["listen_address"] == "127.0.0.1"
    assert settings["rpc_address"] == "127.0.0.1"
    assert settings["native_transport_port"] == NATIVE_PORT
    assert settings["storage_port"] == STORAGE_PORT
    assert f'- seeds: "127.0.0.1:{STORAGE_PORT}"' in text
    assert "broadcast_address" not in settings
    assert "0.0.0.0" not in text


def test_yaml_names_a_single_node_cluster(service: CassandraService) -> None:
    settings = top_level_settings(service.cassandra_yaml())
    assert settings["cluster_name"] == "millstream-local"
    assert settings["partitioner"] == "org.apache.cassandra.dht.Murmur3Partitioner"
    assert settings["endpoint_snitch"] == "SimpleSnitch"
    # Acknowledged once durable: a killed single node must not lose acknowledged LWTs.
    assert settings["commitlog_sync"] == "batch"
    assert "commitlog_sync_period" not in settings
    assert settings["num_tokens"] >= 1


def test_yaml_keeps_every_directory_under_root(service: CassandraService) -> None:
    settings = top_level_settings(service.cassandra_yaml())
    root = service.root
    assert root == service.config.home / "cassandra"
    assert settings["data_file_directories"] == [str(root / "data")]
    assert settings["commitlog_directory"] == str(root / "commitlog")
    assert settings["saved_caches_directory"] == str(root / "saved_caches")
    assert settings["hints_directory"] == str(root / "hints")
    assert settings["cdc_raw_directory"] == str(root / "cdc_raw")


def test_yaml_quotes_awkward_paths(tmp_path: Path) -> None:
    service = make_service(tmp_path / "my home: #1")
    settings = top_level_settings(service.cassandra_yaml())
    assert settings["commitlog_directory"] == str(tmp_path / "my home: #1" / "cassandra/commitlog")


# -- logback.xml ---------------------------------------------------------------------------


def test_logback_writes_system_log_under_root_and_warnings_to_stdout(
    service: CassandraService,
) -> None:
    config = ET.fromstring(service.logback_xml())
    appenders = {a.get("name"): a for a in config.iter("appender")}
    assert appenders["SYSTEMLOG"].findtext("file") == str(service.root / "logs" / "system.log")
    assert appenders["SYSTEMLOG"].findtext("filter/level") == "INFO"
    assert appenders["STDOUT"].findtext("filter/level") == "WARN"
    assert config.find("shutdownHook") is None  # Cassandra stops logback after its drain


# -- prepare() -----------------------------------------------------------------------------


def test_prepare_creates_the_layout(service: CassandraService) -> None:
    service.prepare()
    for name in ("conf", "logs", *DATA_DIRS):
        assert (service.root / name).is_dir(), name
    assert (service.root / "conf" / "cassandra.yaml").read_text() == service.cassandra_yaml()
    assert (service.root / "conf" / "logback.xml").read_text() == service.logback_xml()


def test_prepare_is_idempotent_and_keeps_data(service: CassandraService) -> None:
    service.prepare()
    sstable = service.root / "data" / "ks" / "table-0" / "nb-1-big-Data.db"
    sstable.parent.mkdir(parents=True)
    sstable.write_bytes(b"rows")
    segment = service.root / "commitlog" / "CommitLog-8-1.log"
    segment.write_bytes(b"mutations")
    yaml_file = service.root / "conf" / "cassandra.yaml"
    yaml_file.write_text("paxos_variant: v1\n")  # a hand edit, which prepare() replaces

    service.prepare()
    service.prepare()

    assert sstable.read_bytes() == b"rows"
    assert segment.read_bytes() == b"mutations"
    assert yaml_file.read_text() == service.cassandra_yaml()
    assert not list((service.root / "conf").glob("*.partial"))


# -- tidy_stopped_node() ------------------------------------------------------------------

LIVE_TABLE = "5bc52802-de25-35ed-aeab-188eecebb090"
DROPPED_TABLE = "c6cec6e0-ea1c-11f1-b9dc-1f245ee24605"


def test_a_stopped_node_forgets_dropped_tables_paxos_state_and_the_compaction_history(
    tmp_path: Path,
) -> None:
    system = tmp_path / "data" / "system"
    state = system / "_paxos_repair_state"
    history = system / "compaction_history-b4dbb7b4dc493fb5b3bfce6e434832ca"
    peers = system / "peers_v2-c4325fbb8e5e3bafbd070f9250ed818e"
    for directory in (state, history / "backups", peers):
        directory.mkdir(parents=True)
    live = [state / f"system_auth-roles-{LIVE_TABLE}-3.paxos", state / "ballot.meta"]
    dropped = [
        state / f"bench_032176ba-intervals-{DROPPED_TABLE}-0.paxos",
        state / f"bench_032176ba-intervals-{DROPPED_TABLE}-0.paxos.crc",
        state / f"UNKNOWN-UNKNOWN-{DROPPED_TABLE}-2.paxos",
    ]
    newer = state / "ks-t-0072a0e0-ea33-11f1-9ba3-5d7b8e632c8c-1.paxos"  # after the read
    logged = [history / "nb-5254-big-Data.db", history / "nb_txn_compaction_1.log"]
    sstable = peers / "nb-1-big-Data.db"
    for path in (*live, *dropped, *logged, sstable):
        path.write_bytes(b"x")
        os.utime(path, (1_000.0, 1_000.0))
    newer.write_bytes(b"x")
    os.utime(newer, (3_000.0, 3_000.0))

    assert tidy_stopped_node(tmp_path, {LIVE_TABLE}, since=2_000.0) == len(dropped)

    assert not any(path.exists() for path in (*dropped, *logged))
    assert all(path.exists() for path in (*live, newer, sstable))
    assert (history / "backups").is_dir()  # directories stay; Cassandra expects them


def test_tidying_a_node_that_never_started_does_nothing(tmp_path: Path) -> None:
    assert tidy_stopped_node(tmp_path, set(), since=2_000.0) == 0


# -- argv() --------------------------------------------------------------------------------


def test_argv_runs_the_daemon_with_our_marker(service: CassandraService, tmp_path: Path) -> None:
    classpath = fake_classpath(tmp_path)
    argv = service.argv(classpath)
    assert argv[0] == "/usr/bin/java"
    assert argv[-1] == "org.apache.cassandra.service.CassandraDaemon"
    assert service.process.marker in argv
    assert argv[argv.index("-cp") + 1] == ":".join(str(jar) for jar in classpath)


def test_argv_opens_the_jdk_internals_java_17_needs(
    service: CassandraService, tmp_path: Path
) -> None:
    argv = service.argv(fake_classpath(tmp_path))
    for option in JVM17_MODULE_OPTIONS:
        assert option in argv
    assert "--add-opens=java.base/sun.nio.ch=ALL-UNNAMED" in argv
    assert "--add-exports=java.base/jdk.internal.misc=ALL-UNNAMED" in argv


def test_argv_points_cassandra_at_our_files(service: CassandraService, tmp_path: Path) -> None:
    argv = service.argv(fake_classpath(tmp_path))
    conf = service.root / "conf"
    assert f"-Dcassandra.config={(conf / 'cassandra.yaml').as_uri()}" in argv
    assert f"-Dlogback.configurationFile={conf / 'logback.xml'}" in argv
    assert f"-Dcassandra.logdir={service.root / 'logs'}" in argv
    assert f"-Dcassandra.storagedir={service.root}" in argv
    assert "-Dcassandra-foreground=yes" in argv
    assert f"-javaagent:{tmp_path / 'm2' / 'jamm-0.4.0.jar'}" in argv


def test_argv_sizes_the_heap_and_opens_no_jmx_port(
    service: CassandraService, tmp_path: Path
) -> None:
    argv = service.argv(fake_classpath(tmp_path))
    assert "-Xmx1G" in argv
    assert [a for a in argv if a.startswith("-Xms")] == ["-Xms256m"]
    jmx_ports = ("cassandra.jmx.local.port", "cassandra.jmx.remote.port", "jmxremote.port")
    assert not [a for a in argv if any(port in a for port in jmx_ports)]
    assert "-XX:+AlwaysPreTouch" not in argv


def test_argv_ends_with_the_configured_java_options(tmp_path: Path) -> None:
    service = make_service(tmp_path / "home", ("-XX:TieredStopAtLevel=1", "-Da=b"))
    argv = service.argv(fake_classpath(tmp_path))
    # Later JVM options win: after the node's own, only the classpath and main class.
    assert argv[argv.index("-cp") - 2 : argv.index("-cp")] == ["-XX:TieredStopAtLevel=1", "-Da=b"]
    assert "-XX:TieredStopAtLevel=1" not in make_service(tmp_path / "other").argv(
        fake_classpath(tmp_path)
    )


def test_argv_without_jamm_says_what_to_do(service: CassandraService, tmp_path: Path) -> None:
    with pytest.raises(ServiceStartError, match=r"jamm-\*\.jar.*delete"):
        service.argv([tmp_path / "cassandra-all-5.0.9.jar"])


def test_ports_and_address(service: CassandraService) -> None:
    assert service.ports() == [("native transport", NATIVE_PORT), ("storage", STORAGE_PORT)]
    assert service.address() == f"127.0.0.1:{NATIVE_PORT}"


# -- the CQL probe behind healthy() ----------------------------------------------------------

Handler = Callable[[socket.socket], None]


def _frame(stream: int, opcode: int, body: bytes) -> bytes:
    return struct.pack(">BBhBi", 0x84, 0, stream, opcode, len(body)) + body


def _read_frame(conn: socket.socket) -> tuple[int, int, bytes]:
    header = b""
    while len(header) < 9:
        header += conn.recv(9 - len(header))
    _, _, stream, opcode, length = struct.unpack(">BBhBi", header)
    body = b""
    while len(body) < length:
        body += conn.recv(length - len(body))
    return stream, opcode, body


def _cassandra_like(reply: bytes) -> Handler:
    """A server that answers STARTUP with READY and the health query with ``reply``."""

    def handle(conn: socket.socket) -> None:
        stream, opcode, _ = _read_frame(conn)
        assert opcode == 0x01  # STARTUP
        conn.sendall(_frame(stream, 0x02, b""))  # READY
        stream, opcode, body = _read_frame(conn)
        assert opcode == 0x07  # QUERY
        assert b"SELECT release_version FROM system.local" in body
        conn.sendall(reply)

    return handle


@pytest.fixture
def fake_server() -> Iterator[Callable[[Handler], int]]:
    servers: list[socket.socket] = []

    def serve(handler: Handler) -> int:
        server = socket.create_server(("127.0.0.1", 0))
        servers.append(server)

        def run() -> None:
            conn, _ = server.accept()
            with conn:
                handler(conn)

        threading.Thread(target=run, daemon=True).start()
        port: int = server.getsockname()[1]
        return port

    yield serve
    for server in servers:
        server.close()


def test_probe_accepts_a_rows_result(fake_server: Callable[[Handler], int]) -> None:
    rows = struct.pack(">i", 2) + b"\x00" * 12
    port = fake_server(_cassandra_like(_frame(2, 0x08, rows)))
    assert cql_ping("127.0.0.1", port)


def test_probe_rejects_an_error(fake_server: Callable[[Handler], int]) -> None:
    message = b"Cannot achieve consistency level ONE"
    error = struct.pack(">iH", 0x1000, len(message)) + message
    port = fake_server(_cassandra_like(_frame(2, 0x00, error)))
    assert not cql_ping("127.0.0.1", port)


def test_probe_survives_garbage_and_hangups(fake_server: Callable[[Handler], int]) -> None:
    garbage = fake_server(lambda conn: conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n"))
    assert not cql_ping("127.0.0.1", garbage, timeout=1.0)
    hangup = fake_server(lambda conn: None)
    assert not cql_ping("127.0.0.1", hangup, timeout=1.0)
    short = fake_server(_cassandra_like(_frame(2, 0x08, b"\x00")))
    assert not cql_ping("127.0.0.1", short, timeout=1.0)


def test_probe_of_a_closed_port_is_false() -> None:
    with socket.create_server(("127.0.0.1", 0)) as placeholder:
        port = placeholder.getsockname()[1]
    assert not cql_ping("127.0.0.1", port, timeout=0.5)
