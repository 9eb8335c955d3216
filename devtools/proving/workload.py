"""The proving ground's workload: a seeded input and a two-stage topology whose state tells
a lost or doubled effect apart from a correct one.

Input (:class:`ProvingSource`): record ``i`` goes to key ``k{i mod keys}`` with the key's
sequence number ``i div keys`` and event time ``EPOCH + i * step``; a few records, chosen by
the seed, carry a value that is not JSON (user code raises on it: a dead letter). A skewed
workload (``hot_share``) instead draws each record's key by the seed: that share of the
records goes to the keys of one hash range (the first quarter: ``tally``'s interval 0 of its
starting 4), the rest to any key; a key's sequence numbers still count its records 0, 1, ...

Topology (:func:`proving_topology`)::

    events ─▶ tally (by user key; exactly-once, strong productions; event-time windows)
                │  one record per key and window, when the low watermark passes the window
                ▼
             windows ─▶ rollup (by window; exactly-once off, weak productions; idempotent)
                          │  one record per input
                          ▼
                        rollups

* ``tally`` keeps, per key, a bitmap of the sequence numbers it processed (a second sight of
  one is a duplicated effect, counted in ``dups``), the count of each open window, and the
  list of windows whose timer fired: a timer that fired twice shows there twice.
* ``rollup`` runs without exactly-once and with weak productions, the combination the paper
  allows for idempotent work (6.1.3): its state *sets* each key's count of the window, so a
  redelivered record changes nothing (a different count for a key already set is a
  ``conflict``).

:func:`expected_outcome` folds the distinct input the same way, for the checker.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import mmh3

from millstream.engine.codecs import JsonCodec
from millstream.engine.computation import Computation
from millstream.engine.context import Context
from millstream.engine.keys import key_interval
from millstream.engine.rebalance import RebalancePolicy
from millstream.engine.records import Record
from millstream.engine.timers import Timer
from millstream.engine.topology import ComputationOptions, Topology
from millstream.injectors.source import Poll, Position, Source, SourceRecord

__all__ = [
    "EPOCH",
    "ExpectedOutcome",
    "ProvingNames",
    "ProvingSource",
    "Rollup",
    "Tally",
    "Workload",
    "bitmap_members",
    "expected_outcome",
    "proving_topology",
    "rebalance_policy",
]

EPOCH: Final = 1_767_225_600_000_000  # 2026-01-01T00:00:00Z in µs: event time is fixed
_STATE: Final = JsonCodec()
_MALFORMED: Final = b"\xff not json"
_SKEW_SALT: Final = 0x5BD1E995
_HOT_RANGE_OF: Final = 4  # a skewed workload's hot keys: interval 0 of this many


@dataclass(frozen=True, slots=True)
class Workload:
    """The input's shape: ``records`` over ``keys``, one every ``step`` µs of event time,
    windows of ``window`` µs, sent at ``rate`` records per second of wall time, about one
    in ``malformed_every`` malformed (0: none); ``hot_share`` of the records on the keys of
    one hash range (0: every key alike)."""

    records: int
    keys: int
    seed: int
    rate: float
    step: int = 10_000
    window: int = 5_000_000
    malformed_every: int = 97
    hot_share: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.hot_share < 1.0:
            raise ValueError(f"hot_share must be in [0, 1), got {self.hot_share}")

    def key(self, index: int) -> str:
        if self.hot_share:
            return _skewed(self)[0][index]
        return f"k{index % self.keys:04d}"

    def sequence(self, index: int) -> int:
        if self.hot_share:
            return _skewed(self)[1][index]
        return index // self.keys

    def malformed(self, index: int) -> bool:
        if self.malformed_every <= 0:
            return False
        return (
            mmh3.hash(index.to_bytes(8, "little"), self.seed, signed=False) % (self.malformed_every)
            == 0
        )

    def timestamp(self, index: int) -> int:
        return EPOCH + index * self.step

    def window_of(self, timestamp: int) -> int:
        return (timestamp - EPOCH) // self.window

    def value(self, index: int) -> bytes:
        if self.malformed(index):
            return _MALFORMED
        return json.dumps({"seq": self.sequence(index)}).encode()

    def to_json(self) -> dict[str, Any]:
        return {
            "records": self.records,
            "keys": self.keys,
            "seed": self.seed,
            "rate": self.rate,
            "step": self.step,
            "window": self.window,
            "malformed_every": self.malformed_every,
            "hot_share": self.hot_share,
        }

    @classmethod
    def from_json(cls, document: dict[str, Any]) -> Workload:
        return cls(**document)


@functools.lru_cache(maxsize=4)
def _skewed(workload: Workload) -> tuple[list[str], list[int]]:
    """Each record's key and the key's sequence number, for a skewed workload."""
    names = [f"k{n:04d}" for n in range(workload.keys)]
    hot = [k for k in names if key_interval(k, _HOT_RANGE_OF) == 0] or names[:1]
    keys: list[str] = []
    sequences: list[int] = []
    seen: dict[str, int] = {}
    for index in range(workload.records):
        draw = mmh3.hash(index.to_bytes(8, "little"), workload.seed ^ _SKEW_SALT, signed=False)
        pool = hot if (draw & 0xFFFF) < workload.hot_share * 0x10000 else names
        key = pool[(draw >> 16) % len(pool)]
        keys.append(key)
        sequences.append(seen.get(key, 0))
        seen[key] = sequences[-1] + 1
    return keys, sequences


@dataclass(frozen=True, slots=True)
class ProvingNames:
    """The streams, computations and keyspace of one proving-ground run."""

    run: str

    @property
    def topology(self) -> str:
        return f"proving_{self.run}"

    @property
    def keyspace(self) -> str:
        return f"proving_{self.run}"

    @property
    def injector(self) -> str:
        return f"proving_{self.run}_injector"

    def stream(self, name: str) -> str:
        return f"proving_{self.run}.{name}"

    @property
    def events(self) -> str:
        return self.stream("events")

    @property
    def windows(self) -> str:
        return self.stream("windows")

    @property
    def rollups(self) -> str:
        return self.stream("rollups")

    def dead_letters(self, computation: str) -> str:
        return self.stream(f"{computation}.dead-letters")

    @property
    def injector_dead_letters(self) -> str:
        return self.stream("injector.dead-letters")

    def outputs(self) -> list[str]:
        """The streams the computations produce into: their outputs and dead letters."""
        return [
            self.windows,
            self.rollups,
            self.dead_letters("tally"),
            self.dead_letters("rollup"),
        ]

    def transactional_outputs(self) -> list[str]:
        """The outputs of the computation whose productions go in Kafka transactions
        (``tally``: exactly-once, strong productions), which a plain ``read_committed``
        reader must read once each; ``rollup`` (no exactly-once, weak productions) re-sends
        on a rerun by design."""
        return [self.windows, self.dead_letters("tally")]

    def streams(self) -> list[str]:
        return [
            self.events,
            self.windows,
            self.rollups,
            self.dead_letters("tally"),
            self.dead_letters("rollup"),
            self.injector_dead_letters,
        ]


class ProvingSource(Source):
    """The workload's records, paced at ``workload.rate`` per second; position: the next
    index. Exhausted after the last record (the injector then reports the end of time).

    With a ``gate`` file, the source sends no record beyond the index the file holds (the
    proving ground lets input through as its faults proceed) and writes where it stands to
    ``<gate>.position``."""

    def __init__(self, workload: Workload, stream: str, gate: Path | None = None) -> None:
        self.workload = workload
        self.streams = (stream,)
        self._stream = stream
        self._gate = gate
        self._next = 0
        self._last_poll = 0.0

    def _allowed(self) -> int:
        if self._gate is None:
            return self.workload.records
        try:
            return min(self.workload.records, int(self._gate.read_text()))
        except (FileNotFoundError, ValueError):
            return 0

    def open(self, position: Position | None) -> None:
        self._next = int(position["next"]) if position else 0
        self._last_poll = time.monotonic()

    def poll(self, timeout: float) -> Poll:
        workload = self.workload
        if self._next >= workload.records:
            return Poll(exhausted=True, watermark=workload.timestamp(workload.records))
        # Pacing by this process's monotonic clock: records, not event time, are what the
        # rate governs, and event time stays a pure function of the index.
        due = max(timeout, 0.05)
        time.sleep(max(0.0, self._last_poll + due - time.monotonic()))
        now = time.monotonic()
        count = max(1, round(workload.rate * (now - self._last_poll)))
        self._last_poll = now
        first, self._next = self._next, max(self._next, min(self._allowed(), self._next + count))
        if self._gate is not None:
            written = self._gate.with_suffix(".position.tmp")
            written.write_text(str(self._next))
            written.replace(self._gate.with_suffix(".position"))
        records = [
            SourceRecord(
                self._stream,
                workload.key(i),
                workload.value(i),
                workload.timestamp(i),
                "proving",
                i,
            )
            for i in range(first, self._next)
        ]
        return Poll(
            records=records,
            position={"next": self._next},
            watermark=workload.timestamp(self._next),
        )


def _bitmap_set(bitmap: bytearray, bit: int) -> bool:
    """Set ``bit``; whether it was set already."""
    byte, mask = bit // 8, 1 << (bit % 8)
    if byte >= len(bitmap):
        bitmap.extend(bytes(byte + 1 - len(bitmap)))
    seen = bool(bitmap[byte] & mask)
    bitmap[byte] |= mask
    return seen


def bitmap_members(hex_bitmap: str) -> list[int]:
    """The bits set in a hex bitmap of :class:`Tally`'s state."""
    data = bytes.fromhex(hex_bitmap)
    return [n * 8 + b for n, byte in enumerate(data) for b in range(8) if byte & (1 << b)]


class Tally(Computation):
    """Per user key: which sequence numbers it saw, per-window counts, fired windows."""

    def __init__(self, window: int, windows_stream: str) -> None:
        self.window = window
        self.windows_stream = windows_stream

    def process_record(self, ctx: Context, record: Record) -> None:
        seq = int(json.loads(record.value)["seq"])  # malformed input raises: a dead letter
        state = ctx.state(_STATE)
        doc = state.get(None) or {"seen": "", "dups": 0, "open": {}, "fired": []}
        bitmap = bytearray.fromhex(doc["seen"])
        if _bitmap_set(bitmap, seq):
            doc["dups"] += 1
        doc["seen"] = bitmap.hex()
        window = (record.timestamp - EPOCH) // self.window
        doc["open"][str(window)] = doc["open"].get(str(window), 0) + 1
        state.set(doc)
        ctx.set_timer(f"w{window}", EPOCH + (window + 1) * self.window)

    def process_timer(self, ctx: Context, timer: Timer) -> None:
        state = ctx.state(_STATE)
        doc = state.get(None) or {"seen": "", "dups": 0, "open": {}, "fired": []}
        window = int(timer.tag[1:])
        count = doc["open"].pop(str(window), 0)
        doc["fired"].append(window)
        state.set(doc)
        ctx.produce(
            self.windows_stream,
            json.dumps({"key": ctx.key, "window": window, "count": count}).encode(),
            timer.timestamp - 1,
            key=f"w{window}",
        )


class Rollup(Computation):
    """Per window: each key's count, set (not added), so redelivery changes nothing."""

    def __init__(self, rollups_stream: str) -> None:
        self.rollups_stream = rollups_stream

    def process_record(self, ctx: Context, record: Record) -> None:
        document = json.loads(record.value)
        state = ctx.state(_STATE)
        doc = state.get(None) or {"counts": {}, "conflicts": 0}
        key, count = str(document["key"]), int(document["count"])
        known = doc["counts"].get(key)
        if known is not None and known != count:
            doc["conflicts"] += 1
        doc["counts"][key] = count
        state.set(doc)
        ctx.produce(self.rollups_stream, record.value, record.timestamp, key=key)


def rebalance_policy(workload: Workload) -> RebalancePolicy:
    """How ``tally``'s intervals split and merge in a run with the ``split`` fault: often,
    as input comes in steps (split as a step arrives, merge while the gate is shut)."""
    return RebalancePolicy(
        split_records=max(10, int(workload.rate / 8)),
        merge_records=max(2, int(workload.rate / 32)),
        max_intervals=8,
        min_intervals=2,
    )


def proving_topology(
    names: ProvingNames,
    workload: Workload,
    key_intervals: int = 4,
    rebalance: RebalancePolicy | None = None,
) -> Topology:
    """``tally`` and ``rollup`` over ``names``' streams; see the module docstring.
    ``rebalance``: ``tally``'s intervals split and merge by it."""
    topology = Topology(names.topology, streams=[names.events])
    topology.add_computation(
        "tally",
        Tally(workload.window, names.windows),
        inputs=[names.events],
        outputs=[names.windows],
        options=ComputationOptions(
            key_intervals=key_intervals,
            dead_letter_stream=names.dead_letters("tally"),
            rebalance=rebalance,
        ),
    )
    topology.add_computation(
        "rollup",
        Rollup(names.rollups),
        inputs=[names.windows],
        outputs=[names.rollups],
        options=ComputationOptions(
            key_intervals=key_intervals,
            exactly_once=False,
            strong_productions=False,
            dead_letter_stream=names.dead_letters("rollup"),
        ),
    )
    return topology


@dataclass
class ExpectedOutcome:
    """What an exact run leaves: per key its sequence numbers and per-window counts, the
    malformed records' indexes, and per window each key's count."""

    sequences: dict[str, set[int]] = field(default_factory=dict)
    windows: dict[str, dict[int, int]] = field(default_factory=dict)
    malformed: set[int] = field(default_factory=set)
    # Well-formed records the engine was made to fail on (the poison fault): dead letters.
    poisoned: set[int] = field(default_factory=set)
    # Tombstones (null values) sent among the input by the poison fault: dead letters.
    tombstones: int = 0

    def rollups(self) -> dict[str, dict[str, int]]:
        found: dict[str, dict[str, int]] = {}
        for key, counts in self.windows.items():
            for window, count in counts.items():
                found.setdefault(f"w{window}", {})[key] = count
        return found

    def window_records(self) -> Iterator[tuple[str, int, int]]:
        for key, counts in sorted(self.windows.items()):
            for window, count in sorted(counts.items()):
                yield key, window, count


def expected_outcome(
    workload: Workload, poisoned: Iterable[int] = (), tombstones: int = 0
) -> ExpectedOutcome:
    """The fold of the workload's distinct input, as an exact run leaves it; the records at
    ``poisoned`` made the engine fail and ``tombstones`` null messages went out among the
    input (the poison fault), all of them dead letters."""
    outcome = ExpectedOutcome(poisoned=set(poisoned), tombstones=tombstones)
    for index in range(workload.records):
        key = workload.key(index)
        if workload.malformed(index):
            outcome.malformed.add(index)
            continue
        if index in outcome.poisoned:
            continue
        outcome.sequences.setdefault(key, set()).add(workload.sequence(index))
        window = workload.window_of(workload.timestamp(index))
        counts = outcome.windows.setdefault(key, {})
        counts[window] = counts.get(window, 0) + 1
    return outcome
