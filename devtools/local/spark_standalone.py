"""A Spark standalone cluster on 127.0.0.1: a Master and a Worker (or more), from pyspark's jars.

It runs the cluster path (``spark-submit --master spark://...``) on one machine with nothing
beyond the pyspark package, whose ``bin/spark-class`` starts the daemons as a real deployment
does; the Worker launches each application's executors as JVMs of their own. It is not part of
the local stack (``millstream up``): a cluster lives under a directory of its own, on ports
that are free when it starts, until :meth:`StandaloneSparkCluster.stop`::

    with StandaloneSparkCluster(tmp / "spark", print) as cluster:
        subprocess.run([cluster.spark_submit, "--master", cluster.master_url, "app.py"])
        cluster.master_state()["completedapps"]

Every daemon is found and stopped by pid file, like the local services (see
:mod:`millstream.devtools.local.process`), never by name.

Spark's scheduler tells hosts apart by name only, so Workers started under several names of
this machine (``worker_hosts=("127.0.0.1", "localhost")``) are several hosts to it: enough for
what needs a second host, such as a speculative task, which Spark never launches on a host
where an attempt of the same task already ran.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import signal
import socket
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from millstream.devtools.local.java import find_java
from millstream.devtools.local.process import Progress, ServiceProcess, fresh_scratch
from millstream.devtools.local.service import LOOPBACK
from millstream.engine.errors import LocalStackError, ServiceStartError

__all__ = ["StandaloneSparkCluster"]

_MASTER_CLASS = "org.apache.spark.deploy.master.Master"
_WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


class StandaloneSparkCluster:
    """A Master and a Worker per name in ``worker_hosts``, under ``root``.

    Each Worker offers ``cores`` and ``memory`` to executors and registers under its host name
    (by default one Worker, on 127.0.0.1). :meth:`start` returns once every Worker has
    registered with the Master, and stops whatever it started if it fails. :meth:`stop` stops
    the Workers (which stop their executors) and the Master, then kills whatever still works
    under ``root`` (see :meth:`processes`), and deletes the executors' work directory and the
    cluster's temporary files (``root/tmp``, its processes' ``/tmp``); the daemons' logs stay
    under ``root/logs``.
    """

    def __init__(
        self,
        root: Path,
        progress: Progress,
        *,
        cores: int = 2,
        memory: str = "2g",
        daemon_memory: str = "512m",
        start_timeout: float = 120.0,
        worker_hosts: Sequence[str] = (LOOPBACK,),
    ) -> None:
        import pyspark  # deferred: importing pyspark costs a second

        if not worker_hosts or len(set(worker_hosts)) != len(worker_hosts):
            raise ValueError(f"worker_hosts must be distinct names, got {list(worker_hosts)}")
        self.root = root
        self.progress = progress
        self.cores = cores
        self.memory = memory
        self.daemon_memory = daemon_memory
        self.start_timeout = start_timeout
        self.worker_hosts = tuple(worker_hosts)
        self.spark_home = Path(pyspark.__file__).parent
        self.work_dir = root / "work"
        # The daemons' temporary files and the executors' local directories (blocks, files):
        # here rather than in /tmp, so that what a killed process leaves goes with stop().
        self.scratch = root / "tmp"
        self.master = self._process("master")
        # The first Worker keeps the name (and pid file) it had when there was only one.
        self.workers = [
            self._process("worker" if number == 0 else f"worker-{number}")
            for number in range(len(self.worker_hosts))
        ]
        self.worker = self.workers[0]
        self.master_port = 0
        self.master_web_port = 0
        self.worker_web_ports = [0] * len(self.workers)

    def _process(self, role: str) -> ServiceProcess:
        return ServiceProcess(
            name=f"spark {role}",
            pid_file=self.root / f"{role}.pid",
            log_file=self.root / "logs" / f"{role}.out",
            marker=f"-Dmillstream.service={self.root / role}",
        )

    @property
    def master_url(self) -> str:
        """What ``spark-submit --master`` takes."""
        return f"spark://{LOOPBACK}:{self.master_port}"

    @property
    def master_web_url(self) -> str:
        return f"http://{LOOPBACK}:{self.master_web_port}"

    @property
    def spark_submit(self) -> Path:
        """pyspark's ``bin/spark-submit``, of the Spark the cluster runs."""
        return self.spark_home / "bin" / "spark-submit"

    @property
    def worker_web_port(self) -> int:
        """The first Worker's web UI port."""
        return self.worker_web_ports[0]

    @property
    def worker_pid(self) -> int | None:
        """The (first) Worker's pid; its executors are its descendants."""
        return self.worker.running_pid()

    def start(self) -> None:
        """Start the Master, then the Workers; return once every Worker registered."""
        daemons = [self.master, *self.workers]
        if any(daemon.running_pid() is not None for daemon in daemons):
            raise ServiceStartError(
                f"a Spark cluster already runs under {self.root}; stop it (or use another "
                "directory) first"
            )
        java = find_java()
        ports = _free_ports(2 + len(self.workers))
        self.master_port, self.master_web_port = ports[:2]
        self.worker_web_ports = ports[2:]
        fresh_scratch(self.scratch)  # none of the cluster's processes runs now
        env = {
            **os.environ,
            "SPARK_HOME": str(self.spark_home),
            "JAVA_HOME": str(java.home),
            "SPARK_LOCAL_IP": LOOPBACK,
            "SPARK_DAEMON_MEMORY": self.daemon_memory,
            "SPARK_LOCAL_DIRS": str(self.scratch),
            "SPARK_DAEMON_JAVA_OPTS": f"-Djava.io.tmpdir={self.scratch}",
        }
        try:
            self.progress(f"spark master: starting on {self.master_url}")
            master = ["--port", str(self.master_port), "--webui-port", str(self.master_web_port)]
            self._start_daemon(
                self.master,
                [_MASTER_CLASS, "--host", LOOPBACK, *master],
                {**env, "SPARK_MASTER_OPTS": self.master.marker},
                healthy=lambda: self._master_json().get("status") == "ALIVE",
            )
            for number, (process, host, web_port) in enumerate(
                zip(self.workers, self.worker_hosts, self.worker_web_ports, strict=True), 1
            ):
                self.progress(
                    f"{process.name}: starting on {host} ({self.cores} cores, {self.memory})"
                )
                worker = ["--cores", str(self.cores), "--memory", self.memory]
                worker += ["--webui-port", str(web_port), "--work-dir", str(self.work_dir)]
                self._start_daemon(
                    process,
                    [_WORKER_CLASS, self.master_url, "--host", host, *worker],
                    {**env, "SPARK_WORKER_OPTS": process.marker},
                    healthy=functools.partial(self._workers_alive, number),
                )
        except BaseException:
            self.stop()
            raise
        self.progress(f"spark cluster: ready at {self.master_url} (web UI {self.master_web_url})")

    def _start_daemon(
        self,
        process: ServiceProcess,
        arguments: list[str],
        env: dict[str, str],
        healthy: Callable[[], bool],
    ) -> None:
        """Run ``spark-class arguments...`` and wait until ``healthy``."""
        spark_class = str(self.spark_home / "bin" / "spark-class")
        started = process.start([spark_class, *arguments], env=env, cwd=self.root)
        process.wait_healthy(
            started,
            healthy,
            self.start_timeout,
            self.progress,
            0.5,
            retry="start the cluster again",
            stop="the cluster was stopped",
        )

    def master_state(self) -> dict[str, Any]:
        """The Master's ``/json/``: workers, ``activeapps``, ``completedapps``, ``status``."""
        with urllib.request.urlopen(f"{self.master_web_url}/json/", timeout=5) as response:
            state: dict[str, Any] = json.load(response)
        return state

    def stop(self) -> None:
        """Stop Workers, executors and Master by pid; delete the work and temporary
        directories."""
        for worker in reversed(self.workers):
            worker.stop(timeout=30)  # it stops its executors as it goes
        self.master.stop(timeout=30)
        _kill(self.processes())  # whatever they left behind
        for directory in (self.work_dir, self.scratch):
            if directory.exists():
                shutil.rmtree(directory)

    def processes(self) -> dict[int, str]:
        """Live processes working under ``root``: the daemons, executors and Python workers.

        Maps each pid to its start time, which tells a recycled pid apart.
        """
        root = self.root.resolve()
        found = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cwd = (entry / "cwd").readlink()
            except OSError:
                continue  # it exited, or is not ours to inspect
            started = _started(int(entry.name))
            if cwd.is_relative_to(root) and started is not None:
                found[int(entry.name)] = started
        return found

    def __enter__(self) -> StandaloneSparkCluster:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def _workers_alive(self, count: int) -> bool:
        """Whether ``count`` Workers have registered with the Master (a health probe)."""
        alive: int = self._master_json().get("aliveworkers", 0)
        return alive >= count

    def _master_json(self) -> dict[str, Any]:
        """The Master's state, or nothing while it does not answer (a health probe)."""
        try:
            return self.master_state()
        except (OSError, ValueError):
            return {}


def _free_ports(count: int) -> list[int]:
    """``count`` distinct ports that are free now (held together while they are picked)."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind((LOOPBACK, 0))
        return [sock.getsockname()[1] for sock in sockets]


def _kill(processes: dict[int, str], timeout: float = 10.0) -> None:
    """SIGKILL those of ``processes`` (pid: start time) still alive; wait until they are gone."""
    deadline = time.monotonic() + timeout
    while alive := [pid for pid, started in processes.items() if _started(pid) == started]:
        if time.monotonic() >= deadline:
            raise LocalStackError(
                f"processes {alive} survived SIGKILL for {timeout:.0f}s; "
                f"see `ps -o pid,stat,cmd -p {','.join(map(str, alive))}`"
            )
        for pid in alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def _stat(pid: int) -> list[str] | None:
    """Fields 3 (state) onwards of ``/proc/<pid>/stat``, or None if it is gone or a zombie."""
    try:
        # pid (comm) state ppid ...: comm may hold spaces and parentheses.
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None  # it exited while we looked
    return None if fields[0] in {"Z", "X"} else fields


def _started(pid: int) -> str | None:
    stat = _stat(pid)
    return None if stat is None else stat[19]
