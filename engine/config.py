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
    packages = ["org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0"]  # MILLSTREAM_SPARK_PACKAGES
    [spark.conf]
    "spark.executor.memory" = "4g"
    [executor]
    cache_bytes = 134217728                 # MILLSTREAM_EXECUTOR_CACHE_BYTES: per Python worker
    interval_threads = 4                    # MILLSTREAM_EXECUTOR_INTERVAL_THREADS: per task

Passwords are held as :class:`Secret`, whose repr and str are ``***``: a config can be
logged, printed or put into an error message without showing them. Without ``ca_file``, TLS
verifies servers against the system's trusted CAs.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from millstream.engine.cache import DEFAULT_CACHE_BYTES
from millstream.engine.errors import ConfigError

__all__ = [
    "CONFIG_FILE_NAME",
    "KAFKA_SASL_MECHANISMS",
    "KAFKA_SECURITY_PROTOCOLS",
    "MillstreamConfig",
    "Secret",
    "load_config",
    "setting_name",
]

CONFIG_FILE_NAME = "millstream.toml"
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
class MillstreamConfig:
    """Endpoints and sizing; build one with :func:`load_config` or directly in tests."""

    home: Path = field(default_factory=lambda: Path("~/.millstream").expanduser())
    kafka_bootstrap: str = f"{_LOOPBACK}:9092"
    kafka_controller_port: int = 9093
    # The compacted topic of low-watermark reports (see millstream.engine.watermarks).
    kafka_watermark_topic: str = "millstream.watermarks"
    # Replicas of every topic millstream creates (streams, dead letters, watermark, wake-ups);
    # the brokers' min.insync.replicas decides how many must acknowledge a write.
    kafka_replication: int = 1
    cassandra_hosts: tuple[str, ...] = (_LOOPBACK,)
    cassandra_port: int = 9042
    cassandra_storage_port: int = 7000
    # The replication factor of the keyspaces millstream creates (SimpleStrategy); 3 lets the
    # store's QUORUM and SERIAL requests go on with one replica down.
    cassandra_replication: int = 1
    spark_master: str = "local[*]"
    spark_shuffle_partitions: int = 2
    spark_ui: bool = False
    spark_packages: tuple[str, ...] = ()
    spark_conf: Mapping[str, str] = field(default_factory=dict)
    # Bytes of soft state (key state and timers) each executor Python process keeps cached.
    executor_cache_bytes: int = DEFAULT_CACHE_BYTES
    # Key intervals a task works at once: their Cassandra and Kafka round trips overlap (user
    # code still runs one call at a time per process).
    executor_interval_threads: int = 4
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

    def __post_init__(self) -> None:
        self._check_security()
        for name in ("kafka_replication", "cassandra_replication"):
            if getattr(self, name) < 1:
                kind = name.split("_")[0]
                raise ValueError(
                    f"{kind} replication must be at least 1, got {getattr(self, name)}"
                )
        if self.executor_cache_bytes < 0:
            raise ValueError(
                f"executor cache_bytes must be non-negative, got {self.executor_cache_bytes}"
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
    try:
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
    known = {"home", "kafka", "cassandra", "spark", "executor"}
    unknown = set(doc) - known
    if unknown:
        raise ConfigError(
            f"unknown setting(s) {sorted(unknown)} in {file}; allowed: {sorted(known)}"
        )
    kafka, cassandra, spark, executor = (
        _table(doc, name, file) for name in ("kafka", "cassandra", "spark", "executor")
    )
    values: dict[str, Any] = {}
    if "home" in doc:
        values["home"] = Path(str(doc["home"])).expanduser()
    _take(values, "kafka_bootstrap", kafka, "bootstrap", str)
    _take(values, "kafka_controller_port", kafka, "controller_port", int)
    _take(values, "kafka_watermark_topic", kafka, "watermark_topic", str)
    _take(values, "kafka_replication", kafka, "replication", int)
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
    _take(values, "cassandra_replication", cassandra, "replication", int)
    _take(values, "cassandra_username", cassandra, "username", str)
    _take(values, "cassandra_password", cassandra, "password", str)
    _take(values, "cassandra_tls", cassandra, "tls", bool)
    _take(values, "cassandra_ca_file", cassandra, "ca_file", str)
    _take(values, "spark_master", spark, "master", str)
    _take(values, "spark_shuffle_partitions", spark, "shuffle_partitions", int)
    _take(values, "spark_ui", spark, "ui", bool)
    if "packages" in spark:
        values["spark_packages"] = tuple(str(p) for p in spark["packages"])
    if "conf" in spark:
        values["spark_conf"] = {str(k): str(v) for k, v in dict(spark["conf"]).items()}
    _take(values, "executor_cache_bytes", executor, "cache_bytes", int)
    _take(values, "executor_interval_threads", executor, "interval_threads", int)
    return _typed_security(values)


def _typed_security(values: dict[str, Any]) -> dict[str, Any]:
    """Passwords as :class:`Secret`, CA files as expanded paths."""
    for key in ("kafka_password", "cassandra_password"):
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
    values: dict[str, Any], key: str, table: Mapping[str, Any], name: str, kind: type
) -> None:
    if name in table:
        if not isinstance(table[name], kind):
            # Never echo a password, even a mistyped one.
            shown = "a value" if name == "password" else repr(table[name])
            raise ConfigError(f"setting {name!r} must be a {kind.__name__}, got {shown}")
        values[key] = table[name]


def _from_env(env: Mapping[str, str]) -> dict[str, Any]:
    converters: dict[str, tuple[str, Any]] = {
        "MILLSTREAM_HOME": ("home", lambda v: Path(v).expanduser()),
        "MILLSTREAM_KAFKA_BOOTSTRAP": ("kafka_bootstrap", str),
        "MILLSTREAM_KAFKA_CONTROLLER_PORT": ("kafka_controller_port", int),
        "MILLSTREAM_KAFKA_WATERMARK_TOPIC": ("kafka_watermark_topic", str),
        "MILLSTREAM_KAFKA_REPLICATION": ("kafka_replication", int),
        "MILLSTREAM_CASSANDRA_HOSTS": ("cassandra_hosts", _split),
        "MILLSTREAM_CASSANDRA_PORT": ("cassandra_port", int),
        "MILLSTREAM_CASSANDRA_STORAGE_PORT": ("cassandra_storage_port", int),
        "MILLSTREAM_CASSANDRA_REPLICATION": ("cassandra_replication", int),
        "MILLSTREAM_SPARK_MASTER": ("spark_master", str),
        "MILLSTREAM_SPARK_SHUFFLE_PARTITIONS": ("spark_shuffle_partitions", int),
        "MILLSTREAM_SPARK_UI": ("spark_ui", _boolean),
        "MILLSTREAM_SPARK_PACKAGES": ("spark_packages", _split),
        "MILLSTREAM_EXECUTOR_CACHE_BYTES": ("executor_cache_bytes", int),
        "MILLSTREAM_EXECUTOR_INTERVAL_THREADS": ("executor_interval_threads", int),
        "MILLSTREAM_KAFKA_SECURITY_PROTOCOL": ("kafka_security_protocol", str),
        "MILLSTREAM_KAFKA_SASL_MECHANISM": ("kafka_sasl_mechanism", str),
        "MILLSTREAM_KAFKA_USERNAME": ("kafka_username", str),
        "MILLSTREAM_KAFKA_PASSWORD": ("kafka_password", str),
        "MILLSTREAM_KAFKA_CA_FILE": ("kafka_ca_file", str),
        "MILLSTREAM_CASSANDRA_USERNAME": ("cassandra_username", str),
        "MILLSTREAM_CASSANDRA_PASSWORD": ("cassandra_password", str),
        "MILLSTREAM_CASSANDRA_TLS": ("cassandra_tls", _boolean),
        "MILLSTREAM_CASSANDRA_CA_FILE": ("cassandra_ca_file", str),
    }
    values: dict[str, Any] = {}
    for variable, (key, convert) in converters.items():
        raw = env.get(variable)
        if raw is None or raw == "":
            continue
        try:
            values[key] = convert(raw)
        except ValueError as exc:
            raise ConfigError(f"{variable}={raw!r} is not valid: {exc}") from exc
    return _typed_security(values)


def _split(raw: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in raw.split(",") if part.strip())


def _boolean(raw: str) -> bool:
    lowered = raw.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise ValueError("expected true or false")
