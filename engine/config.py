"""Where millstream finds Kafka, Cassandra and Spark, and how it sizes Spark.

Settings come from three layers, later ones winning:

1. built-in defaults: the local single-node stack that ``millstream up`` runs;
2. a TOML file: ``$MILLSTREAM_CONFIG`` if set, else ``./millstream.toml`` if present;
3. environment variables ``MILLSTREAM_*``.

The TOML file and the variables name the same settings::

    home = "~/.millstream"                 # MILLSTREAM_HOME
    [kafka]
    bootstrap = "broker1:9092,broker2:9092" # MILLSTREAM_KAFKA_BOOTSTRAP
    controller_port = 9093                  # MILLSTREAM_KAFKA_CONTROLLER_PORT (local stack only)
    java_options = ["-XX:TieredStopAtLevel=1"]  # MILLSTREAM_KAFKA_JAVA_OPTIONS (local stack
                                            #   only): added to each broker's JVM options
    watermark_topic = "millstream.watermarks"  # MILLSTREAM_KAFKA_WATERMARK_TOPIC
    replication = 3                         # MILLSTREAM_KAFKA_REPLICATION: replicas per topic
    security_protocol = "SASL_SSL"          # MILLSTREAM_KAFKA_SECURITY_PROTOCOL: PLAINTEXT
                                            #   (default), SSL, SASL_PLAINTEXT or SASL_SSL
    sasl_mechanism = "SCRAM-SHA-512"        # MILLSTREAM_KAFKA_SASL_MECHANISM (the default;
                                            #   or SCRAM-SHA-256, PLAIN)
    username = "millstream"                 # MILLSTREAM_KAFKA_USERNAME
    password = "..."                        # MILLSTREAM_KAFKA_PASSWORD (prefer the variable)
    ca_file = "/etc/millstream/kafka-ca.pem"  # MILLSTREAM_KAFKA_CA_FILE: the CA (PEM) that
                                            #   signed the brokers' certificates
    [cassandra]
    hosts = ["cass1", "cass2"]              # MILLSTREAM_CASSANDRA_HOSTS (comma separated)
    port = 9042                             # MILLSTREAM_CASSANDRA_PORT
    storage_port = 7000                     # MILLSTREAM_CASSANDRA_STORAGE_PORT (local stack only)
    java_options = ["-XX:TieredStopAtLevel=1"]  # MILLSTREAM_CASSANDRA_JAVA_OPTIONS (local
                                            #   stack only): added to each node's JVM options
    replication = 3                         # MILLSTREAM_CASSANDRA_REPLICATION: per keyspace
    username = "millstream"                 # MILLSTREAM_CASSANDRA_USERNAME (PasswordAuthenticator)
    password = "..."                        # MILLSTREAM_CASSANDRA_PASSWORD (prefer the variable)
    tls = true                              # MILLSTREAM_CASSANDRA_TLS: client encryption
    ca_file = "/etc/millstream/cassandra-ca.pem"  # MILLSTREAM_CASSANDRA_CA_FILE: the CA (PEM)
                                            #   that signed the nodes' certificates
    [spark]
    master = "spark://master:7077"          # MILLSTREAM_SPARK_MASTER
    shuffle_partitions = 2                  # MILLSTREAM_SPARK_SHUFFLE_PARTITIONS
    ui = false                              # MILLSTREAM_SPARK_UI
    class_archive = true                    # MILLSTREAM_SPARK_CLASS_ARCHIVE: a local driver's
                                            #   JVM maps Spark's classes from an archive
    packages = ["org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0"]  # MILLSTREAM_SPARK_PACKAGES
    [spark.conf]
    "spark.executor.memory" = "4g"
    [executor]
    cache_bytes = 134217728                 # MILLSTREAM_EXECUTOR_CACHE_BYTES: per Python worker
    interval_threads = 4                    # MILLSTREAM_EXECUTOR_INTERVAL_THREADS: per task
    [ui]                                    # the live view (millstream ui)
    token = "..."                           # MILLSTREAM_UI_TOKEN: what every request needs
                                            #   (required off loopback; prefer the variable)
    [run]                                   # a run's deployment: see RunSettings
    keyspace = "millstream"                 # MILLSTREAM_RUN_KEYSPACE
    table = "intervals"                     # MILLSTREAM_RUN_TABLE
    create_keyspace = true                  # MILLSTREAM_RUN_CREATE_KEYSPACE
    checkpoint_root = "/srv/checkpoints"    # MILLSTREAM_RUN_CHECKPOINT_ROOT (<home>/checkpoints)
    partitions = 2                          # MILLSTREAM_RUN_PARTITIONS
    topic_partitions = { searches = 8 }     # MILLSTREAM_RUN_TOPIC_PARTITIONS="searches=8,clicks=4"
    max_offsets_per_trigger = 60000         # MILLSTREAM_RUN_MAX_OFFSETS_PER_TRIGGER
    batch_attempts = 3                      # MILLSTREAM_RUN_BATCH_ATTEMPTS
    outage_timeout = 900.0                  # MILLSTREAM_RUN_OUTAGE_TIMEOUT (seconds)
    metrics_port = 9400                     # MILLSTREAM_RUN_METRICS_PORT (0, the default: off)
    metrics_address = "127.0.0.1"           # MILLSTREAM_RUN_METRICS_ADDRESS
    one_query = false                       # MILLSTREAM_RUN_ONE_QUERY: the whole topology in
                                            #   one streaming query (default: one each)

Passwords are held as :class:`Secret`, whose repr and str are ``***``: a config can be
logged, printed or put into an error message without showing them. Without ``ca_file``, TLS
verifies servers against the system's trusted CAs.
"""

from __future__ import annotations

import os
import shlex
import tomllib
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Final

from millstream.engine.cache import DEFAULT_CACHE_BYTES
from millstream.engine.errors import ConfigError
from millstream.engine.outages import DEFAULT_OUTAGE_TIMEOUT

__all__ = [
    "CONFIG_FILE_NAME",
    "DEFAULT_KEYSPACE",
    "DEFAULT_METRICS_ADDRESS",
    "DEFAULT_PARTITIONS",
    "DEFAULT_TABLE",
    "KAFKA_SASL_MECHANISMS",
    "KAFKA_SECURITY_PROTOCOLS",
    "MillstreamConfig",
    "RunSettings",
    "Secret",
    "load_config",
    "setting_name",
]

CONFIG_FILE_NAME = "millstream.toml"
DEFAULT_KEYSPACE: Final = "millstream"
"""The Cassandra keyspace of a run's state and injector checkpoints, unless [run] names one."""
DEFAULT_TABLE: Final = "intervals"
"""The interval table in that keyspace (:mod:`millstream.engine.stores.cassandra`)."""
DEFAULT_PARTITIONS: Final = 2
"""Partitions of each stream topic millstream creates, unless [run] says otherwise."""
DEFAULT_METRICS_ADDRESS: Final = "127.0.0.1"
"""Where a metrics endpoint listens unless told: the loopback interface (exposing metrics to
other hosts is a choice, ``0.0.0.0``)."""
_LOOPBACK = "127.0.0.1"

KAFKA_SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
KAFKA_SASL_MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN")


@dataclass(frozen=True)
class Secret:
    """A password: ``repr`` and ``str`` show ``***``; :meth:`reveal` is the one way to the
    text, called only where a client library takes it."""

    value: str = field(repr=False)

    def reveal(self) -> str:
        return self.value

    def __repr__(self) -> str:
        return "'***'"

    def __str__(self) -> str:
        return "***"


# Where each security setting lives, for error messages: "[kafka] username
# (MILLSTREAM_KAFKA_USERNAME)".
def setting_name(table: str, *keys: str) -> str:
    """``[table] a/b (MILLSTREAM_TABLE_A, MILLSTREAM_TABLE_B)``: how a message names settings."""
    variables = ", ".join(f"MILLSTREAM_{table.upper()}_{key.upper()}" for key in keys)
    return f"[{table}] {'/'.join(keys)} ({variables})"


@dataclass(frozen=True)
class RunSettings:
    """How a run is deployed: where its state lives, how its topics are made, how it copes.

    One object for everything that belongs to the deployment rather than to the code, read
    by :func:`load_config` from the ``[run]`` table or ``MILLSTREAM_RUN_*`` (it is
    ``config.run``), and taken once by each entry point: ``run_topology`` and
    ``RunningTopology`` (:mod:`millstream.spark`), ``connect_injector``
    (:mod:`millstream.injectors`), ``millstream run``, and the provisioning they all go
    through (:func:`millstream.connectors.provision`). Change a field for one run with
    ``dataclasses.replace(config.run, keyspace="zeitgeist")``.

    - ``keyspace``, ``table``: the Cassandra keyspace and interval table of the run's state,
      timers, pending productions and injector checkpoints. With ``create_keyspace`` a
      missing keyspace is created (SimpleStrategy, ``[cassandra] replication`` replicas: for
      development; a production keyspace is made by its operators, then set it to false).
    - ``checkpoint_root``: where each computation's query keeps its Kafka offsets
      (``<root>/<topology>/<computation>``); ``None``: ``<home>/checkpoints``.
    - ``partitions``: partitions of each stream topic created, or
      ``topic_partitions[stream]``. Existing topics are left as they are.
    - ``max_offsets_per_trigger``: the most Kafka records one micro-batch reads (Spark's
      ``maxOffsetsPerTrigger``; ``None``: no cap).
    - ``batch_attempts``: runs of a failing micro-batch before its query stops with the error.
    - ``outage_timeout``: seconds a driver waits out Kafka or Cassandra being unreachable
      (:mod:`millstream.engine.outages`).
    - ``metrics_port``, ``metrics_address``: where a topology's driver (or a lone injector
      process) serves its Prometheus metrics, ``http://ADDRESS:PORT/metrics``; port 0: off.
    - ``one_query``: run the topology's computations in one streaming query (one checkpoint,
      ``<root>/<topology>/@topology``), each batch working every computation, instead of a
      query each: a pipeline's record then passes its stages in the batch that read it
      (each stage reads what its upstream just committed), not waiting at each stage for
      the batch the next query is running and one of its own. The set of computations is
      fixed while it runs (see :class:`~millstream.spark.RunningTopology`).
    """

    keyspace: str = DEFAULT_KEYSPACE
    table: str = DEFAULT_TABLE
    create_keyspace: bool = True
    checkpoint_root: Path | None = None
    partitions: int = DEFAULT_PARTITIONS
    topic_partitions: Mapping[str, int] = field(default_factory=dict)
    max_offsets_per_trigger: int | None = None
    batch_attempts: int = 3
    outage_timeout: float = DEFAULT_OUTAGE_TIMEOUT
    metrics_port: int = 0
    metrics_address: str = DEFAULT_METRICS_ADDRESS
    one_query: bool = False

    def __post_init__(self) -> None:
        # A private copy: the caller's dict may change, this object may not.
        object.__setattr__(self, "topic_partitions", dict(self.topic_partitions))
        if not self.keyspace or not self.table:
            raise ValueError("run keyspace and table must be non-empty names")
        if self.partitions < 1:
            raise ValueError(f"run partitions must be at least 1, got {self.partitions}")
        for stream, count in self.topic_partitions.items():
            if count < 1:
                raise ValueError(
                    f"run topic_partitions[{stream!r}] must be at least 1, got {count}"
                )
        if self.max_offsets_per_trigger is not None and self.max_offsets_per_trigger < 1:
            raise ValueError(
                "run max_offsets_per_trigger must be at least 1 (or unset), got "
                f"{self.max_offsets_per_trigger}"
            )
        if self.batch_attempts < 1:
            raise ValueError(f"run batch_attempts must be at least 1, got {self.batch_attempts}")
        if self.outage_timeout < 0:
            raise ValueError(f"run outage_timeout must be >= 0 s, got {self.outage_timeout}")
        if not 0 <= self.metrics_port <= 65535:
            raise ValueError(f"run metrics_port must be 0 to 65535, got {self.metrics_port}")

    def partitions_of(self, stream: str) -> int:
        """How many partitions ``stream``'s topic gets if millstream creates it."""
        return self.topic_partitions.get(stream, self.partitions)

    def checkpoints(self, home: Path) -> Path:
        """The checkpoint root: ``checkpoint_root``, else ``<home>/checkpoints``."""
        return self.checkpoint_root or home / "checkpoints"

    def with_deprecated_keywords(self, caller: str, keywords: Mapping[str, Any]) -> RunSettings:
        """These settings changed by the keyword arguments the entry points took before
        :class:`RunSettings` (``run_topology(..., keyspace="k")``), with a
        ``DeprecationWarning``; the keywords go in 0.3. An unknown keyword is a
        ``TypeError``, as for any function."""
        if not keywords:
            return self
        known = {f.name for f in fields(RunSettings)}
        unknown = sorted(set(keywords) - known)
        if unknown:
            raise TypeError(f"{caller}() got an unexpected keyword argument {unknown[0]!r}")
        shown = ", ".join(f"{name}=..." for name in keywords)
        warnings.warn(
            f"{caller}({shown}) is deprecated and goes in 0.3; pass "
            f"RunSettings({shown}) instead (or set them in millstream.toml's [run] table)",
            DeprecationWarning,
            stacklevel=3,
        )
        changes = dict(keywords)
        if "metrics_port" in changes and changes["metrics_port"] is None:
            changes["metrics_port"] = 0  # None meant off
        return replace(self, **changes)


@dataclass(frozen=True)
class MillstreamConfig:
    """Endpoints and sizing; build one with :func:`load_config` or directly in tests.

    ``run`` holds the deployment of a run (:class:`RunSettings`, the ``[run]`` table).
    """

    home: Path = field(default_factory=lambda: Path("~/.millstream").expanduser())
    kafka_bootstrap: str = f"{_LOOPBACK}:9092"
    kafka_controller_port: int = 9093
    # Extra options of the local stack's JVMs, after its own (so they win). A short-lived
    # stack, a test run's, starts in half the CPU with -XX:TieredStopAtLevel=1 (no C2 JIT).
    kafka_java_options: tuple[str, ...] = ()
    # The compacted topic of low-watermark reports (see millstream.engine.watermarks).
    kafka_watermark_topic: str = "millstream.watermarks"
    # Replicas of every topic millstream creates (streams, dead letters, watermark, wake-ups);
    # the brokers' min.insync.replicas decides how many must acknowledge a write.
    kafka_replication: int = 1
    # Seconds an open Kafka transaction of transactional productions may last before the
    # broker aborts it: the longest a dead owner's transaction holds read_committed readers
    # back (its successor's open aborts it sooner). Kafka caps it at the brokers'
    # transaction.max.timeout.ms (15 minutes by default).
    kafka_transaction_timeout: float = 30.0
    cassandra_hosts: tuple[str, ...] = (_LOOPBACK,)
    cassandra_port: int = 9042
    cassandra_storage_port: int = 7000
    cassandra_java_options: tuple[str, ...] = ()
    # The replication factor of the keyspaces millstream creates (SimpleStrategy); 3 lets the
    # store's QUORUM and SERIAL requests go on with one replica down.
    cassandra_replication: int = 1
    spark_master: str = "local[*]"
    spark_shuffle_partitions: int = 2
    spark_ui: bool = False
    # A local driver's JVM maps Spark's classes from an archive trained once per Java and
    # Spark (millstream.spark.class_archive): it starts in about half the time.
    spark_class_archive: bool = True
    spark_packages: tuple[str, ...] = ()
    spark_conf: Mapping[str, str] = field(default_factory=dict)
    # Bytes of soft state (key state and timers) each executor Python process keeps cached.
    executor_cache_bytes: int = DEFAULT_CACHE_BYTES
    # Key intervals a task works at once: their Cassandra and Kafka round trips overlap (user
    # code still runs one call at a time per process).
    executor_interval_threads: int = 4
    # Net allocations between collections of the youngest generation in each executor Python
    # process (Python's default, 700, cost a sixth of a worker's CPU); 0: Python's own.
    executor_gc_threshold: int = 50_000
    # Kafka security: PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL; SASL needs a username and
    # password; ca_file (PEM) is the CA the brokers' certificates are verified against.
    kafka_security_protocol: str = "PLAINTEXT"
    kafka_sasl_mechanism: str = "SCRAM-SHA-512"
    kafka_username: str | None = None
    kafka_password: Secret | None = None
    kafka_ca_file: Path | None = None
    # Cassandra security: PasswordAuthenticator credentials, and TLS to the native port.
    cassandra_username: str | None = None
    cassandra_password: Secret | None = None
    cassandra_tls: bool = False
    cassandra_ca_file: Path | None = None
    # The live view's token (millstream ui): required on any address but loopback.
    ui_token: Secret | None = None
    run: RunSettings = field(default_factory=RunSettings)

    def __post_init__(self) -> None:
        self._check_security()
        for name in ("kafka_replication", "cassandra_replication"):
            if getattr(self, name) < 1:
                kind = name.split("_")[0]
                raise ValueError(
                    f"{kind} replication must be at least 1, got {getattr(self, name)}"
                )
        if not 1.0 <= self.kafka_transaction_timeout <= 900.0:
            raise ValueError(
                "kafka transaction_timeout must be 1 to 900 seconds, got "
                f"{self.kafka_transaction_timeout}"
            )
        if self.executor_cache_bytes < 0:
            raise ValueError(
                f"executor cache_bytes must be non-negative, got {self.executor_cache_bytes}"
            )
        if self.executor_gc_threshold < 0:
            raise ValueError(
                f"executor gc_threshold must be non-negative, got {self.executor_gc_threshold}"
            )
        if self.executor_interval_threads < 1:
            raise ValueError(
                "executor interval_threads must be at least 1, got "
                f"{self.executor_interval_threads}"
            )

    def _check_security(self) -> None:
        """Raise :class:`ConfigError` naming the setting to fix (TOML key and variable)."""
        if self.kafka_security_protocol not in KAFKA_SECURITY_PROTOCOLS:
            raise ConfigError(
                f"{setting_name('kafka', 'security_protocol')} is "
                f"{self.kafka_security_protocol!r}; use one of "
                f"{', '.join(KAFKA_SECURITY_PROTOCOLS)}"
            )
        if self.kafka_sasl_mechanism not in KAFKA_SASL_MECHANISMS:
            raise ConfigError(
                f"{setting_name('kafka', 'sasl_mechanism')} is {self.kafka_sasl_mechanism!r}; "
                f"use one of {', '.join(KAFKA_SASL_MECHANISMS)}"
            )
        if self.kafka_sasl and (not self.kafka_username or self.kafka_password is None):
            missing = "password" if self.kafka_username else "username"
            raise ConfigError(
                f"[kafka] security_protocol {self.kafka_security_protocol} authenticates with "
                f"a username and password, but the {missing} "
                f"is not set; set {setting_name('kafka', 'username', 'password')}"
            )
        if (self.cassandra_username is None) != (self.cassandra_password is None):
            missing = "password" if self.cassandra_password is None else "username"
            raise ConfigError(
                f"Cassandra credentials need both a username and a password, but the {missing} "
                f"is not set; set {setting_name('cassandra', missing)}"
            )
        for table, ca_file in (
            ("kafka", self.kafka_ca_file),
            ("cassandra", self.cassandra_ca_file),
        ):
            if ca_file is not None and not ca_file.is_file():
                raise ConfigError(
                    f"{setting_name(table, 'ca_file')} names {ca_file}, which does not exist; "
                    "point it at the PEM file of the CA that signed the servers' certificates"
                )

    @property
    def kafka_sasl(self) -> bool:
        """Whether Kafka clients authenticate with SASL."""
        return self.kafka_security_protocol.startswith("SASL_")

    @property
    def kafka_tls(self) -> bool:
        """Whether Kafka connections are encrypted (and brokers' certificates verified)."""
        return self.kafka_security_protocol in ("SSL", "SASL_SSL")

    @property
    def kafka_port(self) -> int:
        """The port of the first bootstrap server, which the local broker listens on."""
        first = self.kafka_bootstrap.split(",")[0].strip()
        return int(first.rsplit(":", 1)[1])

    @property
    def spark_is_local(self) -> bool:
        return self.spark_master.startswith("local")

    def with_home(self, home: Path) -> MillstreamConfig:
        return replace(self, home=home)

    def with_run(self, run: RunSettings) -> MillstreamConfig:
        return replace(self, run=run)


def load_config(
    environ: Mapping[str, str] | None = None, path: Path | None = None
) -> MillstreamConfig:
    """Merge defaults, the TOML file and ``MILLSTREAM_*`` variables into one config.

    ``environ`` defaults to ``os.environ``; ``path`` overrides ``$MILLSTREAM_CONFIG``.
    """
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    file = path or _config_file(env)
    if file is not None:
        values.update(_from_toml(file))
    values.update(_from_env(env))
    run = values.pop("run", {}) | values.pop("run_env", {})
    try:
        values["run"] = RunSettings(**run)
        config = MillstreamConfig(**values)
        _ = config.kafka_port
    except (TypeError, ValueError, IndexError) as exc:
        raise ConfigError(
            f"invalid millstream settings ({exc}); check {file or 'the MILLSTREAM_* variables'}"
        ) from exc
    return config


def _config_file(env: Mapping[str, str]) -> Path | None:
    named = env.get("MILLSTREAM_CONFIG")
    if named:
        file = Path(named).expanduser()
        if not file.is_file():
            raise ConfigError(
                f"MILLSTREAM_CONFIG names {file}, which does not exist; "
                "point it at a TOML file or unset it"
            )
        return file
    local = Path.cwd() / CONFIG_FILE_NAME
    return local if local.is_file() else None


def _from_toml(file: Path) -> dict[str, Any]:
    try:
        doc = tomllib.loads(file.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read config file {file}: {exc}; fix the TOML") from exc
    known = {"home", "kafka", "cassandra", "spark", "executor", "ui", "run"}
    unknown = set(doc) - known
    if unknown:
        raise ConfigError(
            f"unknown setting(s) {sorted(unknown)} in {file}; allowed: {sorted(known)}"
        )
    kafka, cassandra, spark, executor, ui = (
        _table(doc, name, file) for name in ("kafka", "cassandra", "spark", "executor", "ui")
    )
    values: dict[str, Any] = {}
    if "home" in doc:
        values["home"] = Path(str(doc["home"])).expanduser()
    _take(values, "kafka_bootstrap", kafka, "bootstrap", str)
    _take(values, "kafka_controller_port", kafka, "controller_port", int)
    _take_options(values, "kafka_java_options", kafka, file)
    _take(values, "kafka_watermark_topic", kafka, "watermark_topic", str)
    _take(values, "kafka_replication", kafka, "replication", int)
    _take(values, "kafka_transaction_timeout", kafka, "transaction_timeout", float)
    _take(values, "kafka_security_protocol", kafka, "security_protocol", str)
    _take(values, "kafka_sasl_mechanism", kafka, "sasl_mechanism", str)
    _take(values, "kafka_username", kafka, "username", str)
    _take(values, "kafka_password", kafka, "password", str)
    _take(values, "kafka_ca_file", kafka, "ca_file", str)
    if "hosts" in cassandra:
        hosts = cassandra["hosts"]
        values["cassandra_hosts"] = tuple(hosts) if isinstance(hosts, list) else _split(str(hosts))
    _take(values, "cassandra_port", cassandra, "port", int)
    _take(values, "cassandra_storage_port", cassandra, "storage_port", int)
    _take_options(values, "cassandra_java_options", cassandra, file)
    _take(values, "cassandra_replication", cassandra, "replication", int)
    _take(values, "cassandra_username", cassandra, "username", str)
    _take(values, "cassandra_password", cassandra, "password", str)
    _take(values, "cassandra_tls", cassandra, "tls", bool)
    _take(values, "cassandra_ca_file", cassandra, "ca_file", str)
    _take(values, "spark_master", spark, "master", str)
    _take(values, "spark_shuffle_partitions", spark, "shuffle_partitions", int)
    _take(values, "spark_ui", spark, "ui", bool)
    _take(values, "spark_class_archive", spark, "class_archive", bool)
    if "packages" in spark:
        values["spark_packages"] = tuple(str(p) for p in spark["packages"])
    if "conf" in spark:
        values["spark_conf"] = {str(k): str(v) for k, v in dict(spark["conf"]).items()}
    _take(values, "executor_cache_bytes", executor, "cache_bytes", int)
    _take(values, "executor_interval_threads", executor, "interval_threads", int)
    _take(values, "executor_gc_threshold", executor, "gc_threshold", int)
    _take(values, "ui_token", ui, "token", str)
    values["run"] = _run_from_toml(_table(doc, "run", file))
    return _typed_security(values)


def _run_from_toml(table: Mapping[str, Any]) -> dict[str, Any]:
    run: dict[str, Any] = {}
    unknown = set(table) - {f.name for f in fields(RunSettings)}
    if unknown:
        raise ConfigError(
            f"unknown setting(s) {sorted(unknown)} in [run]; allowed: "
            f"{sorted(f.name for f in fields(RunSettings))}"
        )
    for name in ("keyspace", "table", "metrics_address"):
        _take(run, name, table, name, str)
    for name in ("create_keyspace", "one_query"):
        _take(run, name, table, name, bool)
    for name in ("partitions", "max_offsets_per_trigger", "batch_attempts", "metrics_port"):
        _take(run, name, table, name, int)
    if "outage_timeout" in table:
        _take(run, "outage_timeout", table, "outage_timeout", (int, float))
        run["outage_timeout"] = float(run["outage_timeout"])
    if "checkpoint_root" in table:
        _take(run, "checkpoint_root", table, "checkpoint_root", str)
        run["checkpoint_root"] = Path(run["checkpoint_root"]).expanduser()
    if "topic_partitions" in table:
        counts = table["topic_partitions"]
        if not isinstance(counts, dict) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in counts.values()
        ):
            raise ConfigError(
                "[run] topic_partitions must be a table of stream = partitions, e.g. "
                "{ searches = 8 }"
            )
        run["topic_partitions"] = {str(k): v for k, v in counts.items()}
    return run


def _typed_security(values: dict[str, Any]) -> dict[str, Any]:
    """Passwords as :class:`Secret`, CA files as expanded paths."""
    for key in ("kafka_password", "cassandra_password", "ui_token"):
        if key in values:
            values[key] = Secret(values[key])
    for key in ("kafka_ca_file", "cassandra_ca_file"):
        if key in values:
            values[key] = Path(values[key]).expanduser()
    return values


def _table(doc: Mapping[str, Any], name: str, file: Path) -> Mapping[str, Any]:
    table = doc.get(name, {})
    if not isinstance(table, dict):
        raise ConfigError(f"[{name}] in {file} must be a table")
    return table


def _take(
    values: dict[str, Any],
    key: str,
    table: Mapping[str, Any],
    name: str,
    kind: type | tuple[type, ...],
) -> None:
    if name in table:
        value = table[name]
        # TOML's true is no number of partitions.
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
            # Never echo a password, even a mistyped one.
            shown = "a value" if name in ("password", "token") else repr(value)
            kinds = kind if isinstance(kind, tuple) else (kind,)
            expected = " or ".join(k.__name__ for k in kinds)
            raise ConfigError(f"setting {name!r} must be a {expected}, got {shown}")
        values[key] = value


def _take_options(values: dict[str, Any], key: str, table: Mapping[str, Any], file: Path) -> None:
    """``java_options``: a list of strings, or one string split as a shell would."""
    _take(values, key, table, "java_options", (list, str))
    if key not in values:
        return
    raw = values[key]
    if isinstance(raw, str):
        values[key] = _java_options(raw)
    elif all(isinstance(option, str) for option in raw):
        values[key] = tuple(raw)
    else:
        raise ConfigError(f"setting 'java_options' in {file} must list strings, got {raw!r}")


def _from_env(env: Mapping[str, str]) -> dict[str, Any]:
    converters: dict[str, tuple[str, Any]] = {
        "MILLSTREAM_HOME": ("home", lambda v: Path(v).expanduser()),
        "MILLSTREAM_KAFKA_BOOTSTRAP": ("kafka_bootstrap", str),
        "MILLSTREAM_KAFKA_CONTROLLER_PORT": ("kafka_controller_port", int),
        "MILLSTREAM_KAFKA_JAVA_OPTIONS": ("kafka_java_options", _java_options),
        "MILLSTREAM_KAFKA_WATERMARK_TOPIC": ("kafka_watermark_topic", str),
        "MILLSTREAM_KAFKA_REPLICATION": ("kafka_replication", int),
        "MILLSTREAM_KAFKA_TRANSACTION_TIMEOUT": ("kafka_transaction_timeout", float),
        "MILLSTREAM_CASSANDRA_HOSTS": ("cassandra_hosts", _split),
        "MILLSTREAM_CASSANDRA_PORT": ("cassandra_port", int),
        "MILLSTREAM_CASSANDRA_STORAGE_PORT": ("cassandra_storage_port", int),
        "MILLSTREAM_CASSANDRA_JAVA_OPTIONS": ("cassandra_java_options", _java_options),
        "MILLSTREAM_CASSANDRA_REPLICATION": ("cassandra_replication", int),
        "MILLSTREAM_SPARK_MASTER": ("spark_master", str),
        "MILLSTREAM_SPARK_SHUFFLE_PARTITIONS": ("spark_shuffle_partitions", int),
        "MILLSTREAM_SPARK_UI": ("spark_ui", _boolean),
        "MILLSTREAM_SPARK_CLASS_ARCHIVE": ("spark_class_archive", _boolean),
        "MILLSTREAM_SPARK_PACKAGES": ("spark_packages", _split),
        "MILLSTREAM_EXECUTOR_CACHE_BYTES": ("executor_cache_bytes", int),
        "MILLSTREAM_EXECUTOR_INTERVAL_THREADS": ("executor_interval_threads", int),
        "MILLSTREAM_EXECUTOR_GC_THRESHOLD": ("executor_gc_threshold", int),
        "MILLSTREAM_KAFKA_SECURITY_PROTOCOL": ("kafka_security_protocol", str),
        "MILLSTREAM_KAFKA_SASL_MECHANISM": ("kafka_sasl_mechanism", str),
        "MILLSTREAM_KAFKA_USERNAME": ("kafka_username", str),
        "MILLSTREAM_KAFKA_PASSWORD": ("kafka_password", str),
        "MILLSTREAM_KAFKA_CA_FILE": ("kafka_ca_file", str),
        "MILLSTREAM_CASSANDRA_USERNAME": ("cassandra_username", str),
        "MILLSTREAM_CASSANDRA_PASSWORD": ("cassandra_password", str),
        "MILLSTREAM_CASSANDRA_TLS": ("cassandra_tls", _boolean),
        "MILLSTREAM_CASSANDRA_CA_FILE": ("cassandra_ca_file", str),
        "MILLSTREAM_UI_TOKEN": ("ui_token", str),
    }
    run_converters: dict[str, Any] = {
        "keyspace": str,
        "table": str,
        "create_keyspace": _boolean,
        "checkpoint_root": lambda v: Path(v).expanduser(),
        "partitions": int,
        "topic_partitions": _counts,
        "max_offsets_per_trigger": int,
        "batch_attempts": int,
        "outage_timeout": float,
        "metrics_port": int,
        "metrics_address": str,
        "one_query": _boolean,
    }
    converters.update(
        (f"MILLSTREAM_RUN_{name.upper()}", (f"run.{name}", convert))
        for name, convert in run_converters.items()
    )
    values: dict[str, Any] = {}
    run: dict[str, Any] = {}
    for variable, (key, convert) in converters.items():
        raw = env.get(variable)
        if raw is None or raw == "":
            continue
        try:
            converted = convert(raw)
        except ValueError as exc:
            raise ConfigError(f"{variable}={raw!r} is not valid: {exc}") from exc
        if key.startswith("run."):
            run[key.removeprefix("run.")] = converted
        else:
            values[key] = converted
    if run:
        values["run_env"] = run
    return _typed_security(values)


def _split(raw: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in raw.split(",") if part.strip())


def _java_options(raw: str) -> tuple[str, ...]:
    """JVM options as a shell would split them (a quoted option may hold spaces)."""
    return tuple(shlex.split(raw))


def _counts(raw: str) -> dict[str, int]:
    """``searches=8,clicks=4`` as ``{"searches": 8, "clicks": 4}``."""
    counts: dict[str, int] = {}
    for part in _split(raw):
        stream, equals, count = part.partition("=")
        if not equals or not stream.strip():
            raise ValueError(f"expected STREAM=PARTITIONS, got {part!r}")
        counts[stream.strip()] = int(count)
    return counts


def _boolean(raw: str) -> bool:
    lowered = raw.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise ValueError("expected true or false")
