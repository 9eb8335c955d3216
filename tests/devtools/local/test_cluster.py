"""The replicated local stack (`millstream up --nodes 3`): its nodes' configuration, and the
running cluster surviving the loss of a node.

The integration tests share one three-node Cassandra and Kafka cluster on 127.0.0.2-4,
started by the module fixture unless it already runs (and stopped again if the fixture
started it). The fault tests kill one node with SIGKILL by its pid, as a fault harness does,
check that the store and the producers go on with two of three, then bring the node back
with its ``up()`` and check that it rejoined.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeVar, cast

import pytest
from cassandra import ConsistencyLevel
from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile, Session
from cassandra.policies import WhiteListRoundRobinPolicy
from cassandra.pool import Host
from cassandra.query import SimpleStatement
from confluent_kafka import KafkaException
from confluent_kafka.admin import ConfigResource, NewTopic, ResourceType

from millstream import cli
from millstream.connectors import cassandra as cassandra_connector
from millstream.connectors import kafka as kafka_connector
from millstream.connectors.kafka import topics as kafka_topics
from millstream.connectors.maven import MavenArtifacts
from millstream.devtools.local import stack as stack_module
from millstream.devtools.local.cassandra import CassandraService
from millstream.devtools.local.java import JavaRuntime
from millstream.devtools.local.kafka import KafkaService
from millstream.devtools.local.service import LocalService, Node, ServiceStatus
from millstream.devtools.local.stack import CLUSTER_HOSTS, LocalCluster, LocalStack
from millstream.engine.clock import SystemClock
from millstream.engine.config import MillstreamConfig, load_config
from millstream.engine.productions import Production
from millstream.engine.records import Record, decode_record, injector_record_id
from millstream.engine.state import KeyChanges
from millstream.engine.stores.cassandra import (
    CassandraIntervalStore,
    create_schema,
    execute_schema_change,
)
from tests.devtools.local.test_cassandra_config import top_level_settings
from tests.jvm_options import for_short_lived_services
from tests.waiting import wait_until

# Alone on the machine under scripts/test's two workers: the replicated stack's six JVMs
# load both cores.
pytestmark = pytest.mark.exclusive

_T = TypeVar("_T")

JAVA = JavaRuntime(Path("/usr/bin/java"), 17)
TTL = 60 * 1_000_000


def _progress(message: str) -> None:
    line = f"[cluster {time.strftime('%H:%M:%S')}] {message}\n"
    print(line, end="", file=sys.stderr, flush=True)  # one write: nodes report from threads


def _unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


# -- node N's configuration (unit) ---------------------------------------------------------


def _node(backend: type[LocalService], home: Path, number: int) -> Any:
    config = MillstreamConfig(home=home)
    artifacts = MavenArtifacts(home / "artifacts", lambda _: None)
    return backend(config, JAVA, artifacts, lambda _: None, Node(CLUSTER_HOSTS, number))


def _properties(service: KafkaService) -> dict[str, str]:
    lines = service.server_properties().splitlines()
    return dict(line.split("=", 1) for line in lines)


@pytest.mark.unit
@pytest.mark.parametrize("number", [1, 2, 3])
def test_cassandra_node_n_binds_its_alias_and_joins_the_seed(tmp_path: Path, number: int) -> None:
    service: CassandraService = _node(CassandraService, tmp_path, number)
    host = f"127.0.0.{number + 1}"
    text = service.cassandra_yaml()
    settings = top_level_settings(text)
    assert service.name == f"cassandra-{number}"
    assert service.address() == f"{host}:9042"
    assert service.ports() == [("native transport", 9042), ("storage", 7000)]
    assert settings["listen_address"] == host
    assert settings["rpc_address"] == host
    assert settings["native_transport_port"] == 9042
    assert settings["storage_port"] == 7000
    assert '- seeds: "127.0.0.2:7000"' in text
    assert settings["cluster_name"] == "millstream-local-cluster"  # never the single node's
    # The seed starts the ring; the others bootstrap into it.
    assert settings["auto_bootstrap"] is (number != 1)
    assert settings["allocate_tokens_for_local_replication_factor"] == 3
    assert settings["paxos_variant"] == "v2"
    root = tmp_path / "cluster" / f"cassandra-{number}"
    assert service.root == root
    assert settings["data_file_directories"] == [str(root / "data")]
    for key, directory in [
        ("commitlog_directory", "commitlog"),
        ("saved_caches_directory", "saved_caches"),
        ("hints_directory", "hints"),
        ("cdc_raw_directory", "cdc_raw"),
    ]:
        assert settings[key] == str(root / directory)
    assert service.process.pid_file == root / f"cassandra-{number}.pid"
    assert service.process.log_file == root / "logs" / f"cassandra-{number}.out"


@pytest.mark.unit
def test_cassandra_nodes_keep_the_small_heap_and_gossip_for_real(tmp_path: Path) -> None:
    classpath = [tmp_path / "cassandra-all-5.0.9.jar", tmp_path / "jamm-0.4.0.jar"]
    argv = _node(CassandraService, tmp_path, 2).argv(classpath)
    assert "-Xmx1G" in argv
    assert [a for a in argv if a.startswith("-Xms")] == ["-Xms256m"]
    assert f"-Dmillstream.service={tmp_path / 'cluster' / 'cassandra-2'}" in argv
    # A real ring delay: the shadow round, fat-client timeout and pending-range wait of a
    # joining node are derived from it (100 ms made joins fail).
    assert "-Dcassandra.ring_delay_ms=5000" in argv
    assert "-Dcassandra.shutdown_announce_in_ms=0" not in argv
    single = CassandraService(
        MillstreamConfig(home=tmp_path), JAVA, MavenArtifacts(tmp_path, print), print
    )
    assert "-Dcassandra.ring_delay_ms=100" in single.argv(classpath)


@pytest.mark.unit
@pytest.mark.parametrize("number", [1, 2, 3])
def test_kafka_node_n_is_broker_and_voter_n(tmp_path: Path, number: int) -> None:
    service: KafkaService = _node(KafkaService, tmp_path, number)
    host = f"127.0.0.{number + 1}"
    properties = _properties(service)
    assert service.name == f"kafka-{number}"
    assert service.address() == f"{host}:9092"
    assert properties["node.id"] == str(number)
    assert properties["process.roles"] == "broker,controller"
    assert properties["controller.quorum.voters"] == (
        "1@127.0.0.2:9093,2@127.0.0.3:9093,3@127.0.0.4:9093"
    )
    assert properties["listeners"] == f"PLAINTEXT://{host}:9092,CONTROLLER://{host}:9093"
    assert properties["advertised.listeners"] == f"PLAINTEXT://{host}:9092"
    assert properties["log.dirs"] == str(tmp_path / "cluster" / f"kafka-{number}" / "data")
    assert properties["default.replication.factor"] == "3"
    assert properties["min.insync.replicas"] == "2"
    assert properties["offsets.topic.replication.factor"] == "3"
    assert properties["transaction.state.log.replication.factor"] == "3"
    assert properties["transaction.state.log.min.isr"] == "2"
    # The last broker of the nodes stopped together would wait for a quorum that is gone.
    assert properties["controlled.shutdown.enable"] == "false"


@pytest.mark.unit
def test_the_single_kafka_node_keeps_one_replica(tmp_path: Path) -> None:
    service = KafkaService(
        MillstreamConfig(home=tmp_path), JAVA, MavenArtifacts(tmp_path, print), print
    )
    properties = _properties(service)
    assert service.name == "kafka"
    assert service.root == tmp_path / "kafka"
    assert properties["node.id"] == "1"
    assert properties["controller.quorum.voters"] == "1@127.0.0.1:9093"
    assert properties["default.replication.factor"] == "1"
    assert properties["min.insync.replicas"] == "1"
    assert properties["offsets.topic.replication.factor"] == "1"
    assert "controlled.shutdown.enable" not in properties


@pytest.mark.unit
def test_the_kafka_nodes_share_one_cluster_id_even_when_formatted_at_once(
    tmp_path: Path,
) -> None:
    nodes = [_node(KafkaService, tmp_path, number) for number in (1, 2, 3)]
    ids: list[str] = []
    threads = [threading.Thread(target=lambda n=n: ids.append(n._cluster_id())) for n in nodes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(ids) == 3
    assert len(set(ids)) == 1
    assert (tmp_path / "cluster" / "kafka-cluster-id").read_text() == ids[0]
    assert sorted(p.name for p in (tmp_path / "cluster").iterdir()) == ["kafka-cluster-id"]
    # Each single node formats with a cluster id of its own and leaves no file behind.
    single = KafkaService(
        MillstreamConfig(home=tmp_path), JAVA, MavenArtifacts(tmp_path, print), print
    )
    assert single._cluster_id() != ids[0]


@pytest.mark.unit
def test_the_stack_names_its_nodes_and_says_how_to_reach_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stack_module, "find_java", lambda: JAVA)
    config = MillstreamConfig(home=tmp_path)
    cluster = LocalCluster(config, print)
    assert [s.name for s in cluster.services] == [
        "cassandra-1",
        "cassandra-2",
        "cassandra-3",
        "kafka-1",
        "kafka-2",
        "kafka-3",
    ]
    client = cluster.client_config()
    assert client.kafka_bootstrap == "127.0.0.2:9092,127.0.0.3:9092,127.0.0.4:9092"
    assert client.cassandra_hosts == ("127.0.0.2", "127.0.0.3", "127.0.0.4")
    assert (client.cassandra_replication, client.kafka_replication) == (3, 3)
    assert client.home == tmp_path
    # The variables it prints give that configuration back.
    assert load_config(environ=cluster.client_environment(), path=None) == (
        MillstreamConfig(
            kafka_bootstrap=client.kafka_bootstrap,
            cassandra_hosts=client.cassandra_hosts,
            cassandra_replication=3,
            kafka_replication=3,
        )
    )
    single = LocalStack(config, print)
    assert [s.name for s in single.services] == ["cassandra", "kafka"]
    assert single.client_config() == config
    with pytest.raises(ValueError, match="1 or 3 nodes, not 2"):
        LocalStack(config, print, nodes=2)


class _FakeNode:
    """Records when it starts and becomes ready, like a node whose start takes a while."""

    def __init__(self, name: str, alone: bool, events: list[str]) -> None:
        self.name, self.alone, self.events = name, alone, events

    def starts_alone(self) -> bool:
        return self.alone

    def up(self) -> ServiceStatus:
        self.events.append(f"start {self.name}")
        time.sleep(0.3)
        self.events.append(f"ready {self.name}")
        return ServiceStatus(self.name, 1, "127.0.0.9:1", True)


@pytest.mark.unit
def test_nodes_that_may_start_together_do_then_the_others_one_by_one() -> None:
    events: list[str] = []
    nodes = [
        _FakeNode("n1", alone=True, events=events),
        _FakeNode("n2", alone=False, events=events),
        _FakeNode("n3", alone=True, events=events),
        _FakeNode("n4", alone=False, events=events),
    ]
    statuses = stack_module._start_backend(cast(list[LocalService], nodes))
    assert sorted(events[:2]) == ["start n2", "start n4"]  # together: both before either is ready
    assert sorted(events[2:4]) == ["ready n2", "ready n4"]
    assert events[4:] == ["start n1", "ready n1", "start n3", "ready n3"]
    assert [s.name for s in statuses] == ["n2", "n4", "n1", "n3"]


@pytest.mark.unit
def test_a_cassandra_node_starts_alone_until_it_joined_its_ring(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    service: CassandraService = _node(CassandraService, tmp_path, 2)
    service.prepare()
    assert service.starts_alone()
    healthy = ServiceStatus(service.name, 4242, service.address(), True)
    monkeypatch.setattr(LocalService, "up", lambda self: healthy)
    assert service.up() == healthy
    assert not service.starts_alone()  # it restarts with its tokens, beside the others
    assert not _node(KafkaService, tmp_path, 2).starts_alone()


@pytest.mark.unit
@pytest.mark.parametrize("command", ["up", "status", "down"])
def test_the_cli_offers_one_or_three_nodes(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as refused:
        cli.main([command, "--nodes", "2"])
    assert refused.value.code == 2
    assert "invalid choice: 2 (choose from 1, 3)" in capsys.readouterr().err


class _FakeAdmin:
    def __init__(self) -> None:
        self.topics: list[NewTopic] = []

    def create_topics(self, topics: list[NewTopic], operation_timeout: float) -> dict[str, Any]:
        self.topics.extend(topics)
        return {}


@pytest.mark.unit
def test_topics_get_the_configured_replication(monkeypatch: pytest.MonkeyPatch) -> None:
    admin = _FakeAdmin()
    monkeypatch.setattr(kafka_topics, "admin_client", lambda config: admin)
    config = MillstreamConfig(kafka_replication=3)
    kafka_connector.create_topics(config, ["a"], partitions=2)
    kafka_connector.create_wake_topics(config, ["w"])
    kafka_connector.create_topics(config, ["b"], replication=1)  # an explicit choice wins
    assert [(t.topic, t.replication_factor) for t in admin.topics] == [
        ("a", 3),
        ("w", 3),
        ("b", 1),
    ]


@pytest.mark.unit
def test_keyspaces_get_the_given_replication_and_time_for_schema_agreement() -> None:
    statements: list[tuple[str, float | None]] = []

    class Recorder:
        default_timeout = 10.0
        cluster = SimpleNamespace(max_schema_agreement_wait=15)

        def execute(self, statement: str, timeout: float | None) -> None:
            statements.append((statement, timeout))

    cassandra_connector.create_keyspace(cast(Session, Recorder()), "ks", 3)
    cassandra_connector.drop_keyspace(cast(Session, Recorder()), "ks")
    # The driver's wait for agreement counts against the request's timeout: a node just back
    # took most of it once, and DROP KEYSPACE timed out on the client, applied.
    assert statements == [
        (
            "CREATE KEYSPACE IF NOT EXISTS ks WITH replication = "
            "{'class': 'SimpleStrategy', 'replication_factor': 3}",
            25.0,
        ),
        ("DROP KEYSPACE IF EXISTS ks", 25.0),
    ]


@pytest.mark.unit
def test_node_addresses_are_checked() -> None:
    with pytest.raises(ValueError, match="node 4 is not one of the 3"):
        Node(CLUSTER_HOSTS, 4)
    with pytest.raises(ValueError, match="address of its own"):
        Node(("127.0.0.2", "127.0.0.2"), 1)
    assert Node().name("kafka") == "kafka"
    assert (Node(CLUSTER_HOSTS, 2).replication, Node(CLUSTER_HOSTS, 2).majority) == (3, 2)
    assert (Node().replication, Node().majority) == (1, 1)


# -- the running cluster (integration) -----------------------------------------------------


@pytest.fixture(scope="module")
def cluster(
    start_stack: Callable[[LocalCluster, Callable[[str], None]], AbstractContextManager[None]],
) -> Iterator[LocalCluster]:
    """The three-node stack, started unless it runs; what this module started is stopped,
    and a node that was running and a failed test left dead is brought back."""
    stack = LocalCluster(for_short_lived_services(load_config()), _progress)
    with start_stack(stack, _progress):
        yield stack


@pytest.fixture(autouse=True)
def _nodes_brought_back(request: pytest.FixtureRequest) -> Iterator[None]:
    """A node a failed test left killed is started again after it, so that the tests after
    it find the three nodes they expect instead of failing for the first one's reason."""
    yield
    if "cluster" not in request.fixturenames:
        return
    stack: LocalCluster = request.getfixturevalue("cluster")
    for service in stack.services:
        if service.process.running_pid() is None:
            _progress(f"{service.name} was left down by {request.node.name}: starting it")
            assert service.up().healthy, f"{service.name} did not come back"


@pytest.fixture(scope="module")
def client(cluster: LocalCluster) -> MillstreamConfig:
    return cluster.client_config()


@pytest.fixture(scope="module")
def session(client: MillstreamConfig) -> Iterator[Session]:
    handle, session = cassandra_connector.connect(client)
    try:
        yield session
    finally:
        handle.shutdown()


def _nodes(cluster: LocalCluster, backend: type[LocalService]) -> list[Any]:
    return [s for s in cluster.services if isinstance(s, backend)]


@contextmanager
def _node_session(client: MillstreamConfig, host: str) -> Iterator[Session]:
    """A session whose every request is coordinated by the node at ``host``."""
    only_there = ExecutionProfile(load_balancing_policy=WhiteListRoundRobinPolicy([host]))
    handle = Cluster(
        contact_points=[host],
        port=client.cassandra_port,
        protocol_version=5,
        execution_profiles={EXEC_PROFILE_DEFAULT: only_there},
    )
    try:
        yield handle.connect()
    finally:
        handle.shutdown()


def _eventually(what: str, condition: Callable[[], _T], timeout: float) -> _T:
    """:func:`wait_until` every half second; while a node restarts, the clients' errors
    (refused, timed out, unavailable) mean "not yet"."""
    return wait_until(what, condition, timeout, every=0.5, not_yet=(Exception,))


def _open_connections(session: Session, host: Host) -> int:
    # A host the driver marked down has no pool at all (its pool is removed, not emptied).
    pool = session.get_pool_state().get(host)
    return 0 if pool is None else int(pool["open_count"])


def _rows(session: Session, query: SimpleStatement) -> list[Any]:
    return list(session.execute(query))


def _kill(service: LocalService) -> int:
    pid = service.process.running_pid()
    assert pid is not None, f"{service.name} is not running"
    os.kill(pid, signal.SIGKILL)
    _eventually(
        f"{service.name} (pid {pid}) to die",
        lambda: service.process.running_pid() is None,
        30,
    )
    return pid


@pytest.mark.integration
def test_the_cluster_is_whole(cluster: LocalCluster, client: MillstreamConfig) -> None:
    statuses = cluster.status()
    assert [s.name for s in statuses if s.healthy] == [s.name for s in cluster.services]
    for host in CLUSTER_HOSTS:
        with _node_session(client, host) as node:
            local = node.execute("SELECT broadcast_address FROM system.local").one()
            assert str(local.broadcast_address) == host
            peers = {str(row.peer): row for row in node.execute("SELECT * FROM system.peers")}
            assert sorted(peers) == sorted(set(CLUSTER_HOSTS) - {host}), host
            assert all(len(row.tokens) == 16 for row in peers.values())
            gossip = node.execute("SELECT address, status_with_port FROM system_views.gossip_info")
            assert sorted((str(r.address), r.status_with_port.split(",")[0]) for r in gossip) == [
                (h, "NORMAL") for h in CLUSTER_HOSTS
            ]

    admin = kafka_connector.admin_client(client)
    brokers = admin.list_topics(timeout=10).brokers
    assert {b.id: f"{b.host}:{b.port}" for b in brokers.values()} == {
        1: "127.0.0.2:9092",
        2: "127.0.0.3:9092",
        3: "127.0.0.4:9092",
    }
    topic = _unique("cluster")
    kafka_connector.create_topics(client, [topic], partitions=3)  # replication from client
    try:
        partitions = _eventually(
            f"{topic} to have 3 partitions with 3 replicas in sync",
            lambda: _partitions_in_sync(client, topic, 3),
            30,
        )
        assert sorted(partitions) == [0, 1, 2]
        assert all(sorted(p.replicas) == [1, 2, 3] for p in partitions.values())
        resource = ConfigResource(ResourceType.TOPIC, topic)
        # The broker that answers may learn of the new topic a moment after the others.
        entries = _eventually(
            f"the configuration of {topic}",
            lambda: admin.describe_configs([resource])[resource].result(timeout=10),
            30,
        )
        assert entries["min.insync.replicas"].value == "2"
    finally:
        kafka_connector.delete_topics(client, [topic])


def _partitions_in_sync(client: MillstreamConfig, topic: str, in_sync: int) -> Any:
    metadata = kafka_connector.admin_client(client).list_topics(topic, timeout=10).topics[topic]
    if metadata.error is not None or not metadata.partitions:
        return None
    if all(len(p.isrs) == in_sync for p in metadata.partitions.values()):
        return metadata.partitions
    return None


@pytest.mark.integration
def test_the_store_goes_on_with_one_cassandra_node_down_and_the_node_rejoins(
    cluster: LocalCluster, client: MillstreamConfig, session: Session
) -> None:
    keyspace = _unique("cluster")
    started = time.monotonic()
    cassandra_connector.create_keyspace(session, keyspace, client.cassandra_replication)
    try:
        replication = session.cluster.metadata.keyspaces[keyspace].replication_strategy
        assert replication.replication_factor == 3
        create_schema(session, keyspace)
        store = CassandraIntervalStore(session, keyspace, SystemClock())
        lease = store.acquire("c", 0)
        store.commit(lease, [KeyChanges("k", b"before")], dedup_ttl=TTL)

        # The seed: its restart is the one that finds no other seed to ask.
        victim = next(s for s in _nodes(cluster, CassandraService) if s.node.number == 1)
        _progress(f"keyspace and first commit: {time.monotonic() - started:.1f}s")
        started = time.monotonic()
        _kill(victim)
        host = session.cluster.metadata.get_host(victim.host)
        # Once the driver saw its connections reset (within a second), it sends nothing to
        # the dead node; the other nodes' failure detectors still think it alive, for ten
        # seconds or more, so every replica set below includes it.
        _eventually(
            "the driver to lose its connections to the killed node",
            lambda: _open_connections(session, host) == 0,
            30,
        )
        _progress(
            f"{victim.name} killed, its connections gone in {time.monotonic() - started:.1f}s"
        )

        # The same worker goes on: its sequencer LWT (Paxos at SERIAL, commit at QUORUM)
        # and its conditional batches need two of three replicas.
        started = time.monotonic()
        lease = store.acquire("c", 0, lease)
        assert lease.cache_valid
        store.commit(lease, [KeyChanges("k", b"while down")], dedup_ttl=TTL)
        assert store.read_state(lease, "k") == b"while down"
        # A new worker takes another interval for the first time (INSERT ... IF NOT EXISTS).
        other = CassandraIntervalStore(session, keyspace, SystemClock())
        fresh = other.acquire("c", 1)
        other.commit(fresh, [KeyChanges("j", b"new")], dedup_ttl=TTL)
        assert other.read_state(fresh, "j") == b"new"
        assert store.sequencer("c", 0) == lease.token
        _progress(f"the store with {victim.name} down: {time.monotonic() - started:.1f}s")

        started = time.monotonic()
        status = victim.up()
        assert status.healthy
        assert status.pid is not None
        _progress(f"{victim.name} restarted in {time.monotonic() - started:.1f}s")
        # Rejoined: every node, as coordinator, reaches all three replicas (a read at ALL
        # fails while any of them thinks one is down) and sees the latest writes.
        query = SimpleStatement(
            f"SELECT computation, interval, key, value FROM {keyspace}.intervals "
            "WHERE kind = 'state' ALLOW FILTERING",
            consistency_level=ConsistencyLevel.ALL,
        )
        for node_host in CLUSTER_HOSTS:
            with _node_session(client, node_host) as node:
                rows = _eventually(
                    f"a read at ALL coordinated by {node_host}",
                    partial(_rows, node, query),
                    60,
                )
                assert sorted((r.interval, r.key, r.value) for r in rows) == [
                    (0, "k", b"while down"),
                    (1, "j", b"new"),
                ]
        assert all(s.status().healthy for s in _nodes(cluster, CassandraService))
        _progress(f"{victim.name} rejoined after {time.monotonic() - started:.1f}s")
        _eventually("the driver to see the node up again", lambda: host.is_up, 60)
    finally:
        cassandra_connector.drop_keyspace(session, keyspace)


@pytest.mark.integration
def test_a_node_stopped_forgets_the_paxos_state_of_dropped_tables_and_keeps_the_live_ones(
    cluster: LocalCluster, client: MillstreamConfig, session: Session
) -> None:
    keyspace = _unique("tidy")
    cassandra_connector.create_keyspace(session, keyspace, client.cassandra_replication)
    victim = next(s for s in _nodes(cluster, CassandraService) if s.node.number == 3)
    state = victim.root / "data" / "system" / "_paxos_repair_state"
    history = next((victim.root / "data" / "system").glob("compaction_history-*"))
    try:
        execute_schema_change(session, f"CREATE TABLE {keyspace}.t (k int PRIMARY KEY)")
        live_id = (
            session.execute(
                "SELECT id FROM system_schema.tables WHERE keyspace_name = %s AND table_name = 't'",
                (keyspace,),
            )
            .one()
            .id
        )
        # Files as Paxos v2 names them, written long ago: one of a table that exists, one of
        # a table that does not (any more). The node reads neither while it runs.
        live = state / f"{keyspace}-t-{live_id}-9.paxos"
        dropped = state / f"{keyspace}-gone-{uuid.uuid1()}-9.paxos"
        for path in (live, dropped):
            path.write_bytes(b"")
            os.utime(path, (time.time() - 3_600,) * 2)

        assert victim.down()

        assert live.exists()
        assert not dropped.exists()
        assert not [p for p in history.iterdir() if p.is_file()]
    finally:
        for path in state.glob(f"{keyspace}-*"):
            path.unlink()  # the node must not read the empty files at its start
        if victim.process.running_pid() is None:
            assert victim.up().healthy
            host = session.cluster.metadata.get_host(victim.host)
            _eventually("the driver to see the node up again", lambda: host.is_up, 60)
        cassandra_connector.drop_keyspace(session, keyspace)


@pytest.mark.integration
def test_acks_all_go_on_with_one_broker_down_and_the_broker_rejoins(
    cluster: LocalCluster, client: MillstreamConfig
) -> None:
    topic = _unique("cluster")
    kafka_connector.create_topics(client, [topic], partitions=2)
    sink = kafka_connector.KafkaProductionSink(client)
    try:
        partitions = _eventually(
            f"{topic} in sync on 3 brokers",
            lambda: _partitions_in_sync(client, topic, 3),
            30,
        )
        before = [_production(topic, n) for n in range(50)]
        assert sink.send(before, timeout=30) == {p.record_id for p in before}

        # The leader of partition 0: its loss needs an election and an ISR shrink.
        leader = partitions[0].leader
        victim = next(s for s in _nodes(cluster, KafkaService) if s.node.number == leader)
        _kill(victim)

        during = [_production(topic, n) for n in range(50, 150)]
        started = time.monotonic()
        acknowledged = sink.send(during, timeout=120)
        assert acknowledged == {p.record_id for p in during}
        _progress(f"acks=all with {victim.name} down: {time.monotonic() - started:.1f}s")
        # The dead broker left every ISR (the broker that answers may lag a moment).
        survivors = _eventually(
            f"{victim.name} out of the ISRs of {topic}",
            lambda: _partitions_in_sync(client, topic, 2),
            30,
        )
        assert all(leader not in p.isrs for p in survivors.values())

        # Everything acknowledged is there, read by a consumer group (its coordinator lives
        # on the RF-3 offsets topic, which must not need the third broker either).
        records = _consume(client, topic, len(before) + len(during))
        assert sorted(r.record_id for r in records) == sorted(p.record_id for p in before + during)

        started = time.monotonic()
        status = victim.up()
        assert status.healthy
        assert status.pid is not None
        _progress(f"{victim.name} restarted in {time.monotonic() - started:.1f}s")
        _eventually(
            f"{victim.name} back in the ISR of every partition of {topic}",
            lambda: _partitions_in_sync(client, topic, 3),
            90,
        )
        _progress(f"{victim.name} rejoined after {time.monotonic() - started:.1f}s")
        brokers = kafka_connector.admin_client(client).list_topics(timeout=10).brokers
        assert sorted(brokers) == [1, 2, 3]
        after = [_production(topic, n) for n in range(150, 160)]
        assert sink.send(after, timeout=30) == {p.record_id for p in after}
        assert sink.close() == 0
    finally:
        sink.close()
        kafka_connector.delete_topics(client, [topic])


def _production(topic: str, n: int) -> Production:
    record = Record(
        f"key-{n % 7}", f"v{n}".encode(), 1_000_000 + n, injector_record_id(topic, 0, n)
    )
    return Production(topic, record)


def _consume(client: MillstreamConfig, topic: str, expected: int) -> list[Record]:
    reader = kafka_connector.consumer(client, "cluster-test")
    reader.subscribe([topic])
    records: list[Record] = []
    deadline = time.monotonic() + 60
    try:
        while len(records) < expected and time.monotonic() < deadline:
            message = reader.poll(0.5)
            if message is None:
                continue
            if message.error() is not None:
                raise KafkaException(message.error())
            value = message.value()
            assert value is not None
            records.append(decode_record(value))
        # Anything past ``expected`` (a duplicate) must show up too.
        while (message := reader.poll(1.0)) is not None:
            value = message.value()
            assert value is not None
            records.append(decode_record(value))
    finally:
        reader.close()
    return records


@pytest.mark.integration
def test_the_proving_ground_on_the_cluster_commits_through_a_node_and_a_broker_killed(
    cluster: LocalCluster, client: MillstreamConfig
) -> None:
    from millstream.devtools.proving.ground import TIERS, prove

    report = prove(
        client,
        TIERS["ci"],
        seed=5,
        services=cluster.services,
        kinds=("cassandra", "kafka"),
        progress=_progress,
        environment=cluster.client_environment(),
    )
    text = report.render()
    print(text)
    assert [o.fault.kind for o in report.outcomes] in (
        ["cassandra", "kafka"],
        ["kafka", "cassandra"],
    ), text
    for outcome in report.outcomes:
        # One node of three killed; batches committed before it came back.
        assert outcome.applied, text
        assert outcome.target.startswith(f"{outcome.fault.kind}-"), text
        assert "batches committed meanwhile" in outcome.detail, text
    assert report.checks.passed, text
    assert not report.unplanned, text
    # Every node is back.
    assert all(status.healthy for status in cluster.status()), cluster.status()
