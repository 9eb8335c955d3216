"""Secured services: Kafka over SASL_SSL (SCRAM-SHA-512) and Cassandra with a password and
TLS, configured like the addresses, for the driver, the executors and the tools; passwords
never shown.

The unit tests check the settings (parsing, validation, what each client gets) and the
secured nodes' generated configuration. The integration tests share the secured local stack
on 127.0.0.5 (`millstream up --secure`), started by the module fixture unless it already
runs and stopped again if the fixture started it; they never touch the plain or the
replicated stack.
"""

from __future__ import annotations

import io
import json
import logging
import stat
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from millstream import cli
from millstream.connectors import cassandra as cassandra_connector
from millstream.connectors import kafka as kafka_connector
from millstream.connectors.maven import MavenArtifacts
from millstream.connectors.stream_reader import read_messages
from millstream.devtools.local.cassandra import CassandraService
from millstream.devtools.local.java import JavaRuntime
from millstream.devtools.local.kafka import KafkaService
from millstream.devtools.local.security import SECURE_HOST, SecureMaterial
from millstream.devtools.local.service import Node
from millstream.devtools.local.stack import LocalStack
from millstream.engine.codecs import JsonCodec
from millstream.engine.computation import Computation
from millstream.engine.config import MillstreamConfig, Secret, load_config
from millstream.engine.context import Context
from millstream.engine.errors import ConfigError
from millstream.engine.records import Record, decode_record, encode_record, injector_record_id
from millstream.engine.timers import Timer
from millstream.engine.topology import ComputationOptions, Topology
from millstream.engine.watermarks import injector_source
from millstream.spark.runner import AvailableNow, run_topology
from millstream.spark.session import kafka_options
from tests.devtools.local.test_cassandra_config import top_level_settings
from tests.jvm_options import for_short_lived_services
from tests.watermark_topics import delete_watermark_topics

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

JAVA = JavaRuntime(Path("/usr/bin/java"), 17)
PASSWORD = "s3cret-Pa55word"  # for the unit tests: what must never be shown


def _progress(message: str) -> None:
    print(f"[secure {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


# -- settings (unit) ---------------------------------------------------------------------------


def _ca(tmp_path: Path) -> Path:
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    return ca


@pytest.mark.unit
def test_security_settings_come_from_toml_and_variables(tmp_path: Path) -> None:
    ca = _ca(tmp_path)
    file = tmp_path / "millstream.toml"
    file.write_text(
        "[kafka]\n"
        'security_protocol = "SASL_SSL"\n'
        'username = "alice"\n'
        f'password = "{PASSWORD}"\n'
        f'ca_file = "{ca}"\n'
        "[cassandra]\n"
        'username = "bob"\n'
        "tls = true\n"
        f'ca_file = "{ca}"\n'
    )
    config = load_config({"MILLSTREAM_CASSANDRA_PASSWORD": "other-" + PASSWORD}, file)
    assert config.kafka_security_protocol == "SASL_SSL"
    assert config.kafka_sasl_mechanism == "SCRAM-SHA-512"  # the default
    assert config.kafka_username == "alice"
    assert config.kafka_password == Secret(PASSWORD)
    assert config.kafka_ca_file == ca
    assert (config.cassandra_username, config.cassandra_tls) == ("bob", True)
    assert config.cassandra_password is not None
    assert config.cassandra_password.reveal() == "other-" + PASSWORD
    variables = load_config(
        {
            "MILLSTREAM_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
            "MILLSTREAM_KAFKA_SASL_MECHANISM": "SCRAM-SHA-256",
            "MILLSTREAM_KAFKA_USERNAME": "carol",
            "MILLSTREAM_KAFKA_PASSWORD": PASSWORD,
            "MILLSTREAM_CASSANDRA_TLS": "false",
            "MILLSTREAM_CASSANDRA_PASSWORD": PASSWORD,
        },
        file,
    )
    assert (variables.kafka_security_protocol, variables.kafka_sasl_mechanism) == (
        "SASL_PLAINTEXT",
        "SCRAM-SHA-256",
    )
    assert (variables.kafka_username, variables.cassandra_tls) == ("carol", False)
    # Plain by default.
    default = MillstreamConfig()
    assert (default.kafka_security_protocol, default.kafka_sasl, default.kafka_tls) == (
        "PLAINTEXT",
        False,
        False,
    )
    assert (default.cassandra_username, default.cassandra_tls) == (None, False)


@pytest.mark.unit
def test_passwords_never_show_in_a_config() -> None:
    config = MillstreamConfig(
        kafka_security_protocol="SASL_SSL",
        kafka_username="alice",
        kafka_password=Secret(PASSWORD),
        cassandra_username="bob",
        cassandra_password=Secret(PASSWORD),
    )
    for shown in (repr(config), str(config), f"{config}", repr(config.kafka_password)):
        assert PASSWORD not in shown
    assert "kafka_password='***'" in repr(config)
    assert str(Secret(PASSWORD)) == "***"


@pytest.mark.unit
@pytest.mark.parametrize(
    ("environ", "named"),
    [
        (
            {"MILLSTREAM_KAFKA_SECURITY_PROTOCOL": "SASL_SSL"},
            "[kafka] username/password (MILLSTREAM_KAFKA_USERNAME, MILLSTREAM_KAFKA_PASSWORD)",
        ),
        (
            {"MILLSTREAM_KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "MILLSTREAM_KAFKA_USERNAME": "a"},
            "but the password is not set",
        ),
        (
            {"MILLSTREAM_KAFKA_SECURITY_PROTOCOL": "KERBEROS"},
            "[kafka] security_protocol (MILLSTREAM_KAFKA_SECURITY_PROTOCOL)",
        ),
        (
            {"MILLSTREAM_KAFKA_SECURITY_PROTOCOL": "SSL", "MILLSTREAM_KAFKA_CA_FILE": "/no/ca.pem"},
            "[kafka] ca_file (MILLSTREAM_KAFKA_CA_FILE) names /no/ca.pem, which does not exist",
        ),
        (
            {"MILLSTREAM_CASSANDRA_USERNAME": "bob"},
            "[cassandra] password (MILLSTREAM_CASSANDRA_PASSWORD)",
        ),
        (
            {"MILLSTREAM_CASSANDRA_TLS": "true", "MILLSTREAM_CASSANDRA_CA_FILE": "/no/ca.pem"},
            "[cassandra] ca_file (MILLSTREAM_CASSANDRA_CA_FILE) names /no/ca.pem",
        ),
    ],
)
def test_incomplete_security_settings_name_the_setting_to_fix(
    environ: dict[str, str], named: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config({**environ, "MILLSTREAM_CASSANDRA_HOSTS": "db"}, Path("/dev/null"))
    assert named in str(caught.value)


@pytest.mark.unit
def test_a_mistyped_toml_password_is_not_echoed(tmp_path: Path) -> None:
    file = tmp_path / "millstream.toml"
    file.write_text("[kafka]\npassword = 123456789\n")
    with pytest.raises(ConfigError) as caught:
        load_config({}, file)
    assert "123456789" not in str(caught.value)


@pytest.mark.unit
def test_every_kafka_client_gets_the_security_settings(tmp_path: Path) -> None:
    ca = _ca(tmp_path)
    config = MillstreamConfig(
        kafka_bootstrap="b1:9092,b2:9092",
        kafka_security_protocol="SASL_SSL",
        kafka_username="alice",
        kafka_password=Secret(PASSWORD),
        kafka_ca_file=ca,
    )
    native = kafka_connector.client_settings(config)
    assert {k: v for k, v in native.items() if k not in ("error_cb", "logger")} == {
        "bootstrap.servers": "b1:9092,b2:9092",
        "security.protocol": "sasl_ssl",
        "sasl.mechanisms": "SCRAM-SHA-512",
        "sasl.username": "alice",
        "sasl.password": PASSWORD,
        "ssl.ca.location": str(ca),
    }
    assert kafka_options(config) == {
        "kafka.bootstrap.servers": "b1:9092,b2:9092",
        "kafka.security.protocol": "SASL_SSL",
        "kafka.sasl.mechanism": "SCRAM-SHA-512",
        "kafka.sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule "
        f'required username="alice" password="{PASSWORD}";',
        "kafka.ssl.truststore.type": "PEM",
        "kafka.ssl.truststore.location": str(ca),
    }
    # A plain config adds nothing a PLAINTEXT cluster would refuse.
    plain = kafka_connector.client_settings(MillstreamConfig())
    assert {k: v for k, v in plain.items() if k not in ("error_cb", "logger")} == {
        "bootstrap.servers": "127.0.0.1:9092",
        "security.protocol": "plaintext",
    }
    assert kafka_options(MillstreamConfig()) == {
        "kafka.bootstrap.servers": "127.0.0.1:9092",
        "kafka.security.protocol": "PLAINTEXT",
    }


# -- the secured nodes' configuration (unit) ---------------------------------------------------


def _secure_node(backend: type[Any], home: Path) -> Any:
    config = MillstreamConfig(home=home)
    artifacts = MavenArtifacts(home / "artifacts", lambda _: None)
    node = Node((SECURE_HOST,), 1, secure=True)
    service = backend(config, JAVA, artifacts, lambda _: None, node)
    service.security.ensure(SECURE_HOST)
    return service


@pytest.mark.unit
def test_secure_material_is_private_and_certifies_the_secure_address(tmp_path: Path) -> None:
    from cryptography import x509

    material = SecureMaterial(tmp_path / "secure")
    material.ensure(SECURE_HOST)
    assert stat.S_IMODE((tmp_path / "secure").stat().st_mode) == 0o700
    for private in (
        material.ca_key,
        material.server_pem,
        material.password_file("kafka"),
        material.password_file("cassandra"),
    ):
        assert stat.S_IMODE(private.stat().st_mode) == 0o600, private
    certificate = x509.load_pem_x509_certificate(material.server_pem.read_bytes())
    names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == [SECURE_HOST]
    ca = x509.load_pem_x509_certificate(material.ca_file.read_bytes())
    certificate.verify_directly_issued_by(ca)
    before = (material.ca_file.read_bytes(), material.password("kafka"))
    material.ensure(SECURE_HOST)  # kept: the services' data was set up with them
    assert (material.ca_file.read_bytes(), material.password("kafka")) == before


@pytest.mark.unit
def test_secure_kafka_node_takes_scram_over_tls_on_its_own_address(tmp_path: Path) -> None:
    service: KafkaService = _secure_node(KafkaService, tmp_path)
    properties = dict(line.split("=", 1) for line in service.server_properties().splitlines())
    assert service.root == tmp_path / "secure" / "kafka"
    assert service.address() == f"{SECURE_HOST}:9092"
    assert (
        properties["listeners"] == f"SASL_SSL://{SECURE_HOST}:9092,CONTROLLER://{SECURE_HOST}:9093"
    )
    assert properties["advertised.listeners"] == f"SASL_SSL://{SECURE_HOST}:9092"
    assert properties["listener.security.protocol.map"] == "CONTROLLER:PLAINTEXT,SASL_SSL:SASL_SSL"
    assert properties["sasl.enabled.mechanisms"] == "SCRAM-SHA-512"
    assert properties["ssl.keystore.type"] == "PEM"
    assert properties["ssl.keystore.location"] == str(service.security.server_pem)
    assert properties["ssl.truststore.location"] == str(service.security.ca_file)
    password = service.security.password("kafka").reveal()
    assert (
        f'username="millstream" password="{password}"'
        in (properties["listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config"])
    )
    assert service._scram_users() == [
        "--add-scram",
        f"SCRAM-SHA-512=[name=millstream,password={password}]",
    ]


@pytest.mark.unit
def test_secure_cassandra_node_wants_passwords_and_tls(tmp_path: Path) -> None:
    service: CassandraService = _secure_node(CassandraService, tmp_path)
    settings = top_level_settings(service.cassandra_yaml())
    assert service.root == tmp_path / "secure" / "cassandra"
    assert settings["listen_address"] == settings["rpc_address"] == SECURE_HOST
    assert settings["cluster_name"] == "millstream-local-secure"
    assert settings["authenticator"] == "PasswordAuthenticator"
    encryption = settings["client_encryption_options"]
    assert encryption["enabled"] is True
    assert encryption["optional"] is False
    assert encryption["keystore"] == str(service.security.server_pem)
    assert encryption["ssl_context_factory"]["class_name"].endswith("PEMBasedSslContextFactory")


@pytest.mark.unit
def test_up_secure_prints_password_references_not_passwords(tmp_path: Path) -> None:
    stack = LocalStack(MillstreamConfig(home=tmp_path), lambda _: None, secure=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("millstream.devtools.local.stack.find_java", lambda: JAVA)
        stack.services[0].security.ensure(SECURE_HOST)
        exports = "\n".join(stack.client_exports())
        environment = stack.client_environment()
    material = stack.services[0].security
    for service in ("kafka", "cassandra"):
        assert material.password(service).reveal() not in exports
        variable = f"MILLSTREAM_{service.upper()}_PASSWORD"
        assert f'export {variable}="$(cat {material.password_file(service)})"' in exports
        assert environment[variable] == material.password(service).reveal()
    assert f"export MILLSTREAM_KAFKA_BOOTSTRAP={SECURE_HOST}:9092" in exports
    assert "export MILLSTREAM_KAFKA_SECURITY_PROTOCOL=SASL_SSL" in exports


# -- the secured stack (integration) -----------------------------------------------------------


@pytest.fixture(scope="module")
def secure_stack(
    start_stack: Callable[[LocalStack, Callable[[str], None]], AbstractContextManager[None]],
) -> Iterator[LocalStack]:
    """The secured stack, started unless it runs; what this fixture started is stopped."""
    stack = LocalStack(for_short_lived_services(load_config()), _progress, secure=True)
    with start_stack(stack, _progress):
        yield stack


@pytest.fixture(scope="module")
def client(secure_stack: LocalStack) -> Iterator[MillstreamConfig]:
    """The secured stack's client config, with a watermark topic of this module's own."""
    config = replace(secure_stack.client_config(), kafka_watermark_topic=_unique("watermarks"))
    yield config
    delete_watermark_topics(config)


@pytest.fixture
def tool_environment(
    secure_stack: LocalStack, client: MillstreamConfig, monkeypatch: pytest.MonkeyPatch
) -> dict[str, str]:
    """The ``MILLSTREAM_*`` variables `up --secure` tells users to export, set."""
    variables = {
        **secure_stack.client_environment(),
        "MILLSTREAM_KAFKA_WATERMARK_TOPIC": client.kafka_watermark_topic,
    }
    monkeypatch.delenv("MILLSTREAM_CONFIG", raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    return variables


def _passwords(client: MillstreamConfig) -> list[str]:
    assert client.kafka_password is not None
    assert client.cassandra_password is not None
    return [client.kafka_password.reveal(), client.cassandra_password.reveal()]


JSON = JsonCodec()
WINDOW = 1_000_000
BASE = (1_700_000_000_000_000 // WINDOW) * WINDOW


class WindowCounts(Computation):
    """Counts a key's records per one-second event-time window; once the input low
    watermark passes a window's end (an event-time timer), produces the count and forgets
    the window."""

    def __init__(self, output: str) -> None:
        self.output = output

    def process_record(self, ctx: Context, record: Record) -> None:
        window = (record.timestamp - BASE) // WINDOW
        counts = ctx.state(JSON)
        current: dict[str, int] = counts.get({})
        current[str(window)] = current.get(str(window), 0) + 1
        counts.set(current)
        ctx.set_timer(f"w{window}", BASE + (window + 1) * WINDOW - 1)

    def process_timer(self, ctx: Context, timer: Timer) -> None:
        window = timer.tag.removeprefix("w")
        counts = ctx.state(JSON)
        current: dict[str, int] = counts.get({})
        count = current.pop(window, 0)
        counts.set(current)
        value = {"key": ctx.key, "window": int(window), "count": count}
        ctx.produce(self.output, json.dumps(value).encode(), timer.timestamp)


def _read_all(config: MillstreamConfig, topic: str) -> list[Record]:
    """Every committed record of ``topic``, to its end now (through the secured listener)."""
    return [decode_record(m.value) for m in read_messages(config, topic) if m.value is not None]


class _DriverLog:
    """Everything the driver JVM logs (log4j2, INFO and up) while in use, into a file."""

    def __init__(self, spark: SparkSession, path: Path) -> None:
        jvm: Any = spark.sparkContext._jvm
        self._spark = spark
        self._jvm = jvm
        self.path = path
        layout = jvm.org.apache.logging.log4j.core.layout.PatternLayout.createDefaultLayout()
        builder = jvm.org.apache.logging.log4j.core.appender.FileAppender.newBuilder()
        self._appender = (
            builder.withFileName(str(path)).setName("millstream-secure-test").setLayout(layout)
        ).build()
        self._context = jvm.org.apache.logging.log4j.LogManager.getContext(False)

    def __enter__(self) -> _DriverLog:
        self._appender.start()
        configuration = self._context.getConfiguration()
        configuration.addAppender(self._appender)
        level = self._jvm.org.apache.logging.log4j.Level
        configuration.getRootLogger().addAppender(self._appender, level.ALL, None)
        self._spark.sparkContext.setLogLevel("INFO")
        return self

    def __exit__(self, *_: object) -> None:
        self._spark.sparkContext.setLogLevel("WARN")
        configuration = self._context.getConfiguration()
        configuration.getRootLogger().removeAppender("millstream-secure-test")
        self._context.updateLoggers()
        self._appender.stop()

    def text(self) -> str:
        return self.path.read_text(errors="replace")


@pytest.mark.integration
def test_a_topology_runs_on_spark_against_the_secured_services(
    client: MillstreamConfig,
    spark: SparkSession,
    tool_environment: dict[str, str],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    suffix = uuid.uuid4().hex[:8]
    events, counts = f"events_{suffix}", f"counts_{suffix}"
    keyspace = f"secure_{suffix}"
    topology = Topology(f"secure_{suffix}", streams=[events])
    topology.add_computation(
        "window_counts",
        WindowCounts(counts),
        inputs={events: lambda record: record.key},
        outputs=[counts],
        options=ComputationOptions(key_intervals=2),
    )
    # Windows 0 and 1 of keys a-c (every fifth record sent twice); the injector then
    # promises nothing older than window 1's start: window 0 is complete, window 1 not.
    records = [
        Record(
            "abc"[n % 3],
            b"x",
            BASE + (n % 2) * WINDOW + n,
            injector_record_id(f"secure-{suffix}", 0, n),
        )
        for n in range(30)
    ]
    kafka_connector.create_topics(client, [events], partitions=2)
    sender = kafka_connector.producer(client)
    for record in records + records[::5]:
        sender.produce(events, key=record.key.encode(), value=encode_record(record))
    assert sender.flush(30) == 0
    publisher = kafka_connector.KafkaWatermarkTopic(client)
    offsets = kafka_connector.consumer(client, "test-secure-offsets")
    source = injector_source(f"secure-{suffix}")
    publisher.report_streams(offsets, source, [events], BASE + WINDOW, 1)

    caplog.set_level(logging.DEBUG, logger="millstream")
    with _DriverLog(spark, tmp_path / "driver.log") as driver_log:
        settings = replace(client.run, keyspace=keyspace, checkpoint_root=tmp_path / "checkpoints")
        running = run_topology(topology, client, settings, trigger=AvailableNow(), spark=spark)
        try:
            running.process_available(timeout=240)
            assert running.input_watermark("window_counts") == BASE + WINDOW
        finally:
            running.stop()
    try:
        produced = [
            json.loads(r.value)
            for r in {r.record_id: r for r in _read_all(client, counts)}.values()
        ]
        assert sorted((v["key"], v["window"], v["count"]) for v in produced) == [
            ("a", 0, 5),
            ("b", 0, 5),
            ("c", 0, 5),
        ]
        # Window 1 waits in the store, read over TLS with the millstream role.
        handle, session = cassandra_connector.connect(client, keyspace)
        try:
            rows = session.execute(
                "SELECT key, value FROM intervals WHERE computation = %s AND interval IN (0, 1) "
                "AND kind = 'state'",
                ("window_counts",),
            )
            state = {row.key: JSON.decode(row.value) for row in rows}
        finally:
            handle.shutdown()
        assert state == {"a": {"1": 5}, "b": {"1": 5}, "c": {"1": 5}}
        # `millstream state` shows the same through the variables.
        capfd.readouterr()
        code = cli.main(
            ["state", "window_counts", "b", "--keyspace", keyspace, "--intervals", "2", "--json"]
        )
        shown = capfd.readouterr()
        assert code == 0, shown.err
        assert '"1": 5' in shown.out or '"1":5' in shown.out.replace(" ", ""), shown.out

        # The Spark source got the JAAS config with the password; the driver never logs it.
        logged = driver_log.text()
        # Kafka's Java clients log their settings at INFO, the JAAS config hidden.
        assert "sasl.jaas.config = [hidden]" in logged
        for password in _passwords(client):
            assert password not in logged
            assert password not in caplog.text
            assert password not in shown.out + shown.err
    finally:
        offsets.close()
        publisher.retire(source)
        publisher.close()
        kafka_connector.delete_topics(client, [events, counts])
        handle, session = cassandra_connector.connect(client)
        try:
            cassandra_connector.drop_keyspace(session, keyspace)
        finally:
            handle.shutdown()


def _stdin(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode())))


@pytest.mark.integration
def test_produce_and_tail_work_against_the_secured_kafka(
    client: MillstreamConfig,
    tool_environment: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    stream = _unique("tools")
    lines = [
        json.dumps({"key": f"k{n}", "value": f"v{n}", "timestamp": BASE + n}) for n in range(3)
    ]
    _stdin(monkeypatch, "\n".join(lines) + "\n")
    try:
        assert cli.main(["produce", stream, "--partitions", "1"]) == 0
        capsys.readouterr()
        assert cli.main(["tail", stream, "--from-beginning", "--max", "3"]) == 0
        out = capsys.readouterr()
        tailed = [json.loads(line) for line in out.out.splitlines()]
        assert [(r["key"], r["value"]) for r in tailed] == [(f"k{n}", f"v{n}") for n in range(3)]
        for password in _passwords(client):
            assert password not in out.out + out.err
    finally:
        kafka_connector.delete_topics(client, [stream])


@pytest.mark.integration
def test_a_wrong_kafka_password_is_a_clear_config_error(
    client: MillstreamConfig,
    tool_environment: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    wrong = "wrong-" + uuid.uuid4().hex
    refused = replace(client, kafka_password=Secret(wrong))
    started = time.monotonic()
    with pytest.raises(ConfigError) as caught:
        kafka_connector.create_topics(refused, [_unique("refused")])
    assert time.monotonic() - started < 15  # at once, not after the operation's timeout
    message = str(caught.value)
    assert "refused the credentials" in message
    assert "[kafka] username/password (MILLSTREAM_KAFKA_USERNAME, MILLSTREAM_KAFKA_PASSWORD)" in (
        message
    )
    # The tool prints it cleanly.
    monkeypatch.setenv("MILLSTREAM_KAFKA_PASSWORD", wrong)
    _stdin(monkeypatch, json.dumps({"key": "k", "value": "v", "timestamp": BASE}) + "\n")
    capsys.readouterr()
    assert cli.main(["produce", _unique("refused")]) == 2
    err = capsys.readouterr().err
    assert "millstream produce: error: Kafka at" in err
    assert "MILLSTREAM_KAFKA_PASSWORD" in err
    assert "Traceback" not in err
    for secret in (wrong, *_passwords(client)):
        assert secret not in message
        assert secret not in err
        assert secret not in repr(refused)


@pytest.mark.integration
def test_missing_cassandra_credentials_are_a_clear_config_error(
    client: MillstreamConfig,
    tool_environment: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A username without its password: the config names the variable.
    monkeypatch.delenv("MILLSTREAM_CASSANDRA_PASSWORD")
    capsys.readouterr()
    assert cli.main(["state", "any", "key", "--intervals", "2"]) == 2
    err = capsys.readouterr().err
    assert "[cassandra] password (MILLSTREAM_CASSANDRA_PASSWORD)" in err
    # No credentials at all: the node asks for them, and the error says which to set.
    anonymous = replace(client, cassandra_username=None, cassandra_password=None)
    with pytest.raises(ConfigError) as caught:
        cassandra_connector.connect(anonymous)
    assert "requires credentials" in str(caught.value)
    assert "MILLSTREAM_CASSANDRA_USERNAME, MILLSTREAM_CASSANDRA_PASSWORD" in str(caught.value)
    # A wrong password: refused, named, not shown.
    wrong = "wrong-" + uuid.uuid4().hex
    with pytest.raises(ConfigError) as refused:
        cassandra_connector.connect(replace(client, cassandra_password=Secret(wrong)))
    assert "refused the credentials of user 'millstream'" in str(refused.value)
    for secret in (wrong, *_passwords(client)):
        assert secret not in str(caught.value) + str(refused.value) + err


@pytest.mark.integration
def test_a_certificate_from_another_ca_names_ca_file(
    client: MillstreamConfig, tmp_path: Path
) -> None:
    other = SecureMaterial(tmp_path / "other")
    other.ensure(SECURE_HOST)
    with pytest.raises(ConfigError) as cassandra_error:
        cassandra_connector.connect(replace(client, cassandra_ca_file=other.ca_file))
    assert "[cassandra] ca_file (MILLSTREAM_CASSANDRA_CA_FILE)" in str(cassandra_error.value)
    with pytest.raises(ConfigError) as kafka_error:
        kafka_connector.create_topics(
            replace(client, kafka_ca_file=other.ca_file), [_unique("untrusted")]
        )
    assert "[kafka] ca_file (MILLSTREAM_KAFKA_CA_FILE)" in str(kafka_error.value)
