from __future__ import annotations

from pathlib import Path

import pytest

from millstream.engine.config import DEFAULT_KEYSPACE, MillstreamConfig, RunSettings, load_config
from millstream.engine.errors import ConfigError

pytestmark = pytest.mark.unit


def test_defaults_point_at_the_local_stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # no millstream.toml here
    config = load_config(environ={})
    assert config == MillstreamConfig()
    assert config.kafka_bootstrap == "127.0.0.1:9092"
    assert config.kafka_port == 9092
    assert config.cassandra_hosts == ("127.0.0.1",)
    assert config.spark_master == "local[*]"
    assert config.spark_is_local


def test_file_then_environment_override_defaults(tmp_path: Path) -> None:
    file = tmp_path / "cluster.toml"
    file.write_text(
        'home = "/srv/millstream"\n'
        "[kafka]\n"
        'bootstrap = "k1:9092,k2:9092"\n'
        "[cassandra]\n"
        'hosts = ["c1", "c2"]\n'
        "port = 19042\n"
        "[spark]\n"
        'master = "spark://m:7077"\n'
        "shuffle_partitions = 8\n"
        'packages = ["org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0"]\n'
        "[spark.conf]\n"
        '"spark.executor.memory" = "4g"\n'
        "[executor]\n"
        "cache_bytes = 1000\n"
        "interval_threads = 2\n"
        "gc_threshold = 0\n"
    )
    config = load_config(
        environ={
            "MILLSTREAM_CONFIG": str(file),
            "MILLSTREAM_CASSANDRA_PORT": "29042",
            "MILLSTREAM_EXECUTOR_INTERVAL_THREADS": "8",
        }
    )
    assert config.executor_cache_bytes == 1000
    assert config.executor_interval_threads == 8  # the variable beats the file
    assert config.executor_gc_threshold == 0
    assert config.home == Path("/srv/millstream")
    assert config.kafka_bootstrap == "k1:9092,k2:9092"
    assert config.cassandra_hosts == ("c1", "c2")
    assert config.cassandra_port == 29042  # the variable beats the file
    assert config.spark_master == "spark://m:7077"
    assert not config.spark_is_local
    assert config.spark_shuffle_partitions == 8
    assert config.spark_packages == ("org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0",)
    assert config.spark_conf == {"spark.executor.memory": "4g"}


def test_replication_comes_from_the_file_or_the_environment(tmp_path: Path) -> None:
    assert (MillstreamConfig().kafka_replication, MillstreamConfig().cassandra_replication) == (
        1,
        1,
    )
    file = tmp_path / "cluster.toml"
    file.write_text("[kafka]\nreplication = 3\n[cassandra]\nreplication = 3\n")
    config = load_config(
        environ={"MILLSTREAM_CONFIG": str(file), "MILLSTREAM_CASSANDRA_REPLICATION": "2"}
    )
    assert config.kafka_replication == 3
    assert config.cassandra_replication == 2  # the variable beats the file


def test_environment_lists_and_booleans() -> None:
    config = load_config(
        environ={
            "MILLSTREAM_CASSANDRA_HOSTS": "a, b ,c",
            "MILLSTREAM_SPARK_UI": "yes",
            "MILLSTREAM_SPARK_CLASS_ARCHIVE": "0",
            "MILLSTREAM_HOME": "/tmp/ms",
        },
        path=None,
    )
    assert config.cassandra_hosts == ("a", "b", "c")
    assert config.spark_ui is True
    assert config.spark_class_archive is False
    assert load_config(environ={}, path=None).spark_class_archive is True
    assert config.home == Path("/tmp/ms")


def test_the_local_stacks_java_options_come_from_a_list_a_string_or_the_environment(
    tmp_path: Path,
) -> None:
    assert (MillstreamConfig().kafka_java_options, MillstreamConfig().cassandra_java_options) == (
        (),
        (),
    )
    file = tmp_path / "m.toml"
    file.write_text(
        '[kafka]\njava_options = ["-XX:TieredStopAtLevel=1", "-Da=b c"]\n'
        "[cassandra]\njava_options = \"-Xss1m '-Dname=two words'\"\n"
    )
    config = load_config(environ={}, path=file)
    assert config.kafka_java_options == ("-XX:TieredStopAtLevel=1", "-Da=b c")
    assert config.cassandra_java_options == ("-Xss1m", "-Dname=two words")
    config = load_config(
        environ={"MILLSTREAM_CASSANDRA_JAVA_OPTIONS": "-XX:TieredStopAtLevel=1 -Dx='y z'"},
        path=file,
    )
    assert config.cassandra_java_options == ("-XX:TieredStopAtLevel=1", "-Dx=y z")
    assert config.kafka_java_options == ("-XX:TieredStopAtLevel=1", "-Da=b c")
    file.write_text("[kafka]\njava_options = [1]\n")
    with pytest.raises(ConfigError, match=r"java_options.*must list strings"):
        load_config(environ={}, path=file)
    file.write_text("[cassandra]\njava_options = 1\n")
    with pytest.raises(ConfigError, match=r"java_options.*must be a list or str"):
        load_config(environ={}, path=file)


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"MILLSTREAM_CASSANDRA_PORT": "ninety"}, "MILLSTREAM_CASSANDRA_PORT='ninety'"),
        ({"MILLSTREAM_SPARK_UI": "maybe"}, "expected true or false"),
        ({"MILLSTREAM_CONFIG": "/nonexistent/millstream.toml"}, "does not exist"),
        ({"MILLSTREAM_KAFKA_BOOTSTRAP": "no-port-here"}, "invalid millstream settings"),
        ({"MILLSTREAM_EXECUTOR_INTERVAL_THREADS": "0"}, "interval_threads must be at least 1"),
        ({"MILLSTREAM_EXECUTOR_GC_THRESHOLD": "-1"}, "gc_threshold must be non-negative"),
        ({"MILLSTREAM_CASSANDRA_REPLICATION": "0"}, "cassandra replication must be at least 1"),
        ({"MILLSTREAM_KAFKA_REPLICATION": "three"}, "MILLSTREAM_KAFKA_REPLICATION='three'"),
    ],
)
def test_bad_settings_say_what_is_wrong(environ: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(environ=environ)


def test_unknown_and_mistyped_file_settings_are_refused(tmp_path: Path) -> None:
    file = tmp_path / "m.toml"
    file.write_text("[kafak]\nbootstrap = 'x:1'\n")
    with pytest.raises(ConfigError, match="unknown setting"):
        load_config(environ={}, path=file)
    file.write_text("[cassandra]\nport = '9042'\n")
    with pytest.raises(ConfigError, match="must be a int"):
        load_config(environ={}, path=file)
    file.write_text("[cassandra\n")
    with pytest.raises(ConfigError, match="fix the TOML"):
        load_config(environ={}, path=file)


def test_run_settings_come_from_the_run_table_then_the_environment(tmp_path: Path) -> None:
    file = tmp_path / "millstream.toml"
    file.write_text(
        "[run]\n"
        'keyspace = "zeitgeist"\n'
        'table = "state"\n'
        "create_keyspace = false\n"
        'checkpoint_root = "/srv/checkpoints"\n'
        "partitions = 4\n"
        "topic_partitions = { searches = 8 }\n"
        "max_offsets_per_trigger = 60000\n"
        "batch_attempts = 5\n"
        "outage_timeout = 60\n"
        "metrics_port = 9400\n"
        'metrics_address = "0.0.0.0"\n'
        "one_query = false\n"
    )
    config = load_config(
        environ={
            "MILLSTREAM_CONFIG": str(file),
            "MILLSTREAM_RUN_KEYSPACE": "other",
            "MILLSTREAM_RUN_TOPIC_PARTITIONS": "clicks=3, searches=6",
            "MILLSTREAM_RUN_CREATE_KEYSPACE": "yes",
            "MILLSTREAM_RUN_ONE_QUERY": "true",
        }
    )
    assert config.run == RunSettings(
        keyspace="other",  # the variable beats the file
        table="state",
        create_keyspace=True,
        checkpoint_root=Path("/srv/checkpoints"),
        partitions=4,
        topic_partitions={"clicks": 3, "searches": 6},
        max_offsets_per_trigger=60_000,
        batch_attempts=5,
        outage_timeout=60.0,
        metrics_port=9400,
        metrics_address="0.0.0.0",
        one_query=True,
    )
    assert config.run.partitions_of("searches") == 6
    assert config.run.partitions_of("counts") == 4
    assert config.run.checkpoints(config.home) == Path("/srv/checkpoints")


def test_run_settings_default_to_the_development_deployment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    run = load_config(environ={"MILLSTREAM_HOME": str(tmp_path)}).run
    assert run == RunSettings()
    assert (run.keyspace, run.table, run.create_keyspace) == (DEFAULT_KEYSPACE, "intervals", True)
    assert (run.partitions, run.max_offsets_per_trigger, run.metrics_port) == (2, None, 0)
    assert run.checkpoints(tmp_path) == tmp_path / "checkpoints"
    assert run.one_query is False  # a query per computation


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"MILLSTREAM_RUN_PARTITIONS": "0"}, "partitions must be at least 1"),
        ({"MILLSTREAM_RUN_PARTITIONS": "two"}, "MILLSTREAM_RUN_PARTITIONS='two'"),
        ({"MILLSTREAM_RUN_BATCH_ATTEMPTS": "0"}, "batch_attempts must be at least 1"),
        ({"MILLSTREAM_RUN_TOPIC_PARTITIONS": "searches"}, "STREAM=PARTITIONS"),
        ({"MILLSTREAM_RUN_TOPIC_PARTITIONS": "searches=0"}, r"topic_partitions\['searches'\]"),
        ({"MILLSTREAM_RUN_METRICS_PORT": "70000"}, "metrics_port must be 0 to 65535"),
        ({"MILLSTREAM_RUN_CREATE_KEYSPACE": "maybe"}, "expected true or false"),
        ({"MILLSTREAM_RUN_ONE_QUERY": "sometimes"}, "MILLSTREAM_RUN_ONE_QUERY"),
    ],
)
def test_bad_run_settings_say_what_is_wrong(environ: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(environ=environ)


def test_unknown_and_mistyped_run_settings_in_the_file_are_refused(tmp_path: Path) -> None:
    file = tmp_path / "millstream.toml"
    file.write_text('[run]\nkey_space = "x"\n')
    with pytest.raises(ConfigError, match=r"unknown setting\(s\) \['key_space'\] in \[run\]"):
        load_config(environ={}, path=file)
    file.write_text("[run]\npartitions = true\n")
    with pytest.raises(ConfigError, match="'partitions' must be a int, got True"):
        load_config(environ={}, path=file)
    file.write_text('[run]\ntopic_partitions = { searches = "8" }\n')
    with pytest.raises(ConfigError, match="topic_partitions must be a table"):
        load_config(environ={}, path=file)


def test_the_keywords_run_settings_replaced_still_work_with_a_warning() -> None:
    settings = RunSettings(keyspace="base")
    with pytest.warns(DeprecationWarning, match=r"run_topology\(keyspace=\.\.\., metrics_port"):
        changed = settings.with_deprecated_keywords(
            "run_topology", {"keyspace": "old", "metrics_port": None}
        )
    assert changed == RunSettings(keyspace="old", metrics_port=0)  # None meant off
    with pytest.raises(TypeError, match="unexpected keyword argument 'keyspaces'"):
        settings.with_deprecated_keywords("run_topology", {"keyspaces": "old"})
    assert settings.with_deprecated_keywords("run_topology", {}) is settings


def test_the_live_views_token_comes_from_the_ui_table_then_the_environment_and_never_shows(
    tmp_path: Path,
) -> None:
    file = tmp_path / "millstream.toml"
    file.write_text('[ui]\ntoken = "from-file"\n')
    config = load_config(environ={}, path=file)
    assert config.ui_token is not None
    assert config.ui_token.reveal() == "from-file"
    assert "from-file" not in repr(config)
    overridden = load_config(environ={"MILLSTREAM_UI_TOKEN": "from-env"}, path=file)
    assert overridden.ui_token is not None
    assert overridden.ui_token.reveal() == "from-env"
    assert load_config(environ={}).ui_token is None
    file.write_text("[ui]\ntoken = 42\n")
    with pytest.raises(ConfigError, match="must be a str, got a value"):
        load_config(environ={}, path=file)
