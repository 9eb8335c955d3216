from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from millstream.engine.config import MillstreamConfig
from millstream.spark.session import LOCAL_CHECKPOINT_FS, spark_conf

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_LOCAL_FS_JAR = Path("/m2/hadoop-bare-naked-local-fs-0.1.0.jar")


@pytest.mark.unit
def test_local_defaults_fit_a_small_machine() -> None:
    conf = spark_conf(MillstreamConfig(), "app", jars=[Path("/j/a.jar"), Path("/j/b.jar")])
    assert conf["spark.master"] == "local[*]"
    assert conf["spark.sql.shuffle.partitions"] == "2"
    assert conf["spark.ui.enabled"] == "false"
    assert conf["spark.pyspark.python"] == sys.executable
    assert conf["spark.driver.bindAddress"] == "127.0.0.1"
    assert conf["spark.jars"] == "/j/a.jar,/j/b.jar"
    assert "spark.jars.packages" not in conf


@pytest.mark.unit
def test_cluster_settings_use_packages_and_user_overrides() -> None:
    config = MillstreamConfig(
        spark_master="spark://m:7077",
        spark_ui=True,
        spark_packages=("g:a:1", "g:b:2"),
        spark_conf={"spark.sql.shuffle.partitions": "64"},
    )
    conf = spark_conf(config, "app", jars=[Path("/ignored.jar")])
    assert conf["spark.master"] == "spark://m:7077"
    assert conf["spark.jars.packages"] == "g:a:1,g:b:2"
    assert "spark.jars" not in conf
    assert "spark.driver.bindAddress" not in conf
    assert conf["spark.ui.enabled"] == "true"
    assert conf["spark.sql.shuffle.partitions"] == "64"


@pytest.mark.unit
def test_spark_submit_settings_win_and_its_master_decides_locality() -> None:
    config = MillstreamConfig(spark_conf={"spark.executor.memory": "4g"})  # master local[*]
    submitted = {
        "spark.master": "spark://m:7077",
        "spark.app.name": "search-pipeline",
        "spark.jars": "/j/connector.jar",
        "spark.executor.memory": "1g",
    }
    conf = spark_conf(config, "app", submitted=submitted)
    assert {key: conf[key] for key in submitted} == submitted
    assert "spark.driver.bindAddress" not in conf
    assert "spark.driver.memory" not in conf
    assert conf["spark.sql.shuffle.partitions"] == "2"
    assert conf["spark.pyspark.python"] == sys.executable

    local = spark_conf(config, "app", submitted={"spark.master": "local[2]"})
    assert local["spark.master"] == "local[2]"
    assert local["spark.driver.bindAddress"] == "127.0.0.1"


@pytest.mark.unit
def test_a_local_driver_writes_checkpoints_with_the_pinned_file_system() -> None:
    jars = [Path("/m2/spark-sql-kafka.jar"), _LOCAL_FS_JAR]
    conf = spark_conf(MillstreamConfig(), "app", jars=jars)
    assert conf["spark.jars"] == "/m2/spark-sql-kafka.jar"  # not added after the JVM starts
    assert conf["spark.driver.extraClassPath"] == str(_LOCAL_FS_JAR)
    assert {key: conf[key] for key in LOCAL_CHECKPOINT_FS} == LOCAL_CHECKPOINT_FS

    # A user's own extra classpath stays, after the file system's jar.
    mine = MillstreamConfig(spark_conf={"spark.driver.extraClassPath": "/opt/udfs.jar"})
    joined = spark_conf(mine, "app", jars=jars)["spark.driver.extraClassPath"]
    assert joined.split(os.pathsep) == [str(_LOCAL_FS_JAR), "/opt/udfs.jar"]

    # Without the jar (an older resolution) nothing names the file system.
    plain = spark_conf(MillstreamConfig(), "app", jars=[Path("/m2/spark-sql-kafka.jar")])
    assert not LOCAL_CHECKPOINT_FS.keys() & plain.keys()
    assert "spark.driver.extraClassPath" not in plain


@pytest.mark.unit
def test_a_cluster_driver_keeps_hadoops_file_system() -> None:
    cluster = MillstreamConfig(spark_master="spark://m:7077")
    conf = spark_conf(cluster, "app", jars=[_LOCAL_FS_JAR])
    assert not LOCAL_CHECKPOINT_FS.keys() & conf.keys()
    assert "spark.driver.extraClassPath" not in conf
    submitted = spark_conf(MillstreamConfig(), "app", submitted={"spark.master": "local[2]"})
    assert not LOCAL_CHECKPOINT_FS.keys() & submitted.keys()


@pytest.mark.integration
def test_the_local_session_checkpoints_through_the_pinned_file_system(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The started driver's file:// file system and checkpoint manager are the pinned ones
    (a JVM without the jar would not have started with the settings), and a streaming
    query's offset and commit logs are written and read back through them."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    local = jvm.org.apache.hadoop.fs.FileSystem.get(jvm.java.net.URI("file:///"), hadoop)
    assert local.getClass().getName() == LOCAL_CHECKPOINT_FS["spark.hadoop.fs.file.impl"]
    # A query's Hadoop settings: the SparkContext's and the session's SQL settings.
    queries = spark._jsparkSession.sessionState().newHadoopConf()
    manager = jvm.org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager
    made = manager.create(jvm.org.apache.hadoop.fs.Path(str(tmp_path)), queries)
    expected = LOCAL_CHECKPOINT_FS["spark.sql.streaming.checkpointFileManagerClass"]
    assert made.getClass().getName() == expected

    checkpoint = tmp_path / "checkpoint"
    rows = spark.readStream.format("rate").option("rowsPerSecond", 10).load()
    query = (
        rows.writeStream.format("noop")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        query.awaitTermination(60)
    finally:
        query.stop()
    assert query.exception() is None
    offsets = sorted(p.name for p in (checkpoint / "offsets").iterdir() if p.name.isdigit())
    commits = sorted(p.name for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    assert offsets
    assert commits == offsets
    # The logs' checksums are written beside them, as by Hadoop's own local file system.
    assert (checkpoint / "offsets" / f".{offsets[0]}.crc").exists()


@pytest.mark.unit
def test_python_workers_talk_over_unix_sockets_unless_the_settings_say_otherwise() -> None:
    key = "spark.python.unix.domain.socket.enabled"
    assert spark_conf(MillstreamConfig(), "app")[key] == "true"
    assert spark_conf(MillstreamConfig(spark_conf={key: "false"}), "app")[key] == "false"


@pytest.mark.integration
@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc (Linux)")
def test_a_python_worker_is_connected_to_the_jvm_over_a_unix_socket(spark: SparkSession) -> None:
    def socket_families(_: object) -> list[str]:
        import os
        import socket

        found = set()
        for name in os.listdir("/proc/self/fd"):
            try:
                sock = socket.socket(fileno=int(name))
            except OSError:
                continue  # not a socket
            try:
                found.add(sock.family.name)
            finally:
                sock.detach()  # the descriptor stays the worker's
        return sorted(found)

    for families in spark.sparkContext.parallelize(range(2), 2).map(socket_families).collect():
        assert "AF_UNIX" in families, families
