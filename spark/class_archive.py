"""A class-data-sharing archive for the local Spark driver's JVM.

A driver's JVM loads, parses and verifies Spark's classes one by one as it starts: on two
cores most of the 6 to 7 s a ``SparkSession`` takes, and half of its first job's 3 to 4 s.
Java's application class-data sharing maps them from an archive instead: one JVM writes the
archive as it exits (``-XX:ArchiveClassesAtExit``, Java 13 and later), and a driver started
with ``-XX:SharedArchiveFile`` takes about 4 s and 2 s. A driver that crashed is back that
much sooner, and every local run starts so.

The archive is trained once per Java and Spark installation (its name is a digest of both,
:func:`archive_path`), by a JVM of its own that runs a small workload (:func:`_workload`: a
Python function over Arrow, an aggregation, a streaming query). It is written under a
temporary name and renamed only once that JVM exited cleanly, since the JVM maps the file:
a truncated archive crashes the JVM that maps it. A driver that fails to start with an
archive anyway has it removed and starts without (:mod:`millstream.spark.session`). A JVM
whose classpath does not match the archive's warns and starts without sharing. Training that
fails is not tried again for the same installation: its log stays beside the archive.

Only a local driver started by millstream uses it: a driver that ``spark-submit`` started
has its JVM already, and a cluster's executors are JVMs of their own.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from millstream.connectors import jvm_archives

__all__ = ["archive_options", "archive_path", "java_executable", "train"]

_PREFIX = "spark-driver"
_FAILED = ".failed"  # beside an archive whose training failed: not tried again

TRAINING_TIMEOUT = 300.0
"""Seconds the training JVM may take (about 20 on two cores)."""

# The settings of the driver's JVM that the training JVM must share: its classpath, and the
# heap size (the archive's class pointers are laid out for it).
_SHARED_SETTINGS = ("spark.driver.extraClassPath", "spark.driver.memory")


def java_executable(environ: Mapping[str, str] | None = None) -> Path | None:
    """The ``java`` that Spark's launcher (``spark-class``) runs: ``$JAVA_HOME/bin/java``,
    else the first on the ``PATH``; None if there is none."""
    environ = os.environ if environ is None else environ
    if java_home := environ.get("JAVA_HOME"):
        candidate = Path(java_home) / "bin" / "java"
        return candidate if candidate.exists() else None
    found = shutil.which("java", path=environ.get("PATH"))
    return Path(found) if found else None


def _spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def archive_path(
    directory: Path, java: Path, spark_home: Path, conf: Mapping[str, str] | None = None
) -> Path:
    """Where the archive for ``java`` and the Spark installation at ``spark_home`` (with the
    driver settings of ``conf`` it depends on) lives in ``directory``: a new Java, Spark or
    classpath gets an archive of its own."""
    # The JVM refuses an archive whose jars changed size or time (a virtualenv made again).
    jars = sorted((spark_home.resolve() / "jars").glob("*.jar"))
    settings = [f"{key}={(conf or {}).get(key, '')}" for key in _SHARED_SETTINGS]
    return jvm_archives.archive_path(directory, _PREFIX, java, jars, settings)


def archive_options(
    directory: Path,
    conf: Mapping[str, str],
    progress: Callable[[str], None],
    environ: Mapping[str, str] | None = None,
) -> tuple[str, Path | None]:
    """The driver JVM's options that map the archive, and the archive; trains it first when
    this installation has none (and none failed before). ``("", None)`` when there is no
    archive to use: no Java, training that failed or that another process is doing now."""
    java = java_executable(environ)
    if java is None:
        return "", None  # Spark's launcher says what is missing
    path = archive_path(directory, java, _spark_home(), conf)
    if not path.exists() and (_failed(path).exists() or not train(path, conf, progress, environ)):
        return "", None
    os.utime(path)  # used now: the archives used least recently are the ones evicted
    return f"-XX:SharedArchiveFile={path}", path


def _failed(path: Path) -> Path:
    return path.with_suffix(_FAILED)


KEPT_ARCHIVES = 3
"""Archives kept in one directory (about 160 MB each): one per Java and Spark installation
(each virtualenv is one) used most recently; the others go when a new one is trained."""


def train(
    path: Path,
    conf: Mapping[str, str],
    progress: Callable[[str], None],
    environ: Mapping[str, str] | None = None,
    timeout: float = TRAINING_TIMEOUT,
) -> bool:
    """Train the archive at ``path``: True once it is there. False without waiting if
    another process is training it; False, with a ``.failed`` file naming the log, if the
    training JVM failed (the log, ``.log`` beside the archive, says why)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with (path.parent / "training.lock").open("w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return path.exists()  # another process trains it; this driver starts without
        if path.exists():
            return True  # trained while this process waited for its turn
        return _train_locked(path, conf, progress, environ, timeout)


def _train_locked(
    path: Path,
    conf: Mapping[str, str],
    progress: Callable[[str], None],
    environ: Mapping[str, str] | None,
    timeout: float,
) -> bool:
    progress(
        "preparing the Spark driver's class archive (once for this Java and Spark; about "
        "20 s): later drivers start in about half the time"
    )
    started = time.monotonic()
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    log = path.with_suffix(".log")
    env = dict(os.environ if environ is None else environ)
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    command = [
        str(_spark_home() / "bin" / "spark-submit"),
        "--master", "local[2]",
        "--conf", "spark.ui.enabled=false",
        "--conf", "spark.ui.showConsoleProgress=false",
        "--conf", "spark.driver.bindAddress=127.0.0.1",
        "--conf", "spark.driver.host=127.0.0.1",
        "--conf", f"spark.pyspark.python={sys.executable}",
        "--conf", f"spark.driver.extraJavaOptions=-XX:ArchiveClassesAtExit={partial}",
        *(
            option
            for key in _SHARED_SETTINGS
            if key in conf
            for option in ("--conf", f"{key}={conf[key]}")
        ),
        __file__,
    ]  # fmt: skip
    try:
        with log.open("wb") as output:
            # spark-submit execs the JVM, which runs this file's workload in a Python
            # process of its own and writes the archive as it exits.
            finished = subprocess.run(
                command, stdout=output, stderr=subprocess.STDOUT, env=env, timeout=timeout
            )
        trained = finished.returncode == 0 and partial.exists() and partial.stat().st_size > 0
    except (OSError, subprocess.TimeoutExpired) as exc:
        with log.open("a") as output:
            output.write(f"\nmillstream: the training JVM did not finish: {exc!r}\n")
        trained = False
    if not trained:
        partial.unlink(missing_ok=True)
        _failed(path).write_text(
            f"the training JVM failed; its log: {log}. Delete this file to train again.\n"
        )
        progress(
            f"the Spark driver's class archive could not be prepared (its log: {log}); "
            f"drivers start without it until {_failed(path)} is deleted"
        )
        return False
    os.replace(partial, path)  # whole, or not there: a driver maps it
    jvm_archives.evict(path.parent, _PREFIX, KEPT_ARCHIVES, companions=(".log", _FAILED))
    progress(f"the Spark driver's class archive is ready ({time.monotonic() - started:.0f} s)")
    return True


def _workload() -> None:
    """What the training JVM runs: what a millstream driver's JVM does as it starts and runs
    its first batches (a session, a Python function over Arrow, a shuffle, a streaming query
    with ``foreachBatch``), so that the archive holds the classes those load."""
    from pyspark.sql import DataFrame, SparkSession

    spark = SparkSession.builder.getOrCreate()
    frame = spark.range(2_000).selectExpr("id", "id % 7 AS k")
    frame.mapInArrow(lambda batches: batches, frame.schema).groupBy("k").count().collect()
    with tempfile.TemporaryDirectory() as scratch:
        source = Path(scratch) / "in"
        source.mkdir()
        (source / "part.json").write_text('{"a": 1}\n{"a": 2}\n')

        def each_batch(batch: DataFrame, _batch_id: int) -> None:
            batch.groupBy("a").count().collect()

        query = (
            spark.readStream.schema("a LONG")
            .json(str(source))
            .writeStream.foreachBatch(each_batch)
            .option("checkpointLocation", str(Path(scratch) / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
    spark.stop()


if __name__ == "__main__":  # run by the training JVM (spark-submit)
    _workload()
