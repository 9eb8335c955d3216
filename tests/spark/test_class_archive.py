"""The local driver JVM's class-data-sharing archive: named per Java and Spark, trained whole
or not at all, used by the drivers millstream starts, and never in the way of one."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from millstream.engine.config import MillstreamConfig
from millstream.spark import class_archive
from millstream.spark.class_archive import archive_options, archive_path, java_executable, train
from millstream.spark.session import local_connector_jars, spark_conf

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def _installation(root: Path) -> tuple[Path, Path]:
    java = root / "jdk" / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text("#!/bin/sh\n")
    java.chmod(0o755)
    spark_home = root / "pyspark"
    (spark_home / "jars").mkdir(parents=True)
    (spark_home / "jars" / "spark-core.jar").write_bytes(b"core")
    return java, spark_home


@pytest.mark.unit
def test_an_archive_is_named_by_its_java_its_spark_and_the_drivers_classpath(
    tmp_path: Path,
) -> None:
    java, spark_home = _installation(tmp_path)
    store = tmp_path / "archives"
    first = archive_path(store, java, spark_home, {"spark.driver.memory": "1g"})
    assert first == archive_path(store, java, spark_home, {"spark.driver.memory": "1g"})
    assert first.parent == store
    assert first.suffix == ".jsa"
    # What changes the classes a driver loads, or how, names another archive.
    assert archive_path(store, java, spark_home, {"spark.driver.memory": "4g"}) != first
    assert (
        archive_path(
            store,
            java,
            spark_home,
            {"spark.driver.memory": "1g", "spark.driver.extraClassPath": "x"},
        )
        != first
    )
    jar = spark_home / "jars" / "spark-core.jar"
    os.utime(jar, ns=(jar.stat().st_atime_ns, jar.stat().st_mtime_ns + 10**9))
    reinstalled = archive_path(store, java, spark_home, {"spark.driver.memory": "1g"})
    assert reinstalled != first, "the JVM refuses an archive whose jars' times changed"
    jar.write_bytes(b"core, upgraded")
    upgraded = archive_path(store, java, spark_home, {"spark.driver.memory": "1g"})
    assert upgraded not in (first, reinstalled)
    java.write_text("#!/bin/sh\n# another build\n")
    assert archive_path(store, java, spark_home, {"spark.driver.memory": "1g"}) != upgraded


@pytest.mark.unit
def test_settings_that_spark_does_not_read_at_launch_keep_the_archive(tmp_path: Path) -> None:
    java, spark_home = _installation(tmp_path)
    plain = archive_path(tmp_path, java, spark_home, {"spark.driver.memory": "1g"})
    other = {"spark.driver.memory": "1g", "spark.app.name": "b", "spark.jars": "/c.jar"}
    assert archive_path(tmp_path, java, spark_home, other) == plain


@pytest.mark.unit
def test_java_is_found_as_sparks_launcher_finds_it(tmp_path: Path) -> None:
    java, _ = _installation(tmp_path)
    assert java_executable({"JAVA_HOME": str(java.parent.parent), "PATH": ""}) == java
    assert java_executable({"JAVA_HOME": str(tmp_path / "none"), "PATH": str(java.parent)}) is None
    assert java_executable({"PATH": str(java.parent)}) == java
    assert java_executable({"PATH": str(tmp_path)}) is None


def _fake_spark(root: Path, script: str) -> Path:
    """A Spark installation whose ``spark-submit`` runs ``script`` (sh), given the archive's
    partial path in ``$PARTIAL``."""
    spark_home = root / "fake-spark"
    (spark_home / "bin").mkdir(parents=True)
    (spark_home / "jars").mkdir()
    submit = spark_home / "bin" / "spark-submit"
    submit.write_text(
        "#!/bin/sh\n"
        'for a in "$@"; do case "$a" in *ArchiveClassesAtExit=*) '
        'PARTIAL="${a#*ArchiveClassesAtExit=}";; esac; done\n' + script
    )
    submit.chmod(0o755)
    return spark_home


@pytest.mark.unit
def test_an_archive_appears_whole_once_its_jvm_exited_and_only_the_recent_ones_stay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spark_home = _fake_spark(tmp_path, 'printf archive > "$PARTIAL"\nexit 0\n')
    monkeypatch.setattr(class_archive, "_spark_home", lambda: spark_home)
    store = tmp_path / "archives"
    store.mkdir()
    # Other installations' archives (other virtualenvs, an older Java), the oldest first.
    others = [store / f"spark-driver-000000000000000{n}.jsa" for n in range(3)]
    for age, other in enumerate(others):
        other.write_text("another installation's")
        other.with_suffix(".log").write_text("its training")
        os.utime(other, (1_000_000 + age, 1_000_000 + age))
    path = store / "spark-driver-1111111111111111.jsa"
    said: list[str] = []
    assert train(path, {"spark.driver.memory": "1g"}, said.append)
    assert path.read_text() == "archive"
    kept = sorted(store.glob("*.jsa"))
    assert len(kept) == class_archive.KEPT_ARCHIVES
    assert others[0] not in kept, "the least recently used archive was kept"
    assert not others[0].with_suffix(".log").exists()
    assert others[1] in kept
    assert path in kept
    assert not list(store.glob(".*partial")), "the partial file was left behind"
    assert "class archive is ready" in said[-1]


@pytest.mark.unit
def test_a_training_jvm_that_fails_leaves_no_archive_and_is_not_run_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # It wrote part of an archive and then died: a driver must never map that.
    spark_home = _fake_spark(tmp_path, 'printf half > "$PARTIAL"\necho boom\nexit 3\n')
    monkeypatch.setattr(class_archive, "_spark_home", lambda: spark_home)
    java, _ = _installation(tmp_path)
    environ = {"JAVA_HOME": str(java.parent.parent), "PATH": os.environ["PATH"]}
    store = tmp_path / "archives"
    said: list[str] = []
    assert archive_options(store, {}, said.append, environ) == ("", None)
    assert not list(store.glob("*.jsa"))
    assert not list(store.glob(".*partial"))
    assert "could not be prepared" in said[-1]
    (log,) = store.glob("*.log")
    assert "boom" in log.read_text()
    # The next driver does not train again (and starts at once without an archive).
    said.clear()
    assert archive_options(store, {}, said.append, environ) == ("", None)
    assert said == []


@pytest.mark.unit
def test_a_driver_does_not_wait_for_another_process_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spark_home = _fake_spark(tmp_path, 'printf archive > "$PARTIAL"\n')
    monkeypatch.setattr(class_archive, "_spark_home", lambda: spark_home)
    store = tmp_path / "archives"
    store.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import fcntl, sys, time
            lock = open({str(store / 'training.lock')!r}, 'w')
            fcntl.flock(lock, fcntl.LOCK_EX)
            print('locked', flush=True)
            time.sleep(60)
        """)],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "locked"
        path = store / "spark-driver-2222222222222222.jsa"
        assert not train(path, {}, lambda _m: None)
        assert not path.exists()
    finally:
        holder.kill()
        holder.wait()
    assert train(path, {}, lambda _m: None)


def _spark_submit() -> Path:
    return class_archive._spark_home() / "bin" / "spark-submit"


@pytest.mark.integration
def test_the_drivers_jvm_maps_sparks_classes_from_the_archive(
    spark: SparkSession, services: MillstreamConfig, tmp_path: Path
) -> None:
    # The suite's own driver was started with it (training it first if this Java and
    # Spark had none)...
    runtime = spark.sparkContext._jvm.java.lang.management.ManagementFactory  # type: ignore[union-attr]
    arguments = list(runtime.getRuntimeMXBean().getInputArguments())
    conf = _driver_conf(services)
    options, path = archive_options(services.home / "spark", conf, print)
    assert path is not None, "no archive for this Java and Spark"
    assert path.exists()
    assert options in arguments, arguments
    # ...and a JVM started so loads Spark's classes from it, not from the jars.
    script = tmp_path / "app.py"
    script.write_text(
        "from pyspark.sql import SparkSession\n"
        "SparkSession.builder.getOrCreate().range(3).count()\n"
    )
    loads = tmp_path / "loads.txt"
    subprocess.run(
        [
            str(_spark_submit()), "--master", "local[1]",
            "--conf", "spark.ui.enabled=false",
            "--conf", "spark.driver.memory=1g",
            # The archive holds the classpath it was made on: a JVM on another maps nothing.
            "--conf", f"spark.driver.extraClassPath={conf.get('spark.driver.extraClassPath', '')}",
            "--conf", f"spark.driver.extraJavaOptions={options} "
            f"-Xlog:class+load=info:file={loads}",
            str(script),
        ],
        check=True, capture_output=True, timeout=120, cwd=tmp_path,
        env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable},
    )  # fmt: skip
    lines = loads.read_text().splitlines()
    spark_context = [line for line in lines if " org.apache.spark.SparkContext " in line]
    assert spark_context, "the JVM did not log its class loads"
    assert "shared objects file (top)" in spark_context[0], spark_context
    shared = sum("shared objects file (top)" in line for line in lines)
    assert shared > 5_000, f"only {shared} of {len(lines)} classes came from the archive"


@pytest.mark.integration
def test_a_driver_whose_jvm_cannot_map_its_archive_starts_without_it_and_removes_it(
    services: MillstreamConfig, tmp_path: Path
) -> None:
    # Its own home: the suite's archive stays whole. The connector's classpath is resolved.
    home = tmp_path / "home"
    shutil.copytree(services.home / "artifacts", home / "artifacts")
    _, whole = archive_options(services.home / "spark", _driver_conf(services), print)
    assert whole is not None, "no archive for this Java and Spark"
    # The same archive cut short (as a crash while writing it would leave it): a JVM that
    # maps it dies as it starts, as one whose archive went bad on disk would.
    path = home / "spark" / whole.name
    path.parent.mkdir(parents=True)
    with whole.open("rb") as source:
        path.write_bytes(source.read(whole.stat().st_size // 3))
    script = textwrap.dedent(f"""
        from dataclasses import replace
        from pathlib import Path
        from millstream.engine.config import load_config
        from millstream.spark.session import spark_session
        session = spark_session(replace(load_config(), home=Path({str(home)!r})))
        print("sum", session.range(4).groupBy().sum().collect()[0][0], flush=True)
        session.stop()
    """)
    started = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=180, cwd=tmp_path,
        env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"},
    )  # fmt: skip
    assert started.returncode == 0, started.stderr[-3000:]
    assert "sum 6" in started.stdout
    assert "did not start with its class archive" in started.stderr
    assert not path.exists()


def _driver_conf(services: MillstreamConfig) -> dict[str, str]:
    """The settings a local driver of ``services`` starts with, its classpath included (the
    archive depends on it)."""
    return spark_conf(services, "x", local_connector_jars(services, print))
