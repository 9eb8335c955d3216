"""Build the SparkSession a millstream driver runs on.

Locally (``spark.master`` ``local[...]``, the default) the Kafka connector jars
come from the pinned POM through Maven and go on the classpath directly, and so does
the file system the driver writes its checkpoints with (:data:`LOCAL_CHECKPOINT_FS`).
On a cluster, either list Maven coordinates in ``spark.packages`` (Spark resolves and
ships them) or launch with ``spark-submit --packages ...`` (or ``--jars``): a
driver started by spark-submit keeps its master, classpath and ``--conf``
settings, which win over millstream's own.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from millstream.connectors import logs
from millstream.connectors.maven import artifact_name
from millstream.engine.config import MillstreamConfig
from millstream.engine.errors import ConfigError
from millstream.spark.class_archive import archive_options

if TYPE_CHECKING:
    from collections.abc import Sequence

    from pyspark.sql import DataFrame, SparkSession

    from millstream.connectors.maven import Progress

__all__ = [
    "LOCAL_CHECKPOINT_FS",
    "LOCAL_FS_ARTIFACT",
    "PYTHON_DAEMON_MODULE",
    "SOURCE_OPTIONS",
    "kafka_options",
    "kafka_stream",
    "local_connector_jars",
    "spark_conf",
    "spark_session",
]


PYTHON_DAEMON_MODULE = "millstream.spark.daemon"
"""Spark's ``spark.python.daemon.module`` in millstream's sessions (:mod:`.daemon`)."""

LOCAL_FS_ARTIFACT = "hadoop-bare-naked-local-fs"
"""The pinned POM's artifact (profile ``spark-kafka``) of :data:`LOCAL_CHECKPOINT_FS`."""

LOCAL_CHECKPOINT_FS: Mapping[str, str] = {
    # Hadoop's file:// file system sets a new file's permissions by forking `chmod` where
    # its native library is missing (it is, in pyspark's wheel): 30 to 70 ms for each of
    # the offset and commit files Spark writes per micro-batch.
    # This subclass of it sets them through java.nio.
    "spark.hadoop.fs.file.impl": "com.globalmentor.apache.hadoop.fs.BareLocalFileSystem",
    # Spark's default manager writes through FileContext, which takes Hadoop's own local
    # file system whatever fs.file.impl names; this one goes through FileSystem (a
    # temporary file renamed into place, atomic on a local disk).
    "spark.sql.streaming.checkpointFileManagerClass": (
        "org.apache.spark.sql.execution.streaming.checkpointing."
        "FileSystemBasedCheckpointFileManager"
    ),
}
"""What a local driver millstream starts writes its checkpoints with (with the artifact
:data:`LOCAL_FS_ARTIFACT` on its classpath); a driver on a cluster or started by
spark-submit keeps Hadoop's and Spark's defaults."""


def spark_conf(
    config: MillstreamConfig,
    app_name: str,
    jars: list[Path] | None = None,
    submitted: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The Spark settings millstream uses; later entries of ``config.spark_conf`` override.

    ``submitted`` are the settings spark-submit started the driver with. They override
    everything else, and their ``spark.master`` decides whether the driver is local.
    """
    if submitted and "spark.master" in submitted:
        config = replace(config, spark_master=submitted["spark.master"])
    conf = {
        "spark.app.name": app_name,
        "spark.master": config.spark_master,
        # Micro-batches are small and the machine may have 2 cores: 200 shuffle
        # partitions would be 200 near-empty tasks per stage.
        "spark.sql.shuffle.partitions": str(config.spark_shuffle_partitions),
        "spark.default.parallelism": str(config.spark_shuffle_partitions),
        "spark.ui.enabled": str(config.spark_ui).lower(),
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.streaming.stopGracefullyOnShutdown": "true",
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
        # Python workers forked with millstream's task modules already imported.
        "spark.python.daemon.module": PYTHON_DAEMON_MODULE,
        # The JVM and its Python workers talk over Unix domain sockets. Over TCP, a task's
        # command and its input are two writes, and Nagle's algorithm holds the second until
        # the worker's delayed ACK: up to 40 ms before a task can start (docs/benchmarks.md).
        "spark.python.unix.domain.socket.enabled": "true",
    }
    if config.spark_is_local:
        # Servers we start bind to loopback only; so does the local driver.
        conf["spark.driver.bindAddress"] = "127.0.0.1"
        conf["spark.driver.host"] = "127.0.0.1"
        conf["spark.driver.memory"] = "1g"
    classpath: list[str] = []
    if config.spark_packages:
        conf["spark.jars.packages"] = ",".join(config.spark_packages)
    elif jars:
        file_systems = [jar for jar in jars if artifact_name(jar) == LOCAL_FS_ARTIFACT]
        conf["spark.jars"] = ",".join(str(jar) for jar in jars if jar not in file_systems)
        if file_systems and config.spark_is_local:
            # On the JVM's own classpath: spark.jars are added after Hadoop's first use.
            classpath = [str(jar) for jar in file_systems]
            conf.update(LOCAL_CHECKPOINT_FS)
    conf.update(config.spark_conf)
    if classpath:
        # Beside the user's own extra classpath, if any: without the jar, the JVM would not
        # start with the file system its settings name.
        user = config.spark_conf.get("spark.driver.extraClassPath")
        conf["spark.driver.extraClassPath"] = os.pathsep.join([*classpath, *filter(None, [user])])
    conf.update(submitted or {})
    return conf


def spark_session(
    config: MillstreamConfig,
    app_name: str = "millstream",
    progress: Progress | None = None,
) -> SparkSession:
    """Get or create the session, with the Kafka connector on its classpath.

    While a program routes its logs (:func:`millstream.connectors.logs.route_logs`), a
    driver JVM this starts logs to the run's log file, and so does what it prints.
    """
    from pyspark.errors import PySparkRuntimeError
    from pyspark.sql import SparkSession  # deferred: importing pyspark costs a second

    # Executors' Python workers must run this interpreter, with millstream importable.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if config.spark_is_local:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    submitted = _submitted_conf()
    jars = None
    if submitted is None and not config.spark_packages and config.spark_is_local:
        jars = local_connector_jars(config, progress or _stderr)
    conf = spark_conf(config, app_name, jars, submitted)
    routing = logs.active() if submitted is None else None  # spark-submit routed its JVM
    if routing is not None:
        conf = _with_java_options(conf, routing.jvm_options())
    archive_option, archive = "", None
    if submitted is None and config.spark_is_local and config.spark_class_archive:
        archive_option, archive = archive_options(config.home / "spark", conf, progress or _stderr)
    try:
        session = _start(_with_java_options(conf, archive_option), routing)
    except (PySparkRuntimeError, ConfigError):
        if archive is None:
            raise
        # A JVM that cannot map the archive exits as it starts: start without it, and train
        # a new one next time.
        archive.unlink(missing_ok=True)
        (progress or _stderr)(
            f"the Spark driver JVM did not start with its class archive; removed {archive}, "
            "starting without it"
        )
        session = _start(conf, routing)
    session.sparkContext.setLogLevel("WARN")
    return session


def _with_java_options(conf: Mapping[str, str], options: str) -> dict[str, str]:
    """``conf`` with ``options`` before the driver's other Java options."""
    before = conf.get("spark.driver.extraJavaOptions", "")
    together = f"{options} {before}".strip()
    return {**conf, "spark.driver.extraJavaOptions": together} if together else dict(conf)


def _start(conf: Mapping[str, str], routing: logs.LogRouting | None) -> SparkSession:
    """The session of ``conf``, its JVM started first with its output in the routed log."""
    from pyspark.sql import SparkSession

    if routing is not None and not routing.verbose:
        _launch_driver_jvm(conf, routing.path)
    builder = SparkSession.builder
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


SOURCE_OPTIONS: Mapping[str, str] = {
    # A task reading the tail of a partition asks for more than is there; the broker then
    # holds the fetch for fetch.max.wait.ms (Kafka's default: 500 ms) before answering, and
    # each such wait lands in a micro-batch's latency. The range a task reads already exists.
    "kafka.fetch.max.wait.ms": "10",
    # The Java client's default is read_uncommitted: without this, the records of another
    # producer's aborted (or still open) transaction on an input stream would be processed.
    # Spark passes it to the executors' consumers and to the driver's offset lookups, so a
    # batch ends at the last stable offset and skips what aborted transactions and their
    # markers occupy (SPARK-25005).
    "kafka.isolation.level": "read_committed",
    # The Java consumer's default asks the broker to create a missing topic it reads (with
    # the broker's default partitions): a stream deleted while Spark's cached consumers
    # still know it would come back, empty and with the wrong partitions.
    "kafka.allow.auto.create.topics": "false",
    # The driver's offset lookups: an admin client whose broker was killed can wait out a
    # whole call without a node to send it to ("Timed out waiting for a node assignment"),
    # which by default is 60 s, while the retry's new client finds the new leaders at once.
    # Shorter calls and more of them: the same three minutes of patience in all. (An admin
    # client refuses a call timeout under its request timeout, 30 s by default.)
    "kafka.default.api.timeout.ms": "15000",
    "kafka.request.timeout.ms": "10000",
    "fetchOffset.numRetries": "12",
}
"""Kafka source options :func:`kafka_stream` sets unless ``options`` say otherwise."""


def kafka_options(config: MillstreamConfig) -> dict[str, str]:
    """The ``kafka.*`` options of every Spark Kafka source and sink: the bootstrap servers
    and the security settings (:func:`~millstream.connectors.kafka.java_client_settings`)."""
    from millstream.connectors.kafka import java_client_settings

    return {f"kafka.{key}": value for key, value in java_client_settings(config).items()}


def kafka_stream(
    spark: SparkSession,
    config: MillstreamConfig,
    topics: Sequence[str],
    starting_offsets: str = "earliest",
    options: Mapping[str, str] | None = None,
) -> DataFrame:
    """A streaming DataFrame of the topics' records (key, value, topic, partition, offset, ...).

    ``starting_offsets`` applies only to a query's first run; afterwards its checkpoint decides.
    ``options`` are further Kafka source options (e.g. ``maxOffsetsPerTrigger``).
    """
    reader = (
        spark.readStream.format("kafka")
        .option("subscribe", ",".join(topics))
        .option("startingOffsets", starting_offsets)
    )
    for name, value in {**kafka_options(config), **SOURCE_OPTIONS, **(options or {})}.items():
        reader = reader.option(name, value)
    return reader.load()


def local_connector_jars(config: MillstreamConfig, progress: Progress) -> list[Path]:
    """The Spark Kafka connector and what it needs beyond pyspark's own jars, and the file
    system of :data:`LOCAL_CHECKPOINT_FS`."""
    import pyspark

    from millstream.connectors.maven import (
        MavenArtifacts,
        check_spark_version,
        connector_jars,
    )

    check_spark_version(pyspark.__version__)
    resolved = MavenArtifacts(config.home / "artifacts", progress).classpath("spark-kafka")
    provided = sorted((Path(pyspark.__file__).parent / "jars").glob("*.jar"))
    return connector_jars(resolved, provided)


def _submitted_conf() -> dict[str, str] | None:
    """The settings of the JVM spark-submit started this driver in; None outside spark-submit.

    Spark's builder would override them (``--master`` included) with millstream's settings.
    """
    if "PYSPARK_GATEWAY_PORT" not in os.environ:  # set by spark-submit for its Python driver
        return None
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()  # connects to spark-submit's JVM; starts nothing
    return dict(SparkConf().getAll())


def _launch_driver_jvm(conf: Mapping[str, str], log_file: Path) -> None:
    """Start the driver's JVM with what it prints in ``log_file`` (unless one runs in this
    process already); ``conf`` sends its log4j2 logs there too."""
    from pyspark import SparkConf, SparkContext
    from pyspark.errors import PySparkRuntimeError
    from pyspark.java_gateway import launch_gateway

    if SparkContext._gateway is not None:
        return
    submit_conf = SparkConf(loadDefaults=False).setAll(list(conf.items()))
    with log_file.open("ab") as output:
        try:
            redirect = {"stdout": output, "stderr": output}
            gateway = launch_gateway(submit_conf, redirect)  # type: ignore[no-untyped-call]
        except PySparkRuntimeError as exc:
            raise ConfigError(
                f"the Spark driver JVM exited as it started: {_last_lines(log_file)} (all of "
                f"its output is in {log_file}). Check that Java 17 or newer runs "
                "(java -version) and the [spark] settings"
            ) from exc
    SparkContext._ensure_initialized(gateway=gateway)


def _last_lines(path: Path, count: int = 3) -> str:
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return " / ".join(lines[-count:])[-600:] or "no output"


def _stderr(message: str) -> None:
    print(f"millstream: {message}", file=sys.stderr, flush=True)
