"""Topologies: which computations run, what they read and write, with which guarantees.

A :class:`Topology` is a declaration (paper figure 3); the runner supplies the runtime. For
each computation it names the input streams with the consumer's key extractor (several
consumers may key one stream differently, paper 4.2), the output streams, and the
:class:`ComputationOptions`. Streams are identified by name only; any computation may read or
write any stream. A stream is *known* if an injector feeds it (:meth:`Topology.add_stream`)
or some computation declares it as an output.

The graph may be arbitrary, cycles and self-loops included, as in MillWheel: a computation may
feed its own input (iterative refinement). A cycle's low watermark is held by the oldest
pending work inside it, so a cycle advances only if its computations produce records with
timestamps ahead of the ones they consume.

Computations can be added and removed while others run; :meth:`Topology.validate` checks the
result (every input known) and the runner calls it after each change.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal, get_args

from millstream.engine.computation import Computation
from millstream.engine.deadletters import default_dead_letter_stream
from millstream.engine.errors import TopologyError
from millstream.engine.keys import MAX_KEY_INTERVALS
from millstream.engine.productions import ProductionPolicy
from millstream.engine.rebalance import RebalancePolicy
from millstream.engine.records import Record

__all__ = [
    "DEFAULT_KEY_INTERVALS",
    "ComputationOptions",
    "ComputationSpec",
    "InputStream",
    "KeyExtractor",
    "Tombstones",
    "Topology",
    "record_key",
]

KeyExtractor = Callable[[Record], str]
"""Picks the key a consumer processes a record under. Must be deterministic: a redelivered
record must reach the same key, or its dedup ID is not found."""

# Names become Kafka topic names and parts of record IDs: Kafka's legal characters, and short
# enough to leave room for suffixes such as ".dead-letters".
_NAME = re.compile(r"[A-Za-z0-9._-]{1,200}")
_MINUTE = 60 * 1_000_000
# Defaults of the deprecated Bloom options: only a value other than these warns.
_BLOOM_EXPECTED_IDS = 100_000
_BLOOM_FALSE_POSITIVE_RATE = 0.01

DEFAULT_KEY_INTERVALS = 4
"""The key intervals a computation without ``key_intervals`` starts with where no Spark job
runs it (the test harness, tools): a Spark job gives it one per core."""

Tombstones = Literal["dead-letter", "deliver"]
"""What a computation does with a Kafka tombstone (a message with no value): see
:class:`ComputationOptions`."""


def record_key(record: Record) -> str:
    """The default key extractor: the key the producer gave the record."""
    return record.key


@dataclass(frozen=True, slots=True)
class ComputationOptions:
    """Per-computation guarantees and tuning (paper 6.1.3).

    * ``exactly_once``: drop redelivered records by their dedup IDs. Off, no dedup ID is
      checked or written, and a redelivered record runs again.
    * ``strong_productions``: checkpoint productions before sending them (see
      :mod:`millstream.engine.productions`). Off, they are sent first and only the stragglers
      not acknowledged within ``weak_production_delay`` seconds are checkpointed.
    * ``transactional_productions``: with ``exactly_once`` and ``strong_productions`` (the
      default), send each commit's productions in one Kafka transaction that also records
      which commit it delivered, so that a plain ``read_committed`` consumer (the console
      consumer, a dashboard, a sink connector) reads each production once, not only
      millstream's deduplicating consumers (:mod:`millstream.engine.productions`). Off, or
      with weak productions: at-least-once on Kafka, exactly-once for millstream's readers.
    * ``key_intervals``: how many key intervals (units of parallelism and of the store) the
      computation starts with; its first batch stores them, and only a ``rebalance`` policy
      changes them after that. ``None`` (the default): one per core of the Spark job that
      first runs it (``defaultParallelism``, as Spark sizes its own stages), or
      :data:`DEFAULT_KEY_INTERVALS` where no Spark job runs it (the test harness, tools).
      Each interval with input costs a batch a lease check, a commit and a Kafka
      transaction, so more than one per core costs more than it spreads: on two cores, four
      intervals made a further stage of a pipeline in one query wait 20 % longer than two,
      and sixteen cost a fifth of the throughput.
    * ``retry_window`` + ``late_injector_slack`` (µs): how long dedup IDs are kept.
    * ``send_timeout`` (s): how long a worker waits for the sink before leaving productions
      pending for a later resend.
    * ``dead_letter_stream``: defaults to ``<computation>.dead-letters``.
    * ``bloom_expected_ids``, ``bloom_false_positive_rate``: deprecated and ignored: the
      Bloom filter in front of the dedup lookups sizes itself from the IDs its interval
      holds (:mod:`millstream.engine.dedup`); setting them warns, and they will be removed.
    * ``max_timer_firings_per_key``: per key and batch; the rest fire in the next batch, so a
      timer that keeps re-arming itself cannot stall an interval.
    * ``watermark_percentile`` (paper 7.2): run records and event-time timers under this
      percentile of the input low watermark (for example 99.0) instead of the exact one:
      stragglers among the sources of an input (an injector process far behind, the oldest
      work of a producing computation's intervals), weighing at most the rest of the records
      (1 % for 99.0), no longer hold the timers back, and their records come late. ``None``
      (the default): the exact watermark. The exact one is reported either way.
    * ``late_stream``: a stream to which records behind the input watermark go, as they
      are (same key, value, timestamp and record ID), in the commit of their key like any
      production; ``process_late`` says whether user code still sees them (the default) or
      only the late stream gets them.
    * ``state_ttl`` (µs of event time): a key's state expires once the input watermark passes
      its last update (the event time of the record or timer whose call set it) plus this;
      it is deleted in a commit like any other change, with the engine's timer that expired
      it, so a key without timers of its own leaves nothing behind. A late record's update
      never brings the expiry forward. ``None`` (the default): state is kept until cleared.
    * ``rebalance`` (paper 6.2, 7.1): split key intervals that carry too many records per
      batch and merge cold neighbours (:class:`~millstream.engine.rebalance.RebalancePolicy`),
      and spread the intervals over the batch's tasks by load; ``key_intervals`` is then
      where the computation starts. ``None`` (the default): the intervals stay as they are.
    * ``tombstones``: what a Kafka message with no value (a *tombstone*: a compacted topic's,
      Kafka Connect's or a CDC source's delete) on an input stream means. ``"dead-letter"``
      (the default): it is no record, and becomes a dead letter
      (:class:`~millstream.engine.errors.TombstoneError`). ``"deliver"``: it deletes its
      Kafka message key, and :meth:`Computation.process_deletion
      <millstream.engine.computation.Computation.process_deletion>` gets it as a
      :class:`~millstream.engine.records.Deletion` under that key (the key extractors do
      not apply: a tombstone has no record to extract from); one without a key, or whose
      key is not UTF-8, is dead-lettered. A deletion is exactly-once by its position on the
      stream (:func:`~millstream.engine.records.deletion_record_id`), is never late-streamed
      (it has no envelope to forward), and runs even behind the watermark.
    """

    exactly_once: bool = True
    strong_productions: bool = True
    transactional_productions: bool = True
    key_intervals: int | None = None
    retry_window: int = 10 * _MINUTE
    late_injector_slack: int = 0
    weak_production_delay: float = 1.0
    send_timeout: float = 30.0
    dead_letter_stream: str | None = None
    bloom_expected_ids: int = _BLOOM_EXPECTED_IDS
    bloom_false_positive_rate: float = _BLOOM_FALSE_POSITIVE_RATE
    max_timer_firings_per_key: int = 1_000
    watermark_percentile: float | None = None
    late_stream: str | None = None
    process_late: bool = True
    state_ttl: int | None = None
    rebalance: RebalancePolicy | None = None
    tombstones: Tombstones = "dead-letter"

    def starting_intervals(self, cores: int | None = None) -> int:
        """The key intervals the computation starts with: ``key_intervals``, or one per core
        of the job running it (``cores``, capped at the most the layout allows), or
        :data:`DEFAULT_KEY_INTERVALS` where no job says how many cores it has."""
        if self.key_intervals is not None:
            return self.key_intervals
        if cores is None:
            return DEFAULT_KEY_INTERVALS
        return max(1, min(cores, MAX_KEY_INTERVALS))

    def __post_init__(self) -> None:
        if self.tombstones not in get_args(Tombstones):
            raise TopologyError(
                f"tombstones must be one of {list(get_args(Tombstones))}, got {self.tombstones!r}"
            )
        if self.key_intervals is not None and not 1 <= self.key_intervals <= MAX_KEY_INTERVALS:
            raise TopologyError(
                f"key_intervals must be in [1, {MAX_KEY_INTERVALS}], got {self.key_intervals}"
            )
        if self.retry_window <= 0 or self.late_injector_slack < 0:
            raise TopologyError(
                "retry_window must be positive and late_injector_slack non-negative (µs)"
            )
        if self.weak_production_delay < 0 or self.send_timeout < 0:
            raise TopologyError("weak_production_delay and send_timeout must be non-negative")
        if self.max_timer_firings_per_key < 1:
            raise TopologyError("max_timer_firings_per_key must be at least 1")
        if self.dead_letter_stream is not None:
            _check_name("dead-letter stream", self.dead_letter_stream)
        if self.watermark_percentile is not None and not 0.0 < self.watermark_percentile < 100.0:
            raise TopologyError(
                f"watermark_percentile must be in (0, 100) (None: the exact watermark), got "
                f"{self.watermark_percentile}"
            )
        if self.state_ttl is not None and self.state_ttl <= 0:
            raise TopologyError(f"state_ttl must be positive (µs), got {self.state_ttl}")
        if self.late_stream is not None:
            _check_name("late stream", self.late_stream)
        elif not self.process_late:
            raise TopologyError(
                "process_late=False drops late records unless a late_stream takes them; "
                "name a late_stream"
            )
        if (self.bloom_expected_ids, self.bloom_false_positive_rate) != (
            _BLOOM_EXPECTED_IDS,
            _BLOOM_FALSE_POSITIVE_RATE,
        ):
            warnings.warn(
                "ComputationOptions.bloom_expected_ids and bloom_false_positive_rate are "
                "ignored (the Bloom filter in front of the dedup lookups sizes itself from the "
                "IDs its interval holds); remove them",
                DeprecationWarning,
                stacklevel=3,
            )

    @property
    def dedup_ttl(self) -> int:
        """How long (µs) a dedup ID outlives its commit: the retry window plus the slack."""
        return self.retry_window + self.late_injector_slack

    @property
    def transactional(self) -> bool:
        """Whether productions go out in Kafka transactions (see the class docstring)."""
        return self.exactly_once and self.strong_productions and self.transactional_productions

    @property
    def production_policy(self) -> ProductionPolicy:
        return ProductionPolicy.STRONG if self.strong_productions else ProductionPolicy.WEAK


@dataclass(frozen=True, slots=True)
class InputStream:
    """One input of a computation: a stream and the consumer's key extractor for it."""

    stream: str
    key_extractor: KeyExtractor = record_key


@dataclass(frozen=True, slots=True)
class ComputationSpec:
    """A computation as declared in a topology."""

    name: str
    computation: Computation
    inputs: tuple[InputStream, ...]
    outputs: tuple[str, ...]
    options: ComputationOptions = field(default_factory=ComputationOptions)

    @property
    def dead_letter_stream(self) -> str:
        return self.options.dead_letter_stream or default_dead_letter_stream(self.name)

    @property
    def late_stream(self) -> str | None:
        return self.options.late_stream

    @property
    def produced_streams(self) -> tuple[str, ...]:
        """Every stream it writes: its outputs, its dead letters and its late stream."""
        late = () if self.late_stream is None else (self.late_stream,)
        return (*self.outputs, self.dead_letter_stream, *late)

    def key_extractor(self, stream: str) -> KeyExtractor:
        for input_stream in self.inputs:
            if input_stream.stream == stream:
                return input_stream.key_extractor
        raise TopologyError(f"computation {self.name!r} does not read stream {stream!r}")

    def writes(self, stream: str) -> bool:
        """Whether user code may produce to ``stream`` (declared outputs, not dead letters)."""
        return stream in self.outputs


class Topology:
    """A named graph of computations and streams."""

    def __init__(self, name: str = "millstream", streams: Iterable[str] = ()) -> None:
        _check_name("topology", name)
        self.name = name
        self._external: set[str] = set()
        self._computations: dict[str, ComputationSpec] = {}
        for stream in streams:
            self.add_stream(stream)

    def add_stream(self, stream: str) -> None:
        """Declare a stream fed from outside the topology, by injectors."""
        _check_name("stream", stream)
        self._external.add(stream)

    def add_computation(
        self,
        name: str,
        computation: Computation,
        *,
        inputs: Mapping[str, KeyExtractor | None] | Iterable[str],
        outputs: Iterable[str] = (),
        options: ComputationOptions | None = None,
    ) -> ComputationSpec:
        """Declare a computation reading ``inputs`` and writing ``outputs``.

        ``inputs`` maps each input stream to its key extractor (``None``: the record's own key),
        or lists stream names to use the record's key for all of them.
        """
        _check_name("computation", name)
        if isinstance(inputs, str) or isinstance(outputs, str):
            raise TopologyError(
                f"computation {name!r}: inputs and outputs take lists of stream names, not a str"
            )
        if name in self._computations:
            raise TopologyError(f"computation {name!r} is already in topology {self.name!r}")
        if not isinstance(computation, Computation):
            raise TopologyError(
                f"computation {name!r} must be a Computation instance, got {computation!r}"
            )
        extractors = (
            dict(inputs)
            if isinstance(inputs, Mapping)
            else dict.fromkeys(_unique("input stream", name, inputs))
        )
        input_streams = tuple(
            InputStream(stream, extractor or record_key) for stream, extractor in extractors.items()
        )
        spec = ComputationSpec(
            name=name,
            computation=computation,
            inputs=input_streams,
            outputs=tuple(_unique("output stream", name, outputs)),
            options=options or ComputationOptions(),
        )
        for stream in (*extractors, *spec.outputs):
            _check_name("stream", stream)
        if spec.dead_letter_stream in spec.outputs or spec.dead_letter_stream in extractors:
            raise TopologyError(
                f"computation {name!r} uses its dead-letter stream {spec.dead_letter_stream!r} "
                "as a regular stream; name another dead_letter_stream in its options"
            )
        late = spec.late_stream
        if late is not None and (
            late in spec.outputs or late in extractors or late == spec.dead_letter_stream
        ):
            raise TopologyError(
                f"computation {name!r} uses its late stream {late!r} as another of its "
                "streams; name another late_stream in its options"
            )
        if spec.options.tombstones == "deliver" and not _overrides(computation, "process_deletion"):
            raise TopologyError(
                f"computation {name!r} takes tombstones as deletions (tombstones='deliver') "
                "but does not override process_deletion; override it, or leave tombstones "
                "to the dead letters"
            )
        self._computations[name] = spec
        return spec

    def remove_computation(self, name: str) -> ComputationSpec:
        """Take a computation out; its consumers keep reading its streams if still known."""
        try:
            return self._computations.pop(name)
        except KeyError:
            raise TopologyError(f"no computation {name!r} in topology {self.name!r}") from None

    @property
    def external_streams(self) -> frozenset[str]:
        """The streams declared with :meth:`add_stream`."""
        return frozenset(self._external)

    @property
    def computations(self) -> Mapping[str, ComputationSpec]:
        return dict(self._computations)

    def streams(self) -> set[str]:
        """Every known stream: external ones, outputs and dead-letter streams."""
        known = set(self._external)
        for spec in self._computations.values():
            known.update(spec.produced_streams)
        return known

    def producers(self, stream: str) -> list[ComputationSpec]:
        """The computations whose reports a consumer of ``stream`` waits for: those that
        write it as an output or as their late stream (dead letters hold nothing)."""
        return [
            spec
            for spec in self._computations.values()
            if stream in spec.outputs or stream == spec.late_stream
        ]

    def consumers(self, stream: str) -> list[ComputationSpec]:
        return [
            spec
            for spec in self._computations.values()
            if any(i.stream == stream for i in spec.inputs)
        ]

    def validate(self) -> None:
        """Raise :class:`TopologyError` if a computation reads a stream nothing feeds."""
        known = self.streams()
        problems = [
            f"{spec.name!r} reads unknown stream {i.stream!r}"
            for spec in self._computations.values()
            for i in spec.inputs
            if i.stream not in known
        ]
        if problems:
            raise TopologyError(
                "; ".join(problems) + ": declare injector streams with Topology.add_stream or add "
                "the computation that produces them"
            )


def _overrides(computation: Computation, hook: str) -> bool:
    return getattr(type(computation), hook) is not getattr(Computation, hook)


def _check_name(what: str, name: str) -> None:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise TopologyError(
            f"{what} name {name!r} is invalid: use 1-200 of the characters A-Z a-z 0-9 . _ -"
        )


def _unique(what: str, computation: str, names: Iterable[str]) -> list[str]:
    listed = list(names)
    duplicates = sorted({n for n in listed if listed.count(n) > 1})
    if duplicates:
        raise TopologyError(f"computation {computation!r} lists {what}s twice: {duplicates}")
    return listed
