"""read_stream: a stream's records, typed, as a job reads what its topology produced; and
read_ranges: the offset ranges of a batch, as its tasks read them."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, cast

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from millstream.connectors import kafka as kafka_connector
from millstream.connectors import read_stream
from millstream.connectors.stream_reader import InputMessage, range_reader, read_ranges
from millstream.engine.config import MillstreamConfig
from millstream.engine.errors import MillstreamError, RecordDecodeError, ServiceOutageError
from millstream.engine.records import Record, decode_record, encode_record, injector_record_id
from millstream.spark.isolation import OffsetRange

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


def read_back(services: MillstreamConfig, ranges: list[OffsetRange]) -> list[tuple[int, int]]:
    """(partition, offset) of each message :func:`read_ranges` yields, in order."""
    reader = range_reader(services)
    try:
        return [(m.partition, m.offset) for m in read_ranges(reader, ranges, timeout=30)]
    finally:
        reader.close()


def test_ranges_are_read_exactly_across_gaps_and_transaction_markers(
    services: MillstreamConfig, unique: Callable[[str], str]
) -> None:
    stream = unique("ranges")
    plain = kafka_connector.producer(services)
    transactional = kafka_connector.producer(services, **{"transactional.id": stream})
    try:
        kafka_connector.create_topics(services, [stream], partitions=2)
        for n in range(10):  # partition 0: offsets 0-9
            plain.produce(stream, value=encode_record(record(n)), partition=0, timestamp=n)
        assert plain.flush(30) == 0
        # Partition 1: a committed transaction (offsets 0-2, its marker 3), an aborted one
        # (4-5, marker 6), a committed one (7, marker 8).
        transactional.init_transactions(30)
        for values, commit in (([0, 1, 2], True), ([3, 4], False), ([5], True)):
            transactional.begin_transaction()
            for n in values:
                transactional.produce(stream, value=encode_record(record(n)), partition=1)
            if commit:
                transactional.commit_transaction(30)
            else:
                assert transactional.flush(30) == 0
                transactional.abort_transaction(30)

        # Two ranges of partition 0 with a hole (a batch without a quarantined message),
        # ending before the partition does; all of partition 1, markers and aborts skipped.
        found = read_back(
            services,
            [
                OffsetRange(stream, 0, 2, 4),
                OffsetRange(stream, 0, 5, 8),
                OffsetRange(stream, 1, 0, 9),
            ],
        )
        assert sorted(found) == [
            (0, 2),
            (0, 3),
            (0, 5),
            (0, 6),
            (0, 7),
            (1, 0),
            (1, 1),
            (1, 2),
            (1, 7),
        ]
        for partition in (0, 1):  # each partition in offset order
            offsets = [offset for p, offset in found if p == partition]
            assert offsets == sorted(offsets)
        # A range that is only an abort and its marker yields nothing, and ends.
        assert read_back(services, [OffsetRange(stream, 1, 4, 7)]) == []
        # What a message carries: its place, the Kafka timestamp in µs, its key and value.
        reader = range_reader(services)
        try:
            (message,) = read_ranges(reader, [OffsetRange(stream, 0, 9, 10)])
        finally:
            reader.close()
        assert message == InputMessage(stream, 0, 9, 9_000, None, encode_record(record(9)))
        # What skip refuses is left out, and the read still ends at each range's end.
        asked: list[tuple[str, bytes | None]] = []

        def odd(topic: str, value: bytes | None) -> bool:
            asked.append((topic, value))
            return value is not None and decode_record(value).value[-1] % 2 == 1  # v3, v5...

        reader = range_reader(services)
        try:
            kept = list(read_ranges(reader, [OffsetRange(stream, 0, 2, 8)], skip=odd))
        finally:
            reader.close()
        assert [(m.offset, decode_record(cast(bytes, m.value)).value) for m in kept] == [
            (n, f"v{n}".encode()) for n in (2, 4, 6)
        ]
        # Asked of every message of the range (and of any read past its end), with its topic.
        assert {value for _, value in asked} >= {encode_record(record(n)) for n in range(2, 8)}
        assert {topic for topic, _ in asked} == {stream}
    finally:
        kafka_connector.delete_topics(services, [stream])


def test_a_range_whose_messages_retention_removed_is_an_error_saying_so(
    services: MillstreamConfig, unique: Callable[[str], str]
) -> None:
    stream = unique("gone")
    writer = kafka_connector.producer(services)
    admin = kafka_connector.admin_client(services)
    try:
        kafka_connector.create_topics(services, [stream], partitions=1)
        for n in range(5):
            writer.produce(stream, value=encode_record(record(n)))
        assert writer.flush(30) == 0
        (deleted,) = admin.delete_records([TopicPartition(stream, 0, 3)]).values()
        deleted.result(30)
        with pytest.raises(MillstreamError, match=r"gone from .* deleted it"):
            read_back(services, [OffsetRange(stream, 0, 1, 5)])
        assert read_back(services, [OffsetRange(stream, 0, 3, 5)]) == [(0, 3), (0, 4)]
    finally:
        kafka_connector.delete_topics(services, [stream])


class CountingReader:
    """A range reader that notes the topics whose metadata it is asked for."""

    def __init__(self, reader: Consumer) -> None:
        self.reader = reader
        self.asked: list[str] = []

    def list_topics(self, topic: str, timeout: float) -> Any:
        self.asked.append(topic)
        return self.reader.list_topics(topic, timeout=timeout)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.reader, name)


def test_a_reader_asks_for_a_topics_metadata_before_its_first_read_of_it_only(
    services: MillstreamConfig, unique: Callable[[str], str]
) -> None:
    # Told nothing, a consumer that read another topic before learns of the new one at its
    # next scan, up to a second later (bench/range_reads.py measures it).
    first, second = unique("known"), unique("new")
    writer = kafka_connector.producer(services)
    reader = CountingReader(range_reader(services))
    try:
        kafka_connector.create_topics(services, [first, second], partitions=1)
        for topic in (first, second):
            for n in range(3):
                writer.produce(topic, value=encode_record(record(n)))
        assert writer.flush(30) == 0
        known: set[str] = set()
        consumer = cast(Consumer, reader)

        def offsets(topic: str, known_topics: set[str] | None) -> list[int]:
            ranges = [OffsetRange(topic, 0, 0, 3)]
            return [m.offset for m in read_ranges(consumer, ranges, known_topics=known_topics)]

        assert offsets(first, known) == [0, 1, 2]
        assert offsets(first, known) == [0, 1, 2]
        assert offsets(second, known) == [0, 1, 2]
        assert reader.asked == [first, second]
        assert known == {first, second}
        # Without a set of known topics, every read asks.
        assert offsets(first, None) == [0, 1, 2]
        assert reader.asked == [first, second, first]
    finally:
        reader.close()
        kafka_connector.delete_topics(services, [first, second])


class DownReader:
    def list_topics(self, topic: str, timeout: float) -> Any:
        raise KafkaException(KafkaError(KafkaError._TRANSPORT, "connection refused"))


def test_a_reader_that_cannot_ask_for_a_topics_metadata_says_kafka_is_down() -> None:
    reader = cast(Consumer, DownReader())
    with pytest.raises(ServiceOutageError, match=r"metadata of 'events' failed .*refused"):
        list(read_ranges(reader, [OffsetRange("events", 0, 0, 3)], timeout=1))
