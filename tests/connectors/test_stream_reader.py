"""read_stream: a stream's records, typed, as a job reads what its topology produced."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from millstream.connectors import kafka as kafka_connector
from millstream.connectors import read_stream
from millstream.engine.config import MillstreamConfig
from millstream.engine.errors import MillstreamError, RecordDecodeError
from millstream.engine.records import Record, encode_record, injector_record_id

pytestmark = pytest.mark.integration

NOW = 1_700_000_000_000_000


def record(n: int) -> Record:
    return Record(f"k{n}", f"v{n}".encode(), NOW + n, injector_record_id("reader", 0, n))


def test_records_come_typed_each_once_with_dedup_and_a_foreign_message_is_named(
    services: MillstreamConfig, unique: Callable[[str], str]
) -> None:
    stream = unique("read")
    sent = [record(n) for n in range(5)]
    writer = kafka_connector.producer(services)
    try:
        kafka_connector.create_topics(services, [stream], partitions=1)
        for one in [*sent, sent[1], sent[3]]:  # two repeats, as a re-sent production
            writer.produce(stream, key=one.key.encode(), value=encode_record(one))
        assert writer.flush(30) == 0
        assert list(read_stream(services, stream)) == [*sent, sent[1], sent[3]]
        assert list(read_stream(services, stream, dedup=True)) == sent
        # Reading from the end without following: nothing (yet).
        assert list(read_stream(services, stream, from_beginning=False)) == []

        writer.produce(stream, key=b"x", value=b"not a record")
        assert writer.flush(30) == 0
        with pytest.raises(RecordDecodeError, match=r"partition 0 offset 7 is not a record"):
            list(read_stream(services, stream))
        assert list(read_stream(services, stream, dedup=True, errors="skip")) == sent

        # Following: what arrives later, until stopped.
        stop = threading.Event()
        later: list[Record] = []

        def follow() -> None:
            for one in read_stream(services, stream, from_beginning=False, follow=True, stop=stop):
                later.append(one)

        reader = threading.Thread(target=follow, daemon=True)
        reader.start()
        time.sleep(2)  # the reader found the end offsets
        writer.produce(stream, key=b"k9", value=encode_record(record(9)))
        assert writer.flush(30) == 0
        deadline = time.monotonic() + 30
        while not later and time.monotonic() < deadline:
            time.sleep(0.1)
        stop.set()
        reader.join(10)
        assert later == [record(9)]
    finally:
        kafka_connector.delete_topics(services, [stream])


def test_a_stream_without_a_topic_is_an_error_saying_so(
    services: MillstreamConfig, unique: Callable[[str], str]
) -> None:
    with pytest.raises(MillstreamError, match="has no topic"):
        list(read_stream(services, unique("nothing")))
