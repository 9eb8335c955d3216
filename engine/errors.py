"""The exceptions millstream raises, under one root.

::

    MillstreamError
    ├── ConfigError                 a setting is missing or malformed
    ├── LocalStackError             the local Kafka/Cassandra could not be run
    │   ├── JavaNotFoundError       no java, or not the version the services need
    │   ├── PortInUseError          a port the service needs is taken
    │   ├── MavenError              artifacts could not be resolved
    │   └── ServiceStartError       a service did not come up in time
    ├── RecordError                 a record cannot travel on a stream
    │   ├── RecordDecodeError       bytes off a stream are not a record we can read
    │   │   ├── UnknownSchemaError  the writer's schema fingerprint is not registered
    │   │   └── MalformedRecordError bad marker, corrupt or truncated body, wrong shape
    │   ├── OversizedRecordError    an encoded record is larger than a stream carries
    │   ├── AbsurdTimestampError    an event time outside the plausible range (unit mistake?)
    │   ├── PoisonRecordError       a message made the engine itself fail: isolated, quarantined
    │   └── TombstoneError          a message with no value (a Kafka tombstone), not taken
    ├── TopologyError               a topology or computation declaration is invalid
    ├── UndeclaredStreamError       user code produced to a stream it did not declare
    ├── WatermarkReportError        a message on the watermark topic is not a valid report
    ├── ServiceOutageError          Kafka or Cassandra unreachable at start or past the timeout
    ├── CheckpointStorageError      the disk under a query's checkpoint is full or unwritable
    ├── PoisonIsolationError        a failing batch's failure could not be pinned on few records
    └── StoreError                  the interval store refused or lost track of a write
        ├── FencedError             another worker took the interval: stop, drop soft state
        │   └── RetiredIntervalError the interval was split or merged away: route by the layout
        └── UnknownOutcomeError     a conditional write timed out: it may or may not have applied

Every message says what was wrong and what to do about it.
"""

from __future__ import annotations

__all__ = [
    "AbsurdTimestampError",
    "CheckpointStorageError",
    "ConfigError",
    "FencedError",
    "InjectorError",
    "InjectorFencedError",
    "InjectorRetiredError",
    "JavaNotFoundError",
    "LocalStackError",
    "MalformedRecordError",
    "MavenError",
    "MillstreamError",
    "OversizedRecordError",
    "PoisonIsolationError",
    "PoisonRecordError",
    "PortInUseError",
    "RecordDecodeError",
    "RecordError",
    "RetiredIntervalError",
    "ServiceOutageError",
    "ServiceStartError",
    "StoreError",
    "TombstoneError",
    "TopologyError",
    "UndeclaredStreamError",
    "UnknownOutcomeError",
    "UnknownSchemaError",
    "WatermarkReportError",
]


class MillstreamError(Exception):
    """Root of every error millstream raises on purpose."""


class ConfigError(MillstreamError):
    """A configuration value is missing, malformed or contradictory."""


class LocalStackError(MillstreamError):
    """The local single-node services could not be prepared, started or stopped."""


class JavaNotFoundError(LocalStackError):
    """No usable Java runtime: missing, or a version Kafka and Cassandra do not run on."""


class PortInUseError(LocalStackError):
    """A port a local service must bind is already taken by another process."""


class MavenError(LocalStackError):
    """Maven failed to resolve the pinned JVM artifacts."""


class ServiceStartError(LocalStackError):
    """A service process exited or did not accept clients before its deadline."""


class RecordError(MillstreamError):
    """A record cannot travel on a stream; at the Kafka boundary it becomes a dead letter."""


class RecordDecodeError(RecordError):
    """Bytes read from a stream are not a record this process can decode."""


class UnknownSchemaError(RecordDecodeError):
    """The writer's schema fingerprint is not in the schema registry.

    Register the writer's schema (``SchemaRegistry.register``) in every reader.
    """


class MalformedRecordError(RecordDecodeError):
    """Bad marker, truncated or corrupt body, trailing bytes, or fields the reader lacks."""


class OversizedRecordError(RecordError):
    """An encoded record is larger than the streams carry (``records.MAX_RECORD_BYTES``)."""


class AbsurdTimestampError(RecordError):
    """An event time lies outside ``records.MIN_EVENT_TIME``..``records.MAX_EVENT_TIME``."""


class PoisonRecordError(RecordError):
    """A message made the engine itself (not user code) fail whenever it was in a batch: a
    decoder, a library or a worker crashed on it. The Spark runtime isolated it by bisecting
    the failing batch, quarantined it in the query's checkpoint, and dead-lettered it with
    the original error and traceback (:mod:`millstream.spark.quarantine`).

    The message is a bug report: report it with the dead letter's raw bytes. To run the
    record again once the bug is fixed, produce its raw bytes to the stream anew.
    """


class TombstoneError(RecordError):
    """A Kafka message with no value (a *tombstone*: what a compacted topic, Kafka Connect or
    a CDC source writes for a delete) that the consumer does not take as a deletion.

    By default a tombstone is dead-lettered. A computation whose stream means deletions by
    them sets ``ComputationOptions(tombstones="deliver")`` and overrides
    ``Computation.process_deletion``; even then a tombstone without a key, or whose key is
    not UTF-8, cannot name what it deletes and is dead-lettered.
    """


class TopologyError(MillstreamError):
    """A topology declaration is inconsistent: duplicate names, unknown streams, bad options."""


class UndeclaredStreamError(MillstreamError):
    """User code produced to a stream its computation does not declare as an output."""


class StoreError(MillstreamError):
    """The interval store refused a write or cannot say whether one applied."""


class FencedError(StoreError):
    """Another worker acquired the interval's sequencer after this worker did.

    The write was not applied and no later write with this lease can be. The worker is a
    zombie for this interval: it must stop work on it, drop its soft state for it, and leave
    the inputs unacknowledged so that the current owner processes them.
    """


class RetiredIntervalError(FencedError):
    """The interval was split or merged into others (:mod:`millstream.engine.layout`): its
    keys live in new intervals now, and no worker can acquire it again. Read the
    computation's current layout and route by it.
    """


class UnknownOutcomeError(StoreError):
    """A conditional write timed out: it may or may not have applied, and may still apply.

    ``marker`` identifies the uncertain write; ``uncertain_keys`` are the keys whose changes it
    carried and ``unattempted_keys`` those the same call had not sent yet. Never assume either
    outcome: resolve with ``IntervalStore.was_applied(lease, marker)``, which answers
    linearizably and makes sure a write it reports as not applied can never apply later, then
    commit again whatever did not apply.
    """

    def __init__(
        self,
        message: str,
        *,
        marker: bytes,
        uncertain_keys: tuple[str, ...] = (),
        unattempted_keys: tuple[str, ...] = (),
    ) -> None:
        super().__init__(message)
        self.marker = marker
        self.uncertain_keys = uncertain_keys
        self.unattempted_keys = unattempted_keys


class WatermarkReportError(MillstreamError):
    """A message on the watermark topic is not a valid report (it is skipped and counted)."""


class ServiceOutageError(MillstreamError):
    """Kafka or Cassandra stayed unreachable longer than the outage timeout
    (:mod:`millstream.engine.outages`), or did not answer as a run started
    (:mod:`millstream.connectors.services`); the work that failed runs again on restart.

    ``down``: each service found not answering, as ``"Kafka at HOST:PORT (why)"``, when the
    error was raised after looking (empty otherwise)."""

    def __init__(self, message: str, *, down: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.down = down


class CheckpointStorageError(MillstreamError):
    """A query could not write its checkpoint (the disk under it is full or unwritable).

    Nothing is lost: the batch it could not log runs again from the checkpoint once the
    topology restarts with space.
    """


class PoisonIsolationError(MillstreamError):
    """A micro-batch kept failing and more of its records failed alone than a batch may
    dead-letter (:data:`millstream.spark.isolation.MAX_ISOLATED`): a failure that many
    records trip is taken for a bug or a broken worker, not for poison, and nothing was
    dead-lettered. Fix the cause (the error is chained) and restart: the batch runs again.
    """


class InjectorError(MillstreamError):
    """An injector process cannot go on (its checkpoint, Kafka or its source failed).

    Its position is checkpointed: restarting the process resumes where it stopped, and
    whatever it sent twice is dropped downstream by record ID.
    """


class InjectorFencedError(InjectorError):
    """Another copy of the same injector process took over; this one is a zombie and stops."""


class InjectorRetiredError(InjectorError):
    """The injector process was retired (removed from its expected set) and may not run."""
