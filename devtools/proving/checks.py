"""The proving ground's checks, in Jepsen's vocabulary, against what a run left behind.

Everything is read from the real services once the run settled: the computations' state
from Cassandra (through the store's own reads), the streams from Kafka, the watermark
reports from the watermark topic, and the drivers' batch log. Each check counts; a run
passes when every count is zero:

* **lost**: an effect an exact run has and this one lacks: a sequence number missing from a
  key's bitmap, a window record, a rollup entry, an output record or a dead letter missing;
* **duplicated**: an effect applied twice: a sequence number processed twice (``dups``), a
  window whose timer fired twice, two records with different IDs for one window;
* **unexpected**: an effect an exact run does not have (a wrong count, a record of no input);
* **unseen**: records the source generated that never reached the input stream;
* **watermark regressions**: a source's report on the watermark topic, or a computation's
  input watermark across the batches of every driver, that went back;
* **timers**: windows still open or timers still stored at the end, windows never fired;
* **accounting**: input records that are neither processed, dead letters nor counted drops;
* **acknowledged store writes lost**: the ``cassandra`` fault acknowledges a burst of LWTs on
  a probe row of its own just before it freezes and kills the node; after the restart the
  row must hold the last acknowledged value (a node that acknowledges before its commit log
  is durable loses the sequencer commits of its last moments, and their productions, already
  in Kafka, are produced again);
* **open transactions on outputs**: partitions of an output stream on which a transaction is
  still open once the run ended and the producers' transaction timeout passed (its records,
  and every record committed after it, stay hidden from read_committed readers). The checks
  read the streams only once no transaction is open on them, or that timeout passed;
* **plain read_committed consumer saw duplicates** (only with ``plain_exactly_once``): a
  message of an output stream (what the computations produce, dead letters included) that a
  plain Kafka consumer (``isolation.level=read_committed``, no millstream decoding or
  deduplication) reads twice: same topic, key bytes and value bytes. Every envelope carries
  a unique record ID, so a byte-identical message is a re-send. The counts per topic are
  figures of every run, the check or not.

Alongside, the *non-vacuity* counts say whether the faults provoked what they are meant to:
fenced (zombie) attempts, checkpointed productions re-sent, duplicates absorbed downstream,
unknown commit outcomes resolved, outages the driver and the injector waited out.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from millstream.connectors import cassandra as cassandra_connector
from millstream.connectors import kafka as kafka_connector
from millstream.connectors.kafka.stalls import stable_offsets
from millstream.connectors.kafka.topics import when_ready
from millstream.connectors.state_view import read_view
from millstream.connectors.stream_reader import read_messages as stream_messages
from millstream.devtools.proving.workload import (
    ExpectedOutcome,
    ProvingNames,
    Workload,
    bitmap_members,
)
from millstream.engine.clock import SystemClock
from millstream.engine.config import MillstreamConfig
from millstream.engine.deadletters import decode_dead_letter
from millstream.engine.errors import MillstreamError
from millstream.engine.keys import key_interval
from millstream.engine.records import Record, decode_record, injector_record_id
from millstream.engine.watermarks import WatermarkReport, decode_watermark_message

__all__ = [
    "FENCED_WRITE",
    "OPEN_TRANSACTIONS",
    "PLAIN_DUPLICATES",
    "STORE_WRITES_LOST",
    "SUPERSEDED_BATCHES",
    "CheckResult",
    "NonVacuity",
    "batch_watermark_regressions",
    "check_run",
    "check_store_probes",
    "injector_outage_waits",
    "open_transactions",
    "plain_duplicates",
    "read_messages",
    "read_plain",
]

# The driver's log lines of a split or merge it made, and of one it found journaled.
_CHANGED = re.compile(r": (split|merge) of intervals \[")
_FINISHING = re.compile(r": finishing a (split|merge)$")
# A write the store refused to a zombie (a worker's traceback in a driver's log): not the
# driver's own fence at a batch's start, which names FencedError too but writes nothing.
FENCED_WRITE = re.compile(r"^millstream\.engine\.errors\.FencedError: ")
# A worker's warning of a commit whose outcome is unknown (millstream.engine.protocol).
_UNKNOWN = re.compile(r"computation '[^']*' interval \d+: .*; reading it back$")
# An outage wait (millstream.engine.outages), whichever service it names.
_WAITING = re.compile(r": waiting for (Kafka|Cassandra)")
# The injector's outage waits (its Outage names it "injector '<name>' process '<id>'"), and
# those of its start (connect_injector's: "injector '<name>' starting").
_INJECTOR_WAITING = re.compile(r"injector '[^']*' process '[^']*': waiting for (Kafka|Cassandra)")
_INJECTOR_STARTING = re.compile(r"injector '[^']*' starting: waiting for (Kafka|Cassandra)")
# The figure of the batches the watermark check leaves out (batch_watermark_regressions).
SUPERSEDED_BATCHES: Final = "zombie batches ended after a later driver ran past them"
# The check a plain read_committed consumer's duplicates count under (plain_exactly_once).
PLAIN_DUPLICATES = "plain read_committed consumer saw duplicates"
# The check the cassandra fault's durability probe counts under.
STORE_WRITES_LOST = "acknowledged store writes lost by a crash"
OPEN_TRANSACTIONS = "open transactions on outputs"
# Spark's own fence: a second query on one checkpoint fails to write the same batch's log.
_SPARK_FENCED = "CONCURRENT_STREAM_LOG_UPDATE"
# The driver holding a checkpoint restarts a query that lost such a race to a zombie.
_TAKEN_BACK = "another driver wrote its checkpoint first"
# The dead letters of the poison fault's messages.
_POISON = "PoisonRecordError"
_TOMBSTONE = "TombstoneError"


@dataclass
class CheckResult:
    """The counts of every check (all zero: the run passed) and what each found first."""

    counts: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(
            (
                "lost",
                "duplicated",
                "unexpected",
                "unseen",
                "watermark regressions",
                "timers not fired exactly once",
                "accounting mismatch",
                STORE_WRITES_LOST,
                OPEN_TRANSACTIONS,
            ),
            0,
        )
    )
    examples: dict[str, list[str]] = field(default_factory=dict)
    figures: dict[str, int] = field(default_factory=dict)

    def add(self, check: str, count: int, example: str) -> None:
        if count <= 0:
            return
        self.counts[check] += count
        found = self.examples.setdefault(check, [])
        if len(found) < 5:
            found.append(example)

    @property
    def passed(self) -> bool:
        return not any(self.counts.values())


@dataclass
class NonVacuity:
    """What the faults provoked: the counts that show the guarantees were exercised."""

    fenced_attempts: int = 0
    resent_productions: int = 0
    marker_resolved: int = 0
    aborted_commits: int = 0
    unsettled_commits: int = 0
    fenced_producers: int = 0
    transaction_stalls: int = 0
    duplicates_absorbed: int = 0
    reprocessed_downstream: int = 0
    unknown_outcomes: int = 0
    failed_attempts: int = 0
    spark_fenced_queries: int = 0
    queries_taken_back: int = 0
    poison_pills_isolated: int = 0
    outage_waits: int = 0
    injector_outage_waits: int = 0
    injector_start_waits: int = 0
    interval_changes: int = 0
    changes_finished_after_a_kill: int = 0
    hanging_aborted: int = 0

    def rows(self) -> list[tuple[str, int]]:
        return [
            ("zombie or stale writes fenced", self.fenced_attempts),
            ("zombie queries stopped by Spark's checkpoint", self.spark_fenced_queries),
            ("queries restarted after a zombie's log write", self.queries_taken_back),
            ("records the engine failed on, isolated", self.poison_pills_isolated),
            ("strong productions re-sent", self.resent_productions),
            ("pending productions found delivered by the marker", self.marker_resolved),
            ("commits found undelivered (transaction aborted), re-sent", self.aborted_commits),
            ("commits answered by Kafka but not settled, resolved again", self.unsettled_commits),
            ("zombie producers fenced by Kafka", self.fenced_producers),
            ("output partitions stalled by an open transaction", self.transaction_stalls),
            ("duplicates dropped by exactly-once", self.duplicates_absorbed),
            ("inputs rerun by the stage without exactly-once", self.reprocessed_downstream),
            ("unknown LWT outcomes resolved", self.unknown_outcomes),
            ("batch attempts failed and retried", self.failed_attempts),
            ("batch attempts that waited out an outage", self.outage_waits),
            ("injector steps that waited out an outage", self.injector_outage_waits),
            ("injector starts that waited out an outage", self.injector_start_waits),
            ("key intervals split or merged", self.interval_changes),
            ("splits and merges a new driver finished", self.changes_finished_after_a_kill),
            ("hanging transactions aborted by the driver", self.hanging_aborted),
        ]


def read_messages(
    config: MillstreamConfig, topic: str, timeout: float = 60.0
) -> list[tuple[int, int, bytes]]:
    """Every committed message of ``topic`` as (partition, offset, value), up to its end now
    (offsets have gaps where transaction markers are)."""
    return [
        (message.partition, message.offset, message.value or b"")
        for message in stream_messages(config, topic, timeout=timeout)
    ]


def read_plain(
    config: MillstreamConfig, topics: Iterable[str], timeout: float = 60.0
) -> list[tuple[str, bytes | None, bytes | None]]:
    """Every committed message of ``topics`` as (topic, key, value), read as any Kafka
    application would: a plain confluent-kafka consumer (``isolation.level=read_committed``,
    no offsets committed, a throwaway group) from the beginning to the end offsets it is
    shown now, which for a read_committed consumer are the last stable offsets. Only the
    connection and security settings are millstream's; nothing is decoded or deduplicated.

    The end of a partition is told by the consumer's end-of-partition event, not by the
    offset of its last message: the last offsets of a transactional topic are commit
    markers, which no consumer receives."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer(
        {
            **kafka_connector.client_settings(config),
            "group.id": f"millstream-proving-plain-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
        }
    )
    try:
        names = list(topics)
        ends = kafka_connector.end_offsets(consumer, names)
        left = {(t, p): end for t in names for p, end in ends[t].items() if end > 0}
        consumer.assign([TopicPartition(t, p, 0) for t, p in left])
        messages: list[tuple[str, bytes | None, bytes | None]] = []
        deadline = time.monotonic() + timeout
        while left:
            if time.monotonic() > deadline:
                raise MillstreamError(
                    f"could not read {sorted(left)} to their end offsets within {timeout} s"
                )
            message = consumer.poll(0.5)
            if message is None:
                continue
            where = (message.topic() or "", message.partition() or 0)
            error = message.error()
            if error is not None and error.code() == KafkaError._PARTITION_EOF:
                if where in left and (message.offset() or 0) >= left[where]:
                    del left[where]
                continue
            if error is not None:
                raise MillstreamError(f"reading {where[0]!r} plainly: {error}")
            offset = message.offset() or 0
            if where not in left or offset >= left[where]:
                continue  # written after the end offsets were taken
            messages.append((where[0], message.key(), message.value()))
            if offset + 1 >= left[where]:
                del left[where]
        return messages
    finally:
        consumer.close()


def plain_duplicates(messages: Iterable[tuple[str, bytes | None, bytes | None]]) -> Counter[str]:
    """Per topic, the messages whose (topic, key bytes, value bytes) came before."""
    seen: set[tuple[str, bytes | None, bytes | None]] = set()
    found: Counter[str] = Counter()
    for message in messages:
        if message in seen:
            found[message[0]] += 1
        else:
            seen.add(message)
    return found


def _records(config: MillstreamConfig, stream: str) -> list[Record]:
    topic = kafka_connector.stream_topic(stream)
    return [decode_record(value) for _, _, value in read_messages(config, topic)]


def _input(config: MillstreamConfig, stream: str) -> tuple[list[Record], int]:
    """The records of an input stream, and how many tombstones (empty values) it holds."""
    values = [value for _, _, value in read_messages(config, kafka_connector.stream_topic(stream))]
    return [decode_record(value) for value in values if value], sum(not v for v in values)


def check_run(
    config: MillstreamConfig,
    names: ProvingNames,
    workload: Workload,
    expected: ExpectedOutcome,
    key_intervals: int,
    batches: Iterable[dict[str, Any]],
    driver_logs: Iterable[Path],
    injector_logs: Iterable[Path] = (),
    *,
    plain_exactly_once: bool = True,
    store_probes: Iterable[dict[str, int]] = (),
) -> tuple[CheckResult, NonVacuity]:
    """Run every check on a settled run; see the module docstring. ``plain_exactly_once``
    makes the duplicates a plain read_committed consumer sees a check (else figures only);
    ``store_probes``: the cassandra faults' probes (``acknowledged``, ``found``)."""
    result = CheckResult()
    check_store_probes(store_probes, result)
    if plain_exactly_once:
        result.counts[PLAIN_DUPLICATES] = 0
    batch_list = list(batches)
    _check_input(config, names, workload, expected, result)
    cluster, session = cassandra_connector.connect(config)
    try:
        from millstream.engine.stores.cassandra import CassandraIntervalStore

        store = CassandraIntervalStore(session, names.keyspace, SystemClock())
        _check_tally(store, expected, key_intervals, result)
        _check_rollup(store, expected, key_intervals, result)
    finally:
        cluster.shutdown()
    # A producer killed mid-transaction hides what others committed after it from
    # read_committed readers until the broker aborts it: read once none is open, or the
    # producers' transaction timeout passed (what is open then hangs, a defect of its own).
    outputs = [kafka_connector.stream_topic(stream) for stream in names.outputs()]
    still_open = open_transactions(config, outputs, config.kafka_transaction_timeout + 30.0)
    result.add(
        OPEN_TRANSACTIONS,
        len(still_open),
        f"(partition, (last stable offset, high watermark)): {sorted(still_open.items())[:3]}",
    )
    _check_outputs(config, names, expected, result)
    _check_watermarks(config, batch_list, result)
    _check_plain(config, outputs, names, result, plain_exactly_once)
    counts = _non_vacuity(batch_list, driver_logs, config, names)
    counts.injector_outage_waits = injector_outage_waits(injector_logs)
    counts.injector_start_waits = injector_outage_waits(injector_logs, starting=True)
    return result, counts


def open_transactions(
    config: MillstreamConfig, topics: Sequence[str], limit: float, poll: float = 0.5
) -> dict[tuple[str, int], tuple[int, int]]:
    """The partitions of ``topics`` on which a transaction is still open after waiting up to
    ``limit`` seconds for none to be, with their (last stable offset, high watermark)."""
    admin = kafka_connector.admin_client(config)
    deadline = time.monotonic() + limit
    while True:
        offsets = when_ready(lambda: stable_offsets(admin, topics), 30.0)
        still_open = {p: ends for p, ends in offsets.items() if ends[0] < ends[1]}
        if not still_open or time.monotonic() >= deadline:
            return still_open
        time.sleep(poll)


def check_store_probes(probes: Iterable[dict[str, int]], result: CheckResult) -> None:
    """Count the acknowledged probe LWTs that a crash of the node lost."""
    acknowledged = 0
    for probe in probes:
        acknowledged += probe["acknowledged"]
        lost = probe["acknowledged"] - probe["found"]
        result.add(
            STORE_WRITES_LOST,
            lost,
            f"{probe['acknowledged']} LWTs acknowledged just before the node was killed, "
            f"{probe['found']} found after its restart",
        )
    result.figures["LWTs acknowledged just before a Cassandra kill"] = acknowledged


def _check_plain(
    config: MillstreamConfig,
    topics: Sequence[str],
    names: ProvingNames,
    result: CheckResult,
    enabled: bool,
) -> None:
    """The duplicates a plain read_committed consumer of the output ``topics`` reads."""
    duplicates = plain_duplicates(read_plain(config, topics))
    for topic in topics:
        result.figures[f"plain read_committed duplicates: {topic}"] = duplicates[topic]
    result.figures["plain read_committed duplicates (total)"] = sum(duplicates.values())
    if enabled:
        # Only what goes out in transactions must be read once: the rollup's weak
        # productions are at-least-once on Kafka by design (its state absorbs reruns).
        checked = {kafka_connector.stream_topic(s) for s in names.transactional_outputs()}
        found = {t: n for t, n in sorted(duplicates.items()) if n and t in checked}
        per_topic = ", ".join(f"{t} {n}" for t, n in found.items())
        result.add(
            PLAIN_DUPLICATES,
            sum(found.values()),
            f"byte-identical messages of transactional outputs read again: {per_topic}",
        )


def injector_outage_waits(logs: Iterable[Path], *, starting: bool = False) -> int:
    """The outage waits (:mod:`millstream.engine.outages`) the injector logged in ``logs``:
    its steps', or with ``starting`` those of its starts."""
    pattern = _INJECTOR_STARTING if starting else _INJECTOR_WAITING
    waits = 0
    for log in logs:
        try:
            text = log.read_text(errors="replace")
        except FileNotFoundError:
            continue
        waits += sum(pattern.search(line) is not None for line in text.splitlines())
    return waits


def _check_input(
    config: MillstreamConfig,
    names: ProvingNames,
    workload: Workload,
    expected: ExpectedOutcome,
    result: CheckResult,
) -> None:
    records, tombstones = _input(config, names.events)
    ids = {record.record_id for record in records}
    result.figures["input records on the stream"] = len(records)
    result.add(
        "unexpected",
        abs(tombstones - expected.tombstones),
        f"{tombstones} tombstones on {names.events}, {expected.tombstones} sent",
    )
    result.figures["distinct input records"] = len(ids)
    wanted = {injector_record_id(names.injector, "proving", i): i for i in range(workload.records)}
    missing = [i for record_id, i in wanted.items() if record_id not in ids]
    result.add(
        "unseen",
        len(missing),
        f"record {missing[0]} never reached {names.events}" if missing else "",
    )
    strangers = ids - wanted.keys()
    result.add("unexpected", len(strangers), f"{len(strangers)} input records of no index")
    # Accounting: every distinct input is processed, a dead letter, or a counted drop.
    dead: set[bytes] = set()  # malformed records' (user code raised on them)
    poison: set[bytes] = set()  # records the engine failed on: dead letters of PoisonRecordError
    tombstones_dead: set[bytes] = set()  # by position: a tombstone has no record ID
    for record in _records(config, names.dead_letters("tally")):
        letter = decode_dead_letter(record.value)
        if letter.error_type == _POISON:
            # The router rejects a quarantined message before decoding it: its own ID is in
            # the envelope it kept.
            poison.add(decode_record(letter.raw).record_id)
        elif letter.error_type == _TOMBSTONE:
            tombstones_dead.add(letter.origin.cause_id())
        else:
            dead.add(letter.origin.cause_id())
    injector_dead = len(_records(config, names.injector_dead_letters))
    result.figures["dead letters (distinct)"] = len(dead) + len(poison) + len(tombstones_dead)
    result.figures["injector dead letters"] = injector_dead
    malformed_ids = {injector_record_id(names.injector, "proving", i) for i in expected.malformed}
    lost_dead = malformed_ids - dead
    result.add("lost", len(lost_dead), f"{len(lost_dead)} malformed records without a dead letter")
    result.add("unexpected", len(dead - malformed_ids), "a dead letter for a well-formed record")
    poisoned_ids = {injector_record_id(names.injector, "proving", i) for i in expected.poisoned}
    result.figures["poisoned records isolated"] = len(poison)
    result.add(
        "lost", len(poisoned_ids - poison), "a record the engine failed on without a dead letter"
    )
    result.add("unexpected", len(poison - poisoned_ids), "a record taken for a poison pill")
    result.figures["tombstone dead letters"] = len(tombstones_dead)
    result.add(
        "lost" if len(tombstones_dead) < expected.tombstones else "unexpected",
        abs(len(tombstones_dead) - expected.tombstones),
        f"{len(tombstones_dead)} tombstone dead letters for {expected.tombstones} tombstones",
    )
    processed = sum(len(s) for s in expected.sequences.values())
    result.figures["expected processed"] = processed
    settled = len(dead & malformed_ids) + len(poison & poisoned_ids)
    mismatch = len(ids) - (processed + settled + injector_dead)
    result.add(
        "accounting mismatch",
        abs(mismatch),
        f"{len(ids)} distinct inputs != {processed} processed + {settled} dead letters "
        f"+ {injector_dead} drops",
    )


def _check_tally(
    store: Any, expected: ExpectedOutcome, key_intervals: int, result: CheckResult
) -> None:
    seen_total = 0
    for key, sequences in sorted(expected.sequences.items()):
        view = _view(store, "tally", key, key_intervals)
        if view.state is None:
            result.add("lost", len(sequences), f"tally has no state for {key}")
            continue
        doc = json.loads(view.state)
        members = bitmap_members(doc["seen"])
        seen_total += len(members)
        missing = sequences - set(members)
        extra = set(members) - sequences
        result.add(
            "lost", len(missing), f"tally {key}: sequence numbers {sorted(missing)[:5]} missing"
        )
        result.add(
            "unexpected",
            len(extra),
            f"tally {key}: sequence numbers {sorted(extra)[:5]} of no input",
        )
        result.add(
            "duplicated",
            int(doc["dups"]),
            f"tally {key}: {doc['dups']} sequence numbers processed twice",
        )
        fired = Counter(int(w) for w in doc["fired"])
        windows = set(expected.windows[key])
        twice = {w: n for w, n in fired.items() if n > 1}
        result.add(
            "timers not fired exactly once",
            sum(n - 1 for n in twice.values()),
            f"tally {key}: windows {sorted(twice)[:5]} fired more than once",
        )
        result.add(
            "duplicated", sum(n - 1 for n in twice.values()), f"tally {key}: a window fired twice"
        )
        never = windows - fired.keys()
        result.add(
            "timers not fired exactly once",
            len(never),
            f"tally {key}: windows {sorted(never)[:5]} never fired",
        )
        result.add(
            "unexpected", len(fired.keys() - windows), f"tally {key}: a window of no input fired"
        )
        result.add(
            "timers not fired exactly once",
            len(doc["open"]),
            f"tally {key}: windows {sorted(doc['open'])[:5]} still open",
        )
        result.add(
            "timers not fired exactly once",
            len(view.timers),
            f"tally {key}: {len(view.timers)} timers still stored",
        )
    result.figures["processed (distinct, from state)"] = seen_total


def _check_rollup(
    store: Any, expected: ExpectedOutcome, key_intervals: int, result: CheckResult
) -> None:
    for window, counts in sorted(expected.rollups().items()):
        view = _view(store, "rollup", window, key_intervals)
        if view.state is None:
            result.add("lost", len(counts), f"rollup has no state for {window}")
            continue
        doc = json.loads(view.state)
        found = {k: int(v) for k, v in doc["counts"].items()}
        missing = counts.keys() - found.keys()
        result.add("lost", len(missing), f"rollup {window}: keys {sorted(missing)[:5]} missing")
        wrong = [k for k in counts.keys() & found.keys() if counts[k] != found[k]]
        result.add(
            "unexpected",
            len(wrong) + len(found.keys() - counts.keys()),
            f"rollup {window}: wrong or extra counts {sorted(wrong)[:5]}",
        )
        result.add(
            "duplicated",
            int(doc["conflicts"]),
            f"rollup {window}: {doc['conflicts']} conflicting counts",
        )


def _view(store: Any, computation: str, key: str, key_intervals: int) -> Any:
    # Where the computation's intervals are now: they may have split or merged in the run.
    layout = store.read_layout(computation)
    interval = key_interval(key, key_intervals) if layout is None else layout.interval_of(key)
    intervals = key_intervals if layout is None else len(layout.ids)
    return read_view(store, computation, interval, key, sequencer=None, intervals=intervals)


def _check_outputs(
    config: MillstreamConfig, names: ProvingNames, expected: ExpectedOutcome, result: CheckResult
) -> None:
    wanted = {(key, window): count for key, window, count in expected.window_records()}
    for stream in (names.windows, names.rollups):
        records = _records(config, stream)
        distinct: dict[bytes, Record] = {}
        for record in records:
            distinct.setdefault(record.record_id, record)
        result.figures[f"{stream.rsplit('.', 1)[1]} records (raw / distinct)"] = len(records)
        result.figures[f"{stream.rsplit('.', 1)[1]} distinct"] = len(distinct)
        effects: dict[tuple[str, int], list[int]] = {}
        for record in distinct.values():
            document = json.loads(record.value)
            effects.setdefault((document["key"], int(document["window"])), []).append(
                int(document["count"])
            )
        missing = wanted.keys() - effects.keys()
        result.add("lost", len(missing), f"{stream}: no record for {sorted(missing)[:3]}")
        doubled = {e: c for e, c in effects.items() if len(c) > 1}
        result.add(
            "duplicated",
            sum(len(c) - 1 for c in doubled.values()),
            f"{stream}: {sorted(doubled)[:3]} written under several IDs",
        )
        wrong = [e for e, c in effects.items() if e not in wanted or c[0] != wanted[e]]
        result.add(
            "unexpected", len(wrong), f"{stream}: wrong or extra records {sorted(wrong)[:3]}"
        )


def _check_watermarks(
    config: MillstreamConfig, batches: list[dict[str, Any]], result: CheckResult
) -> None:
    # Readers order a source's reports by sequence and ignore older ones (a zombie's late
    # report of a batch its successor ran past is such): a regression is a report that
    # readers take, below one they took before.
    last: dict[str, tuple[int, int]] = {}
    reports = stale = 0
    for _, _, value in read_messages(config, config.kafka_watermark_topic):
        message = decode_watermark_message(value)
        if not isinstance(message, WatermarkReport):
            continue
        reports += 1
        previous = last.get(message.source)
        if previous is not None and message.sequence < previous[0]:
            stale += 1
            continue
        if previous is not None and message.watermark < previous[1]:
            result.add(
                "watermark regressions",
                1,
                f"{message.source} reported {message.watermark} (sequence {message.sequence})"
                f" after {previous[1]} (sequence {previous[0]})",
            )
        watermark = max(previous[1], message.watermark) if previous else message.watermark
        last[message.source] = (message.sequence, watermark)
    result.figures["watermark reports"] = reports
    result.figures["stale watermark reports (older sequence, ignored by readers)"] = stale
    regressions, superseded = batch_watermark_regressions(batches)
    for regression in regressions:
        result.add("watermark regressions", 1, regression)
    result.figures[SUPERSEDED_BATCHES] = superseded


def batch_watermark_regressions(batches: Iterable[Mapping[str, Any]]) -> tuple[list[str], int]:
    """The batches, in the order they ended, that ran under a lower input watermark than an
    earlier batch of their computation; and how many batches were left out as a zombie's.

    A driver stopped (the ``zombie`` fault: SIGSTOP) in the middle of a batch ends that
    batch when it goes on, under the watermark it planned the batch with, after the driver
    that took over ran that batch or a later one under a newer watermark. Such a batch is
    not counted: its driver was superseded before it ended, so its writes were refused,
    as readers ignore a zombie's late report of a batch its successor ran past. A driver
    supersedes another if its first batch ended after the other's first batch; a batch of
    a newer driver (a replay after a crash) always counts."""
    ordered = sorted(batches, key=lambda b: b["at"])
    first: dict[int, float] = {}
    for batch in ordered:
        first.setdefault(batch["pid"], batch["at"])
    seen: dict[str, int] = {}
    ran: dict[str, dict[int, int]] = {}  # computation: driver pid to its highest batch ID
    regressions: list[str] = []
    superseded = 0
    for batch in ordered:
        name, pid, number = batch["computation"], batch["pid"], batch["batch_id"]
        drivers = ran.setdefault(name, {})
        newer = [top for other, top in drivers.items() if first[other] > first[pid]]
        drivers[pid] = max(drivers.get(pid, number), number)
        if any(top >= number for top in newer):
            superseded += 1
            continue
        before = seen.get(name)
        if before is not None and batch["input_watermark"] < before:
            regressions.append(
                f"{name}: driver {pid} ran batch {number} under input "
                f"watermark {batch['input_watermark']} after {before}"
            )
        seen[name] = max(before or 0, batch["input_watermark"])
    return regressions, superseded


def _non_vacuity(
    batches: list[dict[str, Any]],
    driver_logs: Iterable[Path],
    config: MillstreamConfig,
    names: ProvingNames,
) -> NonVacuity:
    counts = NonVacuity()
    logged_unknown = 0
    for batch in batches:
        counts.resent_productions += int(batch["resent"])
        counts.marker_resolved += int(batch.get("marker_resolved", 0))
        counts.aborted_commits += int(batch.get("aborted_commits", 0))
        counts.unsettled_commits += int(batch.get("unsettled_commits", 0))
        counts.fenced_producers += int(batch.get("fenced_producers", 0))
        counts.transaction_stalls += int(batch.get("stalls", 0))
        # Resolved within the batch, or left by an attempt that failed on it (a failed task
        # ends its Python worker, counters and all) and settled by the next attempt's
        # takeover of the interval.
        counts.unknown_outcomes += int(batch["unknown_outcomes"])
        counts.unknown_outcomes += sum(
            "UnknownOutcomeError" in failure for failure in batch["failed_attempts"]
        )
        if batch["computation"] == "tally":
            counts.duplicates_absorbed += int(batch["duplicates"])
        counts.poison_pills_isolated += int(batch.get("isolated", 0))
    for log in driver_logs:
        try:
            lines = log.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            continue
        counts.failed_attempts += sum("failed, retrying" in line for line in lines)
        counts.outage_waits += sum(_WAITING.search(line) is not None for line in lines)
        logged_unknown += sum(_UNKNOWN.search(line) is not None for line in lines)
        counts.interval_changes += sum(_CHANGED.search(line) is not None for line in lines)
        counts.changes_finished_after_a_kill += sum(
            _FINISHING.search(line) is not None for line in lines
        )
        # A fenced attempt's error names its interval, sequencer and lease: one message per
        # write refused, however often Spark's logs repeat it.
        counts.fenced_attempts += len({line for line in lines if FENCED_WRITE.match(line)})
        taken_back = [line for line in lines if _TAKEN_BACK in line]
        counts.queries_taken_back += len(taken_back)
        counts.spark_fenced_queries += sum(_SPARK_FENCED in line for line in lines) - sum(
            _SPARK_FENCED in line for line in taken_back
        )
    # Each unknown outcome a worker met is also a warning in the driver's log, written before
    # anything can fail on it: the batches miss one whose attempt failed naming another
    # interval's error, or whose next attempt ran the interval in another process.
    counts.unknown_outcomes = max(counts.unknown_outcomes, logged_unknown)
    # The rollup stage runs without exactly-once: an input it ran again (a replayed batch)
    # sent its weak productions again, under the same record IDs; its state, which sets,
    # absorbed the rerun.
    rollups = _records(config, names.rollups)
    counts.reprocessed_downstream = len(rollups) - len({r.record_id for r in rollups})
    return counts
