"""Spark's Python daemon with millstream's task modules imported before it forks."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import TYPE_CHECKING, Any

import pytest

from millstream.engine.config import MillstreamConfig
from millstream.spark import daemon
from millstream.spark.session import PYTHON_DAEMON_MODULE, spark_conf

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@pytest.mark.unit
@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc")
def test_the_preloaded_modules_start_no_thread_in_a_spark_workers_environment() -> None:
    # Spark sets OMP_NUM_THREADS to the task's cores for its Python workers; with it, the
    # imports leave the daemon safe to fork. A module that starts a thread as it is imported
    # fails this test.
    script = (
        "import os\n"
        "from millstream.spark.daemon import PRELOADED, _threads\n"
        "for name in PRELOADED: __import__(name)\n"
        "print(_threads())\n"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "1"


@pytest.mark.unit
def test_the_daemon_imports_the_modules_and_runs_sparks_daemon(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ran: list[str] = []
    monkeypatch.setattr("pyspark.daemon.manager", lambda: ran.append("manager"))
    monkeypatch.setattr(daemon, "_threads", lambda: 1)
    monkeypatch.setattr(os, "execv", lambda *args: ran.append("execv"))
    daemon.main()
    assert ran == ["manager"]
    assert all(name in sys.modules for name in daemon.PRELOADED)


@pytest.mark.unit
def test_a_thread_after_the_imports_runs_sparks_own_daemon_in_its_place(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    ran: list[Any] = []
    monkeypatch.setattr("pyspark.daemon.manager", lambda: ran.append("manager"))
    monkeypatch.setattr(daemon, "_threads", lambda: 2)

    def execv(path: str, argv: list[str]) -> None:
        ran.append(argv)
        raise SystemExit(0)  # an exec does not return

    monkeypatch.setattr(os, "execv", execv)
    monkeypatch.setattr(sys, "argv", ["daemon.py", "pyspark.worker"])
    with pytest.raises(SystemExit):
        daemon.main()
    assert ran == [[sys.executable, "-m", "pyspark.daemon", "pyspark.worker"]]
    assert "2 threads after importing millstream.spark.executor" in capsys.readouterr().err


@pytest.mark.unit
def test_millstreams_sessions_run_its_daemon_unless_the_settings_say_otherwise() -> None:
    assert spark_conf(MillstreamConfig(), "app")["spark.python.daemon.module"] == (
        PYTHON_DAEMON_MODULE
    )
    own = MillstreamConfig(spark_conf={"spark.python.daemon.module": "pyspark.daemon"})
    assert spark_conf(own, "app")["spark.python.daemon.module"] == "pyspark.daemon"


@pytest.mark.integration
@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc (Linux)")
def test_a_python_worker_is_forked_with_the_task_modules_imported(spark: SparkSession) -> None:
    # The task imports nothing of millstream's (a function defined here is shipped by
    # value): a worker of Spark's own daemon would not have the executor's module; one
    # forked by millstream's daemon has it from its parent.
    def worker_facts(_: object) -> tuple[bytes, bool]:
        import os
        import sys

        with open(f"/proc/{os.getppid()}/cmdline", "rb") as parent:
            return parent.read(), "millstream.spark.executor" in sys.modules

    facts = spark.sparkContext.parallelize(range(2), 2).map(worker_facts).collect()
    for parent, preloaded in facts:
        assert b"millstream.spark.daemon" in parent
        assert preloaded
