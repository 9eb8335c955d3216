"""A hanging Kafka transaction, made on purpose: to test what must survive one.

What a broker crash can leave behind (:mod:`millstream.connectors.kafka.hanging`): records of a
transaction on a partition that no transaction coordinator counts, so no marker ever ends it.
:func:`write_hanging_transaction` writes one: a transactional record batch of a producer ID no
coordinator issued, sent in a bare Produce request while the brokers' transaction
verification (KIP-890, which would refuse it) is switched off, and switched back on at once.
Kafka's clients cannot do that, so the request is encoded here. A local, plaintext stack only.
"""

from __future__ import annotations

import random
import socket
import struct
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)

from millstream.connectors.kafka.topics import admin_client
from millstream.devtools.local.wire import read_exactly
from millstream.engine.config import MillstreamConfig

__all__ = ["write_hanging_transaction"]

_VERIFICATION: Final = "transaction.partition.verification.enable"
_TRANSACTIONAL: Final = 0x10  # the record batch attribute
_PRODUCE: Final = 0  # API key; version 3 is the first with a transactional ID
_TIMEOUT: Final = 30.0


def write_hanging_transaction(
    config: MillstreamConfig,
    topic: str,
    partition: int,
    *,
    age: float = 600.0,
    key: bytes = b"hanging",
    value: bytes = b"a transaction no coordinator knows",
) -> tuple[int, int]:
    """Leave a transaction open on ``topic``-``partition`` that nothing will end: one record
    whose timestamp is ``age`` seconds old. Returns its producer ID and offset."""
    if config.kafka_security_protocol != "PLAINTEXT":
        raise ValueError("a hanging transaction is made on a plaintext local stack only")
    admin = admin_client(config)
    metadata = admin.list_topics(topic, timeout=_TIMEOUT)
    leader_id = metadata.topics[topic].partitions[partition].leader
    leader = metadata.brokers[leader_id]
    # Above any producer ID a broker hands out (they count up from 0).
    producer_id = (1 << 40) + random.randrange(1 << 20)
    stamp = int((time.time() - age) * 1000)
    batch = _record_batch(producer_id, key, value, stamp)
    with _verification_off(admin, sorted(metadata.brokers)):
        offset = _produce(str(leader.host), int(leader.port), topic, partition, batch)
    return producer_id, offset


@contextmanager
def _verification_off(admin: AdminClient, brokers: list[int]) -> Iterator[None]:
    def alter(operation: AlterConfigOpType, value: str) -> None:
        entry = ConfigEntry(_VERIFICATION, value, incremental_operation=operation)
        resources = [
            ConfigResource(ResourceType.BROKER, str(b), incremental_configs=[entry])
            for b in brokers
        ]
        for future in admin.incremental_alter_configs(resources).values():
            future.result()

    alter(AlterConfigOpType.SET, "false")
    try:
        # The brokers apply a dynamic setting as they read it from the metadata log.
        time.sleep(1.0)
        yield
    finally:
        alter(AlterConfigOpType.DELETE, "")


def _record_batch(producer_id: int, key: bytes, value: bytes, stamp: int) -> bytes:
    """One record in a v2 record batch of ``producer_id``, epoch 0, sequence 0."""
    record = (
        b"\x00"  # attributes
        + _varint(0)  # timestamp delta
        + _varint(0)  # offset delta
        + _varint(len(key))
        + key
        + _varint(len(value))
        + value
        + _varint(0)  # headers
    )
    record = _varint(len(record)) + record
    # From the attributes on: what the CRC covers.
    covered = (
        struct.pack(">hiqqqhii", _TRANSACTIONAL, 0, stamp, stamp, producer_id, 0, 0, 1) + record
    )
    after_length = struct.pack(">ibI", -1, 2, _crc32c(covered)) + covered
    return struct.pack(">qi", 0, len(after_length)) + after_length


def _produce(host: str, port: int, topic: str, partition: int, batch: bytes) -> int:
    body = (
        _string("millstream-hanging-transaction")  # the transactional ID (any, not checked)
        + struct.pack(">hi", -1, int(_TIMEOUT * 1000))  # acks=all, timeout
        + struct.pack(">i", 1)
        + _string(topic)
        + struct.pack(">ii", 1, partition)
        + struct.pack(">i", len(batch))
        + batch
    )
    request = struct.pack(">hhi", _PRODUCE, 3, 1) + _string("millstream-hanging") + body
    with socket.create_connection((host, port), _TIMEOUT) as connection:
        connection.sendall(struct.pack(">i", len(request)) + request)
        (size,) = struct.unpack(">i", read_exactly(connection, 4))
        answer = read_exactly(connection, size)
    # Correlation ID, one topic (its name), one partition: index, error, base offset.
    at = 8
    (name_length,) = struct.unpack(">h", answer[at : at + 2])
    at += 2 + name_length + 4
    _, error, offset = struct.unpack(">ihq", answer[at : at + 14])
    if error:
        raise RuntimeError(f"the broker refused the hanging transaction's batch: error {error}")
    return int(offset)


def _string(text: str) -> bytes:
    encoded = text.encode()
    return struct.pack(">h", len(encoded)) + encoded


def _varint(number: int) -> bytes:
    zigzag = (number << 1) ^ (number >> 63)
    out = bytearray()
    while True:
        low = zigzag & 0x7F
        zigzag >>= 7
        if not zigzag:
            out.append(low)
            return bytes(out)
        out.append(low | 0x80)


def _crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_CRC32C: Final = _crc32c_table()


def _crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC32C[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF
