"""The watermark topic's messages: a source's :class:`WatermarkReport`, an injector's
:class:`ExpectedSet`, their wire format (JSON, readable with any Kafka tool), and the names
sources report under."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from millstream.engine.errors import WatermarkReportError
from millstream.engine.records import MAX_EVENT_TIME, MIN_EVENT_TIME

__all__ = [
    "BEHIND",
    "REPORT_VERSION",
    "ExpectedSet",
    "Offsets",
    "WatermarkMessage",
    "WatermarkReport",
    "computation_source",
    "decode_watermark_message",
    "injector_group",
    "injector_source",
    "latest_expected_set",
    "parse_injector_source",
]

REPORT_VERSION = 1
BEHIND = 16
"""Intervals a report names in ``behind`` at most."""

Offsets = Mapping[str, Mapping[int, int]]
"""Kafka offsets by topic and partition; an offset is exclusive (the next one to write/read)."""


def computation_source(topology: str, computation: str) -> str:
    """The source name under which a computation of a topology reports."""
    return f"computation/{topology}/{computation}"


def injector_source(injector: str, process: str = "0") -> str:
    """The source name under which one process of an injector reports."""
    return f"injector/{injector}/{process}"


def parse_injector_source(source: str) -> tuple[str, str] | None:
    """The ``(injector, process)`` of an :func:`injector_source` name; ``None`` for another
    kind of source."""
    kind, _, rest = source.partition("/")
    injector, _, process = rest.partition("/")
    if kind != "injector" or not injector or not process or "/" in process:
        return None
    return injector, process


def injector_group(injector: str) -> str:
    """The key of an injector's :class:`ExpectedSet` on the watermark topic."""
    return f"injector/{injector}"


@dataclass(frozen=True, slots=True)
class WatermarkReport:
    """One source's promise about its future records on ``streams``; see the module docstring.

    ``sequence`` orders the reports of one source (a computation uses its batch id); older
    ones are ignored. ``input_watermark`` is a computation's own input low watermark, which
    restores it after a restart. ``held_by`` says what holds ``watermark`` back.

    Heuristic watermarks (paper 7.2), optional: ``percentiles`` maps a percentile (such as
    99.0) to the watermark that that share of the source's work has passed, stragglers set
    aside; ``records`` is how many records the source wrote (its weight against the other
    sources of a stream); ``timer_watermark`` is the percentile input watermark a computation
    fires its event-time timers under, when it opted in to one (restored after a restart).
    ``hot`` names a computation's busiest key intervals, as ``(interval, records)`` in its
    latest batches (for ``millstream watermarks``); ``behind`` the intervals whose pending work
    (a timer, a production not acknowledged) holds their own watermark below
    ``input_watermark``, as ``(interval, watermark)``, lowest first, the others' being
    ``input_watermark`` (for the live view; at most :data:`BEHIND` of them). ``consumed``
    is how far a computation had read its input topics (exclusive offsets) when it reported:
    its Kafka lag, for the live view (``millstream ui``); no consumer's watermark depends on
    it. So are ``stats``, a computation's counters since its driver started (records
    processed, duplicates, dead letters, commits, fenced producers, failed attempts, ...),
    and ``driver``, which names that driver's start (a new name: the driver restarted), and
    ``workers``, the intervals each worker (``host:pid``) ran last: their owners.
    """

    source: str
    streams: tuple[str, ...]
    watermark: int
    sequence: int
    offsets: Offsets = field(default_factory=dict)
    input_watermark: int | None = None
    held_by: str = ""
    percentiles: Mapping[float, int] = field(default_factory=dict)
    records: int | None = None
    timer_watermark: int | None = None
    hot: tuple[tuple[int, int], ...] = ()
    behind: tuple[tuple[int, int], ...] = ()
    consumed: Offsets = field(default_factory=dict)
    stats: Mapping[str, int] = field(default_factory=dict)
    driver: str = ""
    workers: Mapping[str, tuple[int, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.source:
            raise WatermarkReportError("a watermark report needs a source name")
        if not MIN_EVENT_TIME <= self.watermark <= MAX_EVENT_TIME:
            raise WatermarkReportError(
                f"watermark {self.watermark} of {self.source!r} is outside "
                f"[{MIN_EVENT_TIME}, {MAX_EVENT_TIME}] µs"
            )
        for percentile, watermark in self.percentiles.items():
            if not 0.0 < percentile < 100.0 or not MIN_EVENT_TIME <= watermark <= MAX_EVENT_TIME:
                raise WatermarkReportError(
                    f"percentile watermark {percentile}: {watermark} of {self.source!r} is "
                    f"outside (0, 100): [{MIN_EVENT_TIME}, {MAX_EVENT_TIME}] µs"
                )

    def encode(self) -> bytes:
        """The message value (JSON, so the topic can be read with any Kafka tool)."""
        document: dict[str, Any] = {
            "version": REPORT_VERSION,
            "source": self.source,
            "streams": list(self.streams),
            "watermark": self.watermark,
            "sequence": self.sequence,
            "offsets": _offsets_document(self.offsets),
            "held_by": self.held_by,
        }
        if self.input_watermark is not None:
            document["input_watermark"] = self.input_watermark
        if self.percentiles:
            document["percentiles"] = {f"{p:g}": v for p, v in sorted(self.percentiles.items())}
        if self.records is not None:
            document["records"] = self.records
        if self.timer_watermark is not None:
            document["timer_watermark"] = self.timer_watermark
        if self.hot:
            document["hot"] = [list(pair) for pair in self.hot]
        if self.behind:
            document["behind"] = [list(pair) for pair in self.behind]
        if self.consumed:
            document["consumed"] = _offsets_document(self.consumed)
        if self.stats:
            document["stats"] = dict(sorted(self.stats.items()))
        if self.driver:
            document["driver"] = self.driver
        if self.workers:
            document["workers"] = {w: list(i) for w, i in sorted(self.workers.items())}
        return json.dumps(document, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, value: bytes) -> WatermarkReport:
        """Parse a message value; raises :class:`WatermarkReportError` saying what is wrong."""
        try:
            document = json.loads(value)
            if document.get("version") != REPORT_VERSION:
                raise WatermarkReportError(
                    f"watermark report version {document.get('version')!r} is not "
                    f"{REPORT_VERSION}; upgrade millstream or fix the producer"
                )
            input_watermark = document.get("input_watermark")
            records = document.get("records")
            timer_watermark = document.get("timer_watermark")
            return cls(
                source=str(document["source"]),
                streams=_streams(document["streams"]),
                watermark=_int(document["watermark"]),
                sequence=_int(document["sequence"]),
                offsets=_offsets_of(document.get("offsets", {})),
                input_watermark=None if input_watermark is None else _int(input_watermark),
                held_by=str(document.get("held_by", "")),
                percentiles={
                    _percentile(float(p)): _int(v)
                    for p, v in document.get("percentiles", {}).items()
                },
                records=None if records is None else _int(records),
                timer_watermark=None if timer_watermark is None else _int(timer_watermark),
                hot=tuple((_int(i), _int(n)) for i, n in document.get("hot", [])),
                behind=tuple((_int(i), _int(w)) for i, w in document.get("behind", [])),
                consumed=_offsets_of(document.get("consumed", {})),
                stats={str(k): _int(v) for k, v in document.get("stats", {}).items()},
                driver=str(document.get("driver", "")),
                workers={
                    str(w): tuple(_int(i) for i in intervals)
                    for w, intervals in document.get("workers", {}).items()
                },
            )
        except WatermarkReportError:
            raise
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise WatermarkReportError(
                f"not a watermark report ({type(exc).__name__}: {exc}): {value[:200]!r}"
            ) from exc


def _offsets_document(offsets: Offsets) -> dict[str, dict[str, int]]:
    return {
        topic: {str(p): o for p, o in sorted(parts.items())}
        for topic, parts in sorted(offsets.items())
    }


def _offsets_of(document: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[int, int]]:
    return {
        str(topic): {int(p): _int(o) for p, o in parts.items()} for topic, parts in document.items()
    }


def _streams(value: Any) -> tuple[str, ...]:
    # A bare string would otherwise pass as the streams named by its letters.
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise TypeError(f"expected a list of stream names, got {value!r}")
    return tuple(value)


def _percentile(value: float) -> float:
    if not 0.0 < value < 100.0:
        raise ValueError(f"a percentile must be in (0, 100), got {value}")
    return value


def _int(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"expected an integer, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class ExpectedSet:
    """The processes one injector runs as, and the streams they write (paper 5.2).

    Each process in ``processes`` holds ``streams`` for every consumer until it reported, so
    a process that has not started yet or went silent cannot be overtaken by its siblings.
    ``retired`` processes were removed for good: their reports are ignored from then on.
    """

    injector: str
    streams: tuple[str, ...]
    processes: tuple[str, ...]
    retired: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.injector or "/" in self.injector:
            raise WatermarkReportError(
                f"injector name {self.injector!r} must be non-empty and contain no '/'"
            )
        if not self.processes and not self.retired:
            raise WatermarkReportError(f"injector {self.injector!r} names no process")
        for process in (*self.processes, *self.retired):
            if not process or "/" in process:
                raise WatermarkReportError(
                    f"process name {process!r} of injector {self.injector!r} must be "
                    "non-empty and contain no '/'"
                )
        if both := set(self.processes) & set(self.retired):
            raise WatermarkReportError(
                f"injector {self.injector!r}: processes {sorted(both)} are both expected and "
                "retired"
            )

    @property
    def key(self) -> str:
        return injector_group(self.injector)

    @property
    def sources(self) -> frozenset[str]:
        """The report sources of the expected processes."""
        return frozenset(injector_source(self.injector, p) for p in self.processes)

    @property
    def retired_sources(self) -> frozenset[str]:
        return frozenset(injector_source(self.injector, p) for p in self.retired)

    def retire(self, process: str) -> ExpectedSet:
        """This set without ``process``, which is remembered as retired."""
        if process not in self.processes:
            raise WatermarkReportError(
                f"process {process!r} is not expected of injector {self.injector!r} "
                f"(expected: {sorted(self.processes)}, retired: {sorted(self.retired)})"
            )
        return ExpectedSet(
            self.injector,
            self.streams,
            tuple(p for p in self.processes if p != process),
            tuple(sorted({*self.retired, process})),
        )

    def encode(self) -> bytes:
        document = {
            "version": REPORT_VERSION,
            "kind": "expected",
            "injector": self.injector,
            "streams": list(self.streams),
            "processes": list(self.processes),
            "retired": list(self.retired),
        }
        return json.dumps(document, separators=(",", ":")).encode()


WatermarkMessage = WatermarkReport | ExpectedSet
"""What the watermark topic carries: reports, and injectors' expected sets."""


def decode_watermark_message(value: bytes) -> WatermarkMessage:
    """Parse a watermark topic value; raises :class:`WatermarkReportError` if it is neither."""
    try:
        document = json.loads(value)
        kind = document.get("kind", "report")
    except (ValueError, TypeError, AttributeError) as exc:
        raise WatermarkReportError(
            f"not a watermark message ({type(exc).__name__}: {exc}): {value[:200]!r}"
        ) from exc
    if kind == "report":
        return WatermarkReport.decode(value)
    if kind != "expected":
        raise WatermarkReportError(f"unknown watermark message kind {kind!r}: {value[:200]!r}")
    try:
        if document.get("version") != REPORT_VERSION:
            raise WatermarkReportError(
                f"expected-set version {document.get('version')!r} is not {REPORT_VERSION}; "
                "upgrade millstream or fix the producer"
            )
        return ExpectedSet(
            injector=str(document["injector"]),
            streams=_streams(document["streams"]),
            processes=_streams(document["processes"]),
            retired=_streams(document.get("retired", [])),
        )
    except WatermarkReportError:
        raise
    except (ValueError, TypeError, KeyError) as exc:
        raise WatermarkReportError(
            f"not an expected set ({type(exc).__name__}: {exc}): {value[:200]!r}"
        ) from exc


def latest_expected_set(
    messages: Iterable[tuple[str, WatermarkMessage | None]], injector: str
) -> ExpectedSet | None:
    """``injector``'s expected set as of the last of ``messages`` (topic order), if any."""
    found: ExpectedSet | None = None
    for key, message in messages:
        if key == injector_group(injector):
            found = message if isinstance(message, ExpectedSet) else None
    return found
