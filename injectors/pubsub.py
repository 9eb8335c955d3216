"""The pubsub injector: an external Kafka topic, written by ordinary producers, into a stream.

The feed's messages carry JSON or Avro values; a user ``pick`` function returns each one's
event time (µs) and key, and the record's value is the message value as it came.

**Bad messages** never stop the source and never cost a good one. A message that does not
decode, that ``pick`` rejects (it raises), for which it returns an event time that is not a
plausible ``int`` (µs since the epoch, years 1970..9999) or no key (``None``), or a
tombstone (no value) becomes one dead letter whose origin is ``<topic>/<partition>``
(``stream``) and the message's offset (``offset``; the message id), and it never moves the
watermark. Its offset is checkpointed like a good message's, after the dead letter is sent:
a message counts as handled once its record or its dead letter is on Kafka. Messages of
aborted transactions are never read (``read_committed``).

* **Record IDs** derive from ``(topic, partition, offset)``, so a restarted injector that
  re-reads a message re-sends the same ID.
* **Position**: the next offset of every partition, checkpointed by the injector process
  (not committed to a consumer group: the fenced checkpoint is the only truth). Partitions
  added to the topic later are picked up from their beginning.
* **Watermark**: per partition, the highest event time read minus ``out_of_order`` (µs;
  a partition that delivered nothing yet holds at the beginning of time). The injector's
  watermark is the minimum over the partitions that can still deliver something older. A
  partition that is **caught up** (its position is at its end offset) **and idle** (nothing
  arrived for ``idle_after`` µs of the injected clock; with ``idle_after=None``, caught up
  alone) does not hold it: an idle partition of a busy topic must not stop every timer
  downstream. When every partition is caught up and idle, the watermark follows the clock
  (``now - out_of_order``) if a clock is given, else the highest partition's.
"""

from __future__ import annotations

import io
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaError, TopicPartition
from fastavro import parse_schema, schemaless_reader

from millstream.engine.clock import Clock
from millstream.engine.config import MillstreamConfig
from millstream.engine.errors import InjectorError, TombstoneError
from millstream.engine.records import MIN_EVENT_TIME, check_event_time
from millstream.injectors.source import Poll, Position, RejectedInput, Source, SourceRecord

__all__ = ["KafkaFeedSource", "Pick"]

_log = logging.getLogger(__name__)

Pick = Callable[[Any], tuple[int, str]]
"""From a decoded message value (a JSON document or an Avro record): (event time µs, key)."""

# Confluent's serializers frame Avro as magic byte 0 + a 4-byte schema ID + the body.
_CONFLUENT_MAGIC = 0
_CONFLUENT_HEADER = 5
_METADATA_EVERY = 10.0  # seconds between looks for new partitions


@dataclass
class _Partition:
    next_offset: int | None = None  # None: not started, where `start` says
    max_event: int | None = None
    last_arrival: int | None = None
    caught_up: bool = False


class KafkaFeedSource(Source):
    """Reads ``topic`` of the Kafka at ``config`` (``consumer_settings`` override, e.g. a
    ``bootstrap.servers`` of another cluster) into ``stream``; see the module docstring.

    ``value_format`` is ``"json"`` or ``"avro"`` (then ``avro_schema`` is the writer's
    schema; Confluent-framed values are recognised). ``start`` says where a partition
    without a checkpointed offset starts: ``"earliest"`` or ``"latest"``.
    """

    def __init__(
        self,
        config: MillstreamConfig,
        topic: str,
        pick: Pick,
        stream: str,
        *,
        value_format: Literal["json", "avro"] = "json",
        avro_schema: Mapping[str, Any] | None = None,
        out_of_order: int = 0,
        idle_after: int | None = None,
        clock: Clock | None = None,
        start: Literal["earliest", "latest"] = "earliest",
        max_records_per_poll: int = 5_000,
        consumer_settings: Mapping[str, str | int | bool] | None = None,
    ) -> None:
        if value_format == "avro" and avro_schema is None:
            raise InjectorError("KafkaFeedSource: value_format='avro' needs the avro_schema")
        if value_format not in ("json", "avro"):
            raise InjectorError(f"value_format must be 'json' or 'avro', not {value_format!r}")
        if out_of_order < 0:
            raise InjectorError(f"out_of_order must be non-negative µs, got {out_of_order}")
        if idle_after is not None and clock is None:
            raise InjectorError("KafkaFeedSource: idle_after needs a clock")
        self.config = config
        self.topic = topic
        self.pick = pick
        self.streams = (stream,)
        self.stream = stream
        self.value_format = value_format
        self._schema = parse_schema(dict(avro_schema)) if avro_schema is not None else None
        self.out_of_order = out_of_order
        self.idle_after = idle_after
        self.clock = clock
        self.start = start
        self.max_records_per_poll = max_records_per_poll
        self.consumer_settings = dict(consumer_settings or {})
        self._consumer: Consumer | None = None
        self._partitions: dict[int, _Partition] = {}
        self._assigned: set[int] = set()
        self._metadata_at = 0.0

    def open(self, position: Position | None) -> None:
        from millstream.connectors.kafka import consumer

        offsets = (position or {}).get("offsets", {})
        self._partitions = {
            int(p): _Partition(next_offset=int(o["next"]), max_event=o.get("max_event"))
            for p, o in offsets.items()
        }
        self._consumer = consumer(
            self.config,
            "millstream-feed",
            **{"enable.partition.eof": True},
            # An aborted transaction of the feed's producer never becomes records.
            **{"isolation.level": "read_committed"},
            **self.consumer_settings,
        )
        self._assign()

    def poll(self, timeout: float) -> Poll:
        reader = self._reader()
        if time.monotonic() - self._metadata_at > _METADATA_EVERY:
            self._assign()
        records: list[SourceRecord] = []
        rejected: list[RejectedInput] = []
        now = self.clock.now() if self.clock is not None else None
        for message in reader.consume(self.max_records_per_poll, timeout):
            error = message.error()
            partition, offset = message.partition(), message.offset()
            if error is not None and partition is None:
                # An event of the client, not of a message (a broker went away, ...):
                # librdkafka recovers from all but fatal ones by itself.
                if error.fatal():
                    raise InjectorError(f"reading feed topic {self.topic!r}: {error}")
                _log.warning("reading feed topic %r: %s", self.topic, error)
                continue
            assert partition is not None
            state = self._partitions.setdefault(partition, _Partition())
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    state.caught_up = True
                    continue
                raise InjectorError(
                    f"reading feed topic {self.topic!r} partition {partition}: {error}"
                )
            assert offset is not None
            state.next_offset = offset + 1
            state.caught_up = False
            state.last_arrival = now
            value = message.value()
            raw = value or b""
            origin = f"{self.topic}/{partition}"
            try:
                timestamp, key = self._pick(value)
            except Exception as exc:  # a bad message, whatever pick raises: a dead letter
                rejected.append(RejectedInput.of(origin, offset, raw, exc))
                continue
            records.append(SourceRecord(self.stream, key, raw, timestamp, origin, offset))
            state.max_event = max(state.max_event or timestamp, timestamp)
        return Poll(
            records=records,
            rejected=rejected,
            position={
                "offsets": {
                    str(p): {"next": s.next_offset, "max_event": s.max_event}
                    for p, s in sorted(self._partitions.items())
                    if s.next_offset is not None
                }
            },
            watermark=self._watermark(),
        )

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    # -- internals ---------------------------------------------------------------------------

    def _reader(self) -> Consumer:
        if self._consumer is None:
            raise InjectorError("KafkaFeedSource: open() it before polling")
        return self._consumer

    def _assign(self) -> None:
        reader = self._reader()
        metadata = reader.list_topics(self.topic, timeout=10)
        topic = metadata.topics.get(self.topic)
        if topic is None or topic.error is not None or not topic.partitions:
            raise InjectorError(
                f"feed topic {self.topic!r} does not exist (or has no partitions) on "
                f"{self.consumer_settings.get('bootstrap.servers', self.config.kafka_bootstrap)}"
            )
        self._metadata_at = time.monotonic()
        if set(topic.partitions) == self._assigned:
            return
        for partition in topic.partitions:
            self._partitions.setdefault(partition, _Partition())
        default = OFFSET_BEGINNING if self.start == "earliest" else OFFSET_END
        reader.assign(
            [
                TopicPartition(
                    self.topic,
                    p,
                    state.next_offset if state.next_offset is not None else default,
                )
                for p, state in sorted(self._partitions.items())
            ]
        )
        self._assigned = set(self._partitions)

    def _pick(self, value: bytes | None) -> tuple[int, str]:
        """A message's event time and key, checked before they count for the watermark: a
        bad event time must become a dead letter, never the source's low watermark."""
        if value is None:
            raise TombstoneError(
                "the message has no value (a tombstone: a deletion on a compacted topic); a "
                "feed carries events, so it is a dead letter"
            )
        timestamp, key = self.pick(self._decode(value))
        if not isinstance(timestamp, int) or isinstance(timestamp, bool):
            raise TypeError(f"pick returned event time {timestamp!r}, not int µs")
        if key is None:
            raise TypeError("pick returned no key (None)")
        check_event_time(timestamp)
        return timestamp, str(key)

    def _decode(self, raw: bytes) -> Any:
        if self.value_format == "json":
            return json.loads(raw)
        if len(raw) > _CONFLUENT_HEADER and raw[0] == _CONFLUENT_MAGIC:
            raw = raw[_CONFLUENT_HEADER:]
        assert self._schema is not None  # checked in __init__ for "avro"
        body = io.BytesIO(raw)
        document = schemaless_reader(body, self._schema, None)
        if body.tell() != len(raw):
            raise ValueError(f"{len(raw) - body.tell()} trailing bytes after the Avro record")
        return document

    def _watermark(self) -> int | None:
        now = self.clock.now() if self.clock is not None else None
        holds: list[int] = []
        for state in self._partitions.values():
            idle = self.idle_after is None or (
                now is not None
                and (state.last_arrival is None or now - state.last_arrival >= self.idle_after)
            )
            if state.caught_up and idle:
                continue
            holds.append(
                MIN_EVENT_TIME if state.max_event is None else state.max_event - self.out_of_order
            )
        if holds:
            return max(MIN_EVENT_TIME, min(holds))
        if now is not None:
            return now - self.out_of_order
        seen = [s.max_event for s in self._partitions.values() if s.max_event is not None]
        return max(seen) - self.out_of_order if seen else None
