"""What the secured local stack (``millstream up --secure``) authenticates and encrypts with.

Generated once, on its first start, under ``<home>/secure/`` (the directory mode 0700, every
file 0600 but the CA certificate, which clients need):

- ``ca.pem`` / ``ca.key``: a local certificate authority, valid for ten years;
- ``server.pem``: the nodes' private key (PKCS#8, unencrypted) followed by their certificate,
  signed by the CA, for :data:`SECURE_HOST` (as an IP subject alternative name, which TLS
  clients check the address they connect to against); Kafka and Cassandra both read it as a
  PEM keystore;
- ``kafka.password`` and ``cassandra.password``: the passwords of user ``millstream`` (a
  Kafka SCRAM-SHA-512 user, a Cassandra login role).

:func:`secure_client_config` points a config at the secured stack with these credentials.
"""

from __future__ import annotations

import datetime
import fcntl
import ipaddress
import os
import secrets
from dataclasses import dataclass, replace
from pathlib import Path

from millstream.engine.config import MillstreamConfig, Secret

__all__ = [
    "SECURE_HOST",
    "SECURE_USER",
    "SecureMaterial",
    "secure_client_config",
    "secure_dir",
]

# A loopback alias of its own: beside the single node (127.0.0.1) and the replicated stack
# (127.0.0.2-4), on the same port numbers.
SECURE_HOST = "127.0.0.5"
# The user millstream's clients log in as, to Kafka (SCRAM) and Cassandra (a role).
SECURE_USER = "millstream"
_CERTIFICATE_DAYS = 3650


def secure_dir(home: Path) -> Path:
    return home / "secure"


@dataclass(frozen=True)
class SecureMaterial:
    """The files of :mod:`this module's <millstream.devtools.local.security>` docstring."""

    directory: Path

    @property
    def ca_file(self) -> Path:
        return self.directory / "ca.pem"

    @property
    def ca_key(self) -> Path:
        return self.directory / "ca.key"

    @property
    def server_pem(self) -> Path:
        """The server's private key and certificate, one PEM file."""
        return self.directory / "server.pem"

    def password_file(self, service: str) -> Path:
        """``kafka.password`` or ``cassandra.password``."""
        return self.directory / f"{service}.password"

    def password(self, service: str) -> Secret:
        return Secret(self.password_file(service).read_text(encoding="utf-8").strip())

    def ensure(self, host: str = SECURE_HOST) -> None:
        """Create whatever is missing; existing files are kept (the services' data was set
        up with them). Safe to call from several threads and processes at once."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self.directory.chmod(0o700)
        with (self.directory / ".lock").open("a") as lock:
            # Kafka's and Cassandra's nodes are prepared in parallel: one of them generates.
            fcntl.flock(lock, fcntl.LOCK_EX)
            self._create_missing(host)

    def _create_missing(self, host: str) -> None:
        if not (self.ca_file.is_file() and self.ca_key.is_file()):
            key, certificate = _new_ca()
            _write_private(self.ca_key, key)
            _write_public(self.ca_file, certificate)
        if not self.server_pem.is_file():
            _write_private(self.server_pem, _new_server_pem(self.ca_file, self.ca_key, host))
        for service in ("kafka", "cassandra"):
            if not self.password_file(service).is_file():
                # Hex: safe inside Kafka's --add-scram syntax, JAAS quotes and CQL literals.
                _write_private(self.password_file(service), secrets.token_hex(24).encode())


def secure_client_config(config: MillstreamConfig, host: str = SECURE_HOST) -> MillstreamConfig:
    """``config`` pointed at the secured stack on ``host``: Kafka over SASL_SSL with SCRAM-
    SHA-512, Cassandra with a password and TLS, both verified against the local CA."""
    material = SecureMaterial(secure_dir(config.home))
    return replace(
        config,
        kafka_bootstrap=f"{host}:{config.kafka_port}",
        kafka_security_protocol="SASL_SSL",
        kafka_sasl_mechanism="SCRAM-SHA-512",
        kafka_username=SECURE_USER,
        kafka_password=material.password("kafka"),
        kafka_ca_file=material.ca_file,
        cassandra_hosts=(host,),
        cassandra_username=SECURE_USER,
        cassandra_password=material.password("cassandra"),
        cassandra_tls=True,
        cassandra_ca_file=material.ca_file,
        kafka_replication=1,
        cassandra_replication=1,
    )


def _new_ca() -> tuple[bytes, bytes]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "millstream local CA")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=_CERTIFICATE_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return (
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
        certificate.public_bytes(serialization.Encoding.PEM),
    )


def _new_server_pem(ca_file: Path, ca_key_file: Path, host: str) -> bytes:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ca = x509.load_pem_x509_certificate(ca_file.read_bytes())
    ca_key = serialization.load_pem_private_key(ca_key_file.read_bytes(), password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{ca_key_file} is not the EC key millstream generated")
    # RSA would do as well; EC P-256 keys are made in a millisecond and every TLS 1.2/1.3
    # client and both JVM services accept them.
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=_CERTIFICATE_DAYS))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(host))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    # The broker talks to itself over this listener too, so its certificate is also a
    # client's (CLIENT_AUTH), should mutual TLS ever be switched on.
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ) + certificate.public_bytes(serialization.Encoding.PEM)


def _write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` with mode 0600 from the first byte on, atomically."""
    partial = path.with_name(f"{path.name}.{secrets.token_hex(4)}.partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    partial.replace(path)


def _write_public(path: Path, data: bytes) -> None:
    partial = path.with_name(f"{path.name}.{secrets.token_hex(4)}.partial")
    partial.write_bytes(data)
    partial.chmod(0o644)
    partial.replace(path)
