"""Spark's Python daemon with millstream's task modules imported before it forks a worker.

Spark runs a task's Python in a worker forked by a daemon (``pyspark.daemon``) it starts once
per set of workers, and a fresh worker imports what the task needs: for millstream's tasks
(:mod:`millstream.spark.executor`, with the Cassandra and Kafka clients) about 0.5 s of CPU.
Every worker of a new set pays it: at a driver's start, in each computation's set of its own
(:func:`.batch.in_worker_pool`), and when Spark replaced workers it had stopped after a
minute without tasks. Run as the daemon (``spark.python.daemon.module``, which
:func:`.session.spark_conf` sets), this module imports them once, then runs Spark's own
daemon, whose forks find them imported.

``pyspark.daemon`` imports nothing of a task's before it forks because a module may start a
thread as it is imported (pyarrow's and numpy's thread pools), and a process forked while
another thread holds a lock can hang. The modules imported here start none while
``OMP_NUM_THREADS`` is 1, as Spark sets it for its Python workers. If the process has a
thread besides its own after the imports anyway, it runs ``pyspark.daemon`` afresh in its
place (same pid, same arguments, nothing imported) and says so on stderr.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Final

__all__ = ["PRELOADED", "main"]

PRELOADED: Final = ("millstream.spark.executor",)
"""What a task of millstream imports, imported by the daemon before it forks."""

_SPARK_DAEMON: Final = "pyspark.daemon"


def _threads() -> int:
    """The process's threads, the native ones included (1 where /proc is not available)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def main() -> None:
    for name in PRELOADED:
        importlib.import_module(name)
    if (threads := _threads()) > 1:
        print(
            f"millstream.spark.daemon: {threads} threads after importing {', '.join(PRELOADED)}; "
            f"forking them would be unsafe, so this runs {_SPARK_DAEMON} without them (its "
            "workers import them themselves)",
            file=sys.stderr,
            flush=True,
        )
        os.execv(sys.executable, [sys.executable, "-m", _SPARK_DAEMON, *sys.argv[1:]])
    from pyspark.daemon import manager

    manager()


if __name__ == "__main__":
    main()
