"""``millstream run``: its arguments without services, then the command launched by
spark-submit on a Spark standalone cluster.

The cluster is a Master and a Worker started from pyspark's own jars
(:mod:`millstream.devtools.local.spark_standalone`); the pipeline is
``examples/search_pipeline``, checked as in ``spark/test_runner.py``. Kafka and Cassandra
are reached through relays on ports of their own that only the ``MILLSTREAM_*`` variables
name, and each relay records which process connected: so the test tells that the configured
addresses reached both the driver and the executors, which the Worker runs as its children.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import pytest

from millstream import cli
from millstream.cli import run as run_command
from millstream.connectors import kafka as kafka_connector
from millstream.devtools.local.spark_standalone import StandaloneSparkCluster
from millstream.engine.config import MillstreamConfig
from millstream.engine.records import encode_record
from tests.spark.test_runner import (
    EXAMPLES,
    INTERVALS,
    Pipeline,
    assert_results,
    events,
    produce,
)
from tests.waiting import wait_until

if TYPE_CHECKING:
    from cassandra.cluster import Session

LOOPBACK = "127.0.0.1"
SUBMIT_TIMEOUT = 240.0


def _progress(message: str) -> None:
    print(f"[spark cluster {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@pytest.fixture
def spark_cluster(tmp_path: Path) -> Iterator[StandaloneSparkCluster]:
    with StandaloneSparkCluster(tmp_path / "spark", _progress, cores=2, memory="2g") as cluster:
        yield cluster
    assert cluster.processes() == {}


@pytest.mark.unit
def test_the_checkpoint_root_is_taken_from_where_the_command_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[argparse.Namespace] = []

    def run(args: argparse.Namespace) -> int:
        seen.append(args)
        return 0

    monkeypatch.setattr(run_command, "run", run)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["run", "jobs:topology", "--checkpoint-root", "state/ckpt"]) == 0
    assert seen[0].checkpoint_root == tmp_path / "state" / "ckpt"
    assert seen[0].checkpoint_root.is_absolute()


@pytest.mark.integration
def test_run_through_spark_submit_uses_the_cluster_and_the_configured_addresses(
    services: MillstreamConfig,
    cassandra: Session,
    cassandra_keyspace: Callable[[], str],
    unique: Callable[[str], str],
    tmp_path: Path,
    spark_cluster: StandaloneSparkCluster,
) -> None:
    pipeline = Pipeline(unique("c").removeprefix("c_"), cassandra_keyspace(), tmp_path / "ckpt")
    distinct = events(150, seed=2)
    # Every third event is delivered twice: some in the same micro-batch, some in a later one.
    repeated = distinct + distinct[::3]
    app = f"millstream-test-{pipeline.suffix}"
    try:
        kafka_connector.create_topics(services, [pipeline.searches], partitions=2)
        produce(services, pipeline.searches, [encode_record(r) for r in repeated])
        with (
            Relay(services.kafka_port) as kafka,
            Relay(services.cassandra_port) as cassandra_relay,
        ):
            env = {
                **{k: v for k, v in os.environ.items() if k != "MILLSTREAM_SPARK_MASTER"},
                "MILLSTREAM_KAFKA_BOOTSTRAP": f"{LOOPBACK}:{kafka.port}",
                "MILLSTREAM_CASSANDRA_HOSTS": LOOPBACK,
                "MILLSTREAM_CASSANDRA_PORT": str(cassandra_relay.port),
                # One machine: executors run this interpreter, which has millstream installed.
                "PYSPARK_PYTHON": sys.executable,
                "SPARK_LOCAL_IP": LOOPBACK,
                "SEARCH_PIPELINE_SUFFIX": pipeline.suffix,
                "SEARCH_PIPELINE_INTERVALS": str(INTERVALS),
            }
            driver, output = spark_submit(spark_cluster, app, pipeline, env)
            worker = spark_cluster.worker_pid
            assert worker is not None
    finally:
        kafka_connector.delete_topics(services, sorted(pipeline.topology().streams()))

    assert_results(cassandra, pipeline, distinct)
    duplicates = len(repeated) - len(distinct)
    assert (
        f"{pipeline.per_user}: {len(repeated)} inputs, {len(distinct)} processed, "
        f"{duplicates} duplicates, 0 dead letters"
    ) in output

    # The application ran on the cluster (spark-submit's --master, not millstream's default
    # local[*]), and the configured addresses reached the driver and the executors.
    finished = wait_for_completed_app(spark_cluster, app)
    assert finished["state"] == "FINISHED"
    for relay, service in ((kafka, "Kafka"), (cassandra_relay, "Cassandra")):
        sides = {side_of(chain, driver, worker) for chain in relay.clients if chain}
        assert sides == {"driver", "executor"}, f"{service} connections: {relay.clients}"


def spark_submit(
    cluster: StandaloneSparkCluster, app: str, pipeline: Pipeline, env: dict[str, str]
) -> tuple[int, str]:
    """Run the pipeline through spark-submit, as docs/guides/spark.md shows; its pid and stdout."""
    driver, output, _ = submit_run(
        cluster,
        app,
        "search_pipeline:topology",
        cwd=EXAMPLES,
        env=env,
        options=[
            "--max-offsets-per-trigger=120",
            f"--keyspace={pipeline.keyspace}",
            f"--checkpoint-root={pipeline.checkpoints}",
            "--no-create-keyspace",
        ],
    )
    return driver, output


def submit_run(
    cluster: StandaloneSparkCluster,
    app: str,
    target: str,
    *,
    cwd: Path,
    env: dict[str, str],
    options: Sequence[str] = (),
    settings: Mapping[str, str] | None = None,
    timeout: float = SUBMIT_TIMEOUT,
) -> tuple[int, str, str]:
    """``millstream run TARGET --available-now OPTIONS`` through spark-submit to the end, with
    the connector jars Maven resolved and ``settings`` as ``--conf``; the driver's pid, its
    stdout and its stderr."""
    jars = subprocess.run(
        [sys.executable, "-m", "millstream.cli", "jars"],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout.strip()
    command = [
        str(cluster.spark_submit),
        f"--master={cluster.master_url}",
        f"--name={app}",
        f"--jars={jars}",
        "--driver-memory=1g",
        "--executor-memory=1g",
        "--total-executor-cores=2",
        *(f"--conf={key}={value}" for key, value in (settings or {}).items()),
        cli.__file__,
        "run",
        target,
        "--available-now",
        *options,
    ]
    submitted = subprocess.Popen(
        command,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: the driver JVM and its Python
    )
    try:
        output, log = submitted.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(submitted.pid, signal.SIGKILL)
        output, log = submitted.communicate()
        pytest.fail(f"spark-submit did not finish within {timeout:.0f}s:\n{log[-4000:]}")
    finally:
        if submitted.poll() is None:
            os.killpg(submitted.pid, signal.SIGKILL)
            submitted.wait()
    assert submitted.returncode == 0, log[-4000:]
    # spark-submit and spark-class exec the JVM: the pid is the driver's.
    return submitted.pid, output, log


def wait_for_completed_app(cluster: StandaloneSparkCluster, name: str) -> dict[str, Any]:
    """The Master's record of application ``name``, once it has completed."""

    def completed() -> list[dict[str, Any]]:
        return [app for app in cluster.master_state()["completedapps"] if app["name"] == name]

    (app,) = wait_until(
        lambda: f"{name} completes on the cluster: {cluster.master_state()}", completed, every=0.5
    )
    return app


def side_of(chain: list[int], driver: int, worker: int) -> str:
    """Which side a connecting process is on, by its ancestors (itself first)."""
    if driver in chain:
        return "driver"
    if worker in chain:
        return "executor"
    return f"neither: {chain}"


class Relay:
    """Forwards a free port on 127.0.0.1 to a local service and records who connected.

    ``clients`` holds, per connection, the connecting process and its ancestors (pids, the
    process first), read from /proc while the connection is open; empty if it was not found.
    """

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.clients: list[list[int]] = []
        self._listener = socket.create_server((LOOPBACK, 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._threads = [_thread(self._accept)]

    def __enter__(self) -> Relay:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        _shutdown(self._listener)  # wakes accept()
        with self._lock:
            sockets, threads = list(self._sockets), list(self._threads)
        for sock in sockets:
            _shutdown(sock)  # wakes the pumps
        for thread in threads:
            thread.join(10)
            assert not thread.is_alive(), f"relay thread {thread.name} did not stop"
        for sock in [self._listener, *sockets]:
            sock.close()

    def _accept(self) -> None:
        while True:
            try:
                client, (_, client_port) = self._listener.accept()
            except OSError:
                return  # close() shut the listener down
            owner = _socket_owner(client_port, self.port)
            upstream = socket.create_connection((LOOPBACK, self.target_port))
            with self._lock:
                self.clients.append(_ancestry(owner) if owner is not None else [])
                self._sockets += [client, upstream]
                self._threads.append(_thread(_pump, client, upstream))
                self._threads.append(_thread(_pump, upstream, client))


def _thread(target: Callable[..., None], *args: Any) -> threading.Thread:
    thread = threading.Thread(target=target, args=args, daemon=True)
    thread.start()
    return thread


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
        sink.shutdown(socket.SHUT_WR)
    except OSError:
        # A peer reset the connection, or close() shut it down: end both directions.
        _shutdown(source)
        _shutdown(sink)


def _shutdown(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):  # not connected (any more): nothing to shut down
        sock.shutdown(socket.SHUT_RDWR)


def _socket_owner(client_port: int, server_port: int) -> int | None:
    """The pid holding the client end of a loopback TCP connection."""
    inode = None
    for table in (Path("/proc/net/tcp"), Path("/proc/net/tcp6")):
        if not table.exists():
            continue
        for line in table.read_text().splitlines()[1:]:
            fields = line.split()
            ports = [int(address.rsplit(":", 1)[1], 16) for address in fields[1:3]]
            if ports == [client_port, server_port]:
                inode = fields[9]
    if inode is None:
        return None
    wanted = f"socket:[{inode}]"
    for process in Path("/proc").iterdir():
        if not process.name.isdigit():
            continue
        with contextlib.suppress(OSError):  # it exited, or is not ours to inspect
            for fd in (process / "fd").iterdir():
                with contextlib.suppress(OSError):  # the descriptor was closed meanwhile
                    if os.readlink(fd) == wanted:
                        return int(process.name)
    return None


def _ancestry(pid: int) -> list[int]:
    """``pid`` and its ancestors, nearest first."""
    chain = []
    while pid > 1:
        chain.append(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break  # it exited
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return chain
