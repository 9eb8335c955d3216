from __future__ import annotations

import sys
from pathlib import Path

import pytest

from millstream.engine.config import MillstreamConfig
from millstream.spark.session import spark_conf

pytestmark = pytest.mark.unit


def test_local_defaults_fit_a_small_machine() -> None:
    conf = spark_conf(MillstreamConfig(), "app", jars=[Path("/j/a.jar"), Path("/j/b.jar")])
    assert conf["spark.master"] == "local[*]"
    assert conf["spark.sql.shuffle.partitions"] == "2"
    assert conf["spark.ui.enabled"] == "false"
    assert conf["spark.pyspark.python"] == sys.executable
    assert conf["spark.driver.bindAddress"] == "127.0.0.1"
    assert conf["spark.jars"] == "/j/a.jar,/j/b.jar"
    assert "spark.jars.packages" not in conf


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
