"""What the live view shows, built from what the services hold: the topology's graph, each
source's watermark lag and health, what holds a stuck computation, the streams and their
consumers' lag, the headline numbers and a timeline of what changed.

Everything here is pure: an :class:`Observation` (one reading of the watermark topic and of
the streams' end offsets, at a wall-clock time) goes in, a JSON-able snapshot comes out.
:class:`Tracker` keeps what a single observation cannot tell: rates (two observations), lag
trends, how long a watermark has not moved, and the events between observations.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any, Literal

from millstream.engine.watermarks import (
    SourceStatus,
    WatermarkMessage,
    WatermarkReport,
    parse_injector_source,
    watermark_overview,
)
from millstream.engine.watermarks.report import Offsets

__all__ = [
    "COUNTED_EVENTS",
    "DEAD_LETTER_SUFFIX",
    "RATES",
    "Health",
    "Observation",
    "Tracker",
    "holding_path",
    "node_id",
]

DEAD_LETTER_SUFFIX = ".dead-letters"
"""How a computation's dead-letter stream is named unless it names one itself."""

Health = Literal["ok", "stalled", "complete", "waiting"]
"""A source at a glance: its watermark moves (or nothing is waiting for it); it has not moved
for a while although input waits; its input ended; it has reported no time yet."""

_MICROS = 1_000_000


@dataclass(frozen=True, slots=True)
class Observation:
    """One reading of the services at wall-clock time ``now`` (µs since the epoch).

    ``messages`` is the watermark topic's latest message per key; ``ends`` the end offset of
    every partition of every stream topic. ``error`` says why the reading is partial (a
    service did not answer): what it could not read is then what the previous one read.
    """

    now: int
    messages: Mapping[str, WatermarkMessage]
    ends: Offsets
    error: str | None = None


def node_id(kind: str, name: str) -> str:
    """The graph's id of a stream (``stream/NAME``); sources keep their report names
    (``computation/TOPOLOGY/NAME``, ``injector/NAME``)."""
    return f"{kind}/{name}"


class _Rate:
    """A count's rate over the last ``window`` µs of samples (the oldest sample at or before
    the window's start is the base): a count that moves once a batch, as a computation's
    consumed offsets do, still shows its rate between batches."""

    __slots__ = ("_samples", "window")

    def __init__(self, window: int) -> None:
        self.window = window
        self._samples: deque[tuple[int, int]] = deque()

    def add(self, now: int, count: int) -> float | None:
        """Record ``count`` at ``now``; the rate per second, ``None`` until two samples."""
        samples = self._samples
        if samples and count < samples[-1][1]:
            samples.clear()  # the count started again (a topic recreated)
        samples.append((now, count))
        while len(samples) > 2 and samples[1][0] <= now - self.window:
            samples.popleft()
        start, base = samples[0]
        if now <= start:
            return None
        return (count - base) * _MICROS / (now - start)


class _Arrivals:
    """When this view first saw a partition's end offset pass each value (its last ``size``
    changes): how long the oldest record a consumer has not read has waited."""

    __slots__ = ("_seen",)

    def __init__(self, size: int) -> None:
        self._seen: deque[tuple[int, int]] = deque(maxlen=size)  # (first seen at, end)

    def add(self, now: int, end: int) -> None:
        if self._seen and end < self._seen[-1][1]:
            self._seen.clear()  # the topic was made again
        if not self._seen or end > self._seen[-1][1]:
            self._seen.append((now, end))

    def waited(self, consumed: int, now: int) -> tuple[int, bool] | None:
        """How long (µs) the record at offset ``consumed`` has been there, and whether that
        is a lower bound (it was there at the first change this view kept); ``None`` if it
        is not there yet (nothing waits)."""
        for index, (seen, end) in enumerate(self._seen):
            if end > consumed:
                return now - seen, index == 0
        return None


@dataclass(slots=True)
class _History:
    """What the tracker remembers of one source between observations."""

    watermark: int | None = None
    moved_at: int = 0  # when the watermark last changed (µs)
    lags: deque[float] = field(default_factory=lambda: deque(maxlen=60))
    waiting_since: int | None = None  # since when its input has held unconsumed records
    state: str = ""
    driver: str = ""  # the driver start that reported last
    stats: Mapping[str, int] = field(default_factory=dict)  # its counters then
    # Of the records it consumed, and of its counters in RATES.
    rates: dict[str, _Rate] = field(default_factory=dict)

    def rate(self, name: str, window: int) -> _Rate:
        rate = self.rates.get(name)
        if rate is None:
            rate = self.rates[name] = _Rate(window)
        return rate


class Tracker:
    """Snapshots from successive observations (see the module docstring).

    Rates are over the last ``rate_window`` µs. ``stall_after`` (µs): a source whose
    watermark has not moved for that long while its input held records it had not consumed,
    all that time, is ``stalled``. ``trend`` lag samples are kept per source, and ``events``
    timeline entries in all: memory stays bounded however long the view runs.

    ``topologies`` (shell-style patterns, such as ``zeitgeist_*``) narrows the view to the
    computations of the topologies they match, the streams they read and write, and the
    injectors writing those; empty, it shows everything the watermark topic holds.
    """

    def __init__(
        self,
        *,
        stall_after: int = 30 * _MICROS,
        rate_window: int = 30 * _MICROS,
        trend: int = 60,
        events: int = 200,
        topologies: Sequence[str] = (),
    ) -> None:
        self.topologies = tuple(topologies)
        self.stall_after = stall_after
        self.rate_window = rate_window
        self._stream_rates: dict[str, _Rate] = {}
        self._arrivals: dict[tuple[str, int], _Arrivals] = {}
        self.trend = trend
        self._sources: dict[str, _History] = {}
        self._previous_error: str | None = None  # the last observation's
        self._events: deque[dict[str, Any]] = deque(maxlen=events)

    def update(self, observation: Observation) -> dict[str, Any]:
        """The snapshot of ``observation``, with rates over the ones before it."""
        now = observation.now
        reports = {
            key: m for key, m in observation.messages.items() if isinstance(m, WatermarkReport)
        }
        for topic, ends in observation.ends.items():
            for partition, end in ends.items():
                self._arrivals.setdefault((topic, partition), _Arrivals(600)).add(now, end)
        rows = watermark_overview(observation.messages.items(), now)
        computations = [r for r in rows if r.source.startswith("computation/")]
        injectors = _injectors(rows)
        shown = set(observation.ends)
        if self.topologies:
            computations = [
                r
                for r in computations
                if any(fnmatchcase(r.source.split("/", 2)[1], p) for p in self.topologies)
            ]
            shown = {s for r in computations for s in r.streams} | {
                t for r in computations for t in _inputs(reports.get(r.source))
            }
            injectors = {name: i for name, i in injectors.items() if set(i["streams"]) & shown}
        stream_names = sorted(
            shown
            | {s for r in computations for s in r.streams}
            | {s for i in injectors.values() for s in i["streams"]}
            | {t for r in computations for t in _inputs(reports.get(r.source))}
        )
        writers: dict[str, list[str]] = {s: [] for s in stream_names}
        for row in computations:
            for stream in row.streams:
                writers[stream].append(row.source)
        for injector in injectors.values():
            for stream in injector["streams"]:
                writers[stream].append(injector["id"])
        readers: dict[str, list[str]] = {s: [] for s in stream_names}
        for row in computations:
            for topic in _inputs(reports.get(row.source)):
                readers[topic].append(row.source)

        nodes: list[dict[str, Any]] = []
        edges: list[dict[str, str]] = []
        consumers: dict[str, list[dict[str, Any]]] = {s: [] for s in stream_names}
        for row in computations:
            report = reports.get(row.source)
            node, unreads = self._computation(row, report, observation)
            nodes.append(node)
            for topic in _inputs(report):
                edges.append({"from": node_id("stream", topic), "to": row.source})
                unread = unreads[topic]
                consumers[topic].append(
                    {
                        "computation": row.source,
                        "lag": sum(unread.values()),
                        "partitions": {str(p): n for p, n in sorted(unread.items())},
                        "lag_s": node["lag_s"],
                        "trend": node["lag_trend"],
                    }
                )
            edges.extend({"from": row.source, "to": node_id("stream", s)} for s in row.streams)
        for injector in injectors.values():
            self._injector(injector, now)
            nodes.append(injector)
            edges.extend(
                {"from": injector["id"], "to": node_id("stream", s)} for s in injector["streams"]
            )
        streams: list[dict[str, Any]] = []
        for name in stream_names:
            ends = observation.ends.get(name, {})
            rate = self._stream_rates.setdefault(name, _Rate(self.rate_window)).add(
                now, sum(ends.values())
            )
            entry: dict[str, Any] = {
                "id": node_id("stream", name),
                "kind": "stream",
                "name": name,
                "dead_letters": name.endswith(DEAD_LETTER_SUFFIX),
                "partitions": {str(p): end for p, end in sorted(ends.items())},
                "records": sum(ends.values()),
                "rate": rate,
                "writers": writers[name],
                "consumers": consumers[name],
            }
            streams.append(entry)
            if writers[name] or consumers[name]:
                # The graph shows the streams of the topologies, not every topic of Kafka.
                nodes.append({**entry, "health": "ok"})
        by_id = {n["id"]: n for n in nodes}
        reads = _reads(nodes, edges)
        # What holds each computation's watermark; the page marks the stalled ones' paths.
        held = {
            c["id"]: holding_path(c["id"], by_id, writers, readers_of=reads)
            for c in nodes
            if c["kind"] == "computation" and c["state"] != "complete"
        }
        self._timeline(observation, nodes)
        rates = {s["name"]: s["rate"] for s in streams}
        for node in nodes:
            if node["kind"] == "computation":
                # Records per second out: what its output streams grow by (shared streams
                # count for each writer).
                out = [rates.get(name) for name in node["streams"]]
                known = [r for r in out if r is not None]
                node["out_rate"] = sum(known) if known else None
        for gone in self._stream_rates.keys() - set(stream_names):
            del self._stream_rates[gone]
        for place in [p for p in self._arrivals if p[0] not in observation.ends]:
            del self._arrivals[place]
        self._previous_error = observation.error
        return {
            "now": now,
            "error": observation.error,
            "headline": _headline(now, nodes, streams, readers),
            "nodes": nodes,
            "edges": edges,
            "streams": streams,
            "held": held,
            "events": list(self._events),
        }

    # -- sources ---------------------------------------------------------------------------

    def _computation(
        self,
        row: SourceStatus,
        report: WatermarkReport | None,
        observation: Observation,
    ) -> tuple[dict[str, Any], dict[str, dict[int, int]]]:
        """A computation's node, and per input topic and partition the records it has not
        consumed yet (its consumers' entries in the streams)."""
        history = self._remember(row.source, row.watermark, row.lag, observation.now)
        consumed = report.consumed if report is not None else {}
        in_rate = history.rate("consumed", self.rate_window).add(
            observation.now, sum(sum(p.values()) for p in consumed.values())
        )
        # Per input topic and partition, the records written and not yet consumed.
        unread = {
            topic: {
                p: max(0, end - consumed[topic].get(p, 0))
                for p, end in observation.ends.get(topic, {}).items()
            }
            for topic in consumed
        }
        backlog = sum(n for partitions in unread.values() for n in partitions.values())
        waits = [
            waited
            for topic in consumed
            for partition in unread[topic]
            if (arrivals := self._arrivals.get((topic, partition))) is not None
            and (waited := arrivals.waited(consumed[topic].get(partition, 0), observation.now))
            is not None
        ]
        longest = max(waits, default=None)
        # The input partition furthest behind: where a watermark held by its input waits.
        behind = max(
            ((n, topic, p) for topic, partitions in unread.items() for p, n in partitions.items()),
            default=None,
        )
        _, topology, name = row.source.split("/", 2)
        node = {
            # How long the oldest record it has not read has waited (the view's own clock:
            # since it first saw it, so "at least" when it was there before).
            "waiting_s": None if longest is None else _seconds(longest[0]),
            "waiting_at_least": bool(longest and longest[1]),
            "behind": None
            if behind is None or behind[0] <= 0
            else {"stream": behind[1], "partition": behind[2], "records": behind[0]},
            "id": row.source,
            "kind": "computation",
            "name": name,
            "topology": topology,
            "state": row.state,
            "watermark": row.watermark,
            "input_watermark": row.input_watermark,
            "lag_s": _seconds(row.lag),
            "input_lag_s": None
            if row.input_watermark is None or row.lag is None
            else _seconds(max(0, observation.now - row.input_watermark)),
            "lag_trend": list(history.lags),
            "held_by": row.held_by,
            "streams": list(row.streams),
            "hot": [list(h) for h in row.hot],
            # Intervals whose own pending work holds them below the input's watermark, with
            # their watermark lag (s); every other interval's is the input's.
            "intervals_behind": [
                [interval, _seconds(max(0, observation.now - watermark))]
                for interval, watermark in (report.behind if report else ())
            ],
            # The worker (host:pid) that ran each interval last: its owner.
            "owners": {
                str(interval): worker
                for worker, intervals in (report.workers if report else {}).items()
                for interval in intervals
            },
            "in_rate": in_rate,
            "backlog": backlog,
            "records": report.records if report else None,
            "health": self._health(row.state, history, backlog, observation.now),
            **self._counters(report, history, observation.now),
        }
        return node, unread

    def _counters(
        self, report: WatermarkReport | None, history: _History, now: int
    ) -> dict[str, Any]:
        """A computation's counters since its driver started, the rates of some, and the
        share of its interval runs that found a valid cached worker."""
        stats = dict(report.stats) if report is not None else {}
        rates = {}
        for name in RATES:
            if name in stats:
                rates[name] = history.rate(name, self.rate_window).add(now, stats[name])
        runs = stats.get("intervals", 0)
        return {
            "driver": report.driver if report is not None else "",
            "stats": stats,
            "rates": rates,
            "cache_hit_rate": stats.get("cache_hits", 0) / runs if runs else None,
        }

    def _injector(self, injector: dict[str, Any], now: int) -> None:
        processes = injector["processes"]
        processes.sort(key=lambda p: p["process"])
        states = {p["state"] for p in processes}
        watermarks = [p["watermark"] for p in processes]
        if states == {"complete"}:
            state, watermark = "complete", None
        elif "no report yet" in states or None in watermarks:
            state, watermark = "no report yet", None
        else:
            state, watermark = "reporting", min(w for w in watermarks if w is not None)
        lag = None if watermark is None or state != "reporting" else max(0, now - watermark)
        history = self._remember(injector["id"], watermark, lag, now)
        silent = [p["process"] for p in processes if p["state"] == "no report yet"]
        reporting = [p for p in processes if p["state"] == "reporting"]
        lowest = min(reporting, key=lambda p: p["watermark"]) if reporting else None
        if silent:
            held_by = f"process {silent[0]}: no report yet"
        elif lowest is not None:
            held_by = f"process {lowest['process']}"
        else:
            held_by = ""
        injector.update(
            state=state,
            watermark=watermark,
            lag_s=_seconds(lag),
            lag_trend=list(history.lags),
            held_by=held_by,
            health=self._health(state, history, 0, now),
        )

    def _remember(self, source: str, watermark: int | None, lag: int | None, now: int) -> _History:
        history = self._sources.get(source)
        if history is None:
            history = self._sources[source] = _History(moved_at=now, lags=deque(maxlen=self.trend))
        if watermark != history.watermark:
            history.watermark, history.moved_at = watermark, now
        if lag is not None:
            history.lags.append(round(lag / _MICROS, 3))
        return history

    def _health(self, state: str, history: _History, backlog: int, now: int) -> Health:
        if state == "complete":
            return "complete"
        if state == "no report yet":
            return "waiting"
        if backlog <= 0:
            history.waiting_since = None
            return "ok"
        if history.waiting_since is None:
            history.waiting_since = now
        # Stalled: input has waited, and the watermark stood still, for stall_after (records
        # that just arrived after a quiet spell are no stall).
        if now - max(history.moved_at, history.waiting_since) >= self.stall_after:
            return "stalled"
        return "ok"

    def _timeline(self, observation: Observation, nodes: Sequence[dict[str, Any]]) -> None:
        now = observation.now
        if observation.error != self._previous_error:
            text = observation.error or "the services answer again"
            self._events.append({"at": now, "kind": "service", "text": text})
        for node in nodes:
            if node["kind"] == "stream":
                continue
            history = self._sources[node["id"]]
            said = f"{node['state']}/{node['health']}"
            if said == history.state:
                continue
            # A source first seen says something only if it needs a look.
            if history.state or node["health"] in ("stalled", "waiting"):
                self._events.append(
                    {"at": now, "kind": node["health"], "source": node["id"], "text": _said(node)}
                )
            history.state = said
        for node in nodes:
            if node["kind"] == "computation":
                self._counted(node, now)
        for key in set(self._sources) - {n["id"] for n in nodes}:
            del self._sources[key]
            self._events.append({"at": now, "kind": "retired", "source": key, "text": "retired"})

    def _counted(self, node: Mapping[str, Any], now: int) -> None:
        """The timeline's entries a computation's counters tell: its driver restarted, and
        what went wrong since the last observation (fenced producers, failed attempts, ...)."""
        history = self._sources[node["id"]]
        stats, driver = node["stats"], node["driver"]
        if driver and history.driver and driver != history.driver:
            self._events.append(
                {"at": now, "kind": "restart", "source": node["id"], "text": "driver restarted"}
            )
        elif driver and driver == history.driver:
            for name, (kind, text) in COUNTED_EVENTS.items():
                more = stats.get(name, 0) - history.stats.get(name, 0)
                if more > 0:
                    self._events.append(
                        {"at": now, "kind": kind, "source": node["id"], "text": text(more)}
                    )
        if driver:
            history.driver, history.stats = driver, stats


RATES = ("processed", "committed_keys", "duplicates", "dead_letters", "late", "transactions")
"""The counters of a computation whose rates (per second) its node shows."""

COUNTED_EVENTS: Mapping[str, tuple[str, Callable[[int], str]]] = {
    "fenced_producers": (
        "fenced",
        lambda n: f"{_many(n, 'Kafka producer')} fenced: a zombie's transactions were refused",
    ),
    "failed_attempts": ("failed", lambda n: f"{_many(n, 'batch attempt')} failed (retried)"),
    "isolated": (
        "exception",
        lambda n: f"{_many(n, 'poison pill')} isolated: code failed on them alone (dead-lettered)",
    ),
    "dead_letters": ("dead-letters", lambda n: f"{_many(n, 'record')} dead-lettered"),
    "rebalances": ("rebalance", lambda n: f"key intervals split or merged ({n})"),
    "unknown_outcomes": (
        "unknown",
        lambda n: f"{_many(n, 'commit')} with an unknown outcome, read back and settled",
    ),
    "aborted_commits": (
        "aborted",
        lambda n: f"{_many(n, 'commit')} aborted with their transaction",
    ),
    "sequencer_conflicts": (
        "conflict",
        lambda n: f"{_many(n, 'sequencer conflict')}: another writer acquired an interval first",
    ),
}
"""The counters whose growth is an entry of the timeline: its kind and what it says."""


def _many(count: int, thing: str) -> str:
    """``count`` things, in words: "1 record", "2 records"."""
    return f"{count} {thing}{'' if count == 1 else 's'}"


def holding_path(
    start: str,
    nodes: Mapping[str, Mapping[str, Any]],
    writers: Mapping[str, Sequence[str]],
    *,
    readers_of: Mapping[str, Sequence[str]],
) -> list[str]:
    """The path from computation ``start`` to what holds its watermark, as node ids: through
    its input stream to the lowest-watermark source writing it, and on upstream while that
    source is held by its input, up to an injector, a key interval (``interval N``, the
    computation itself is the end) or a source that never reported.

    ``readers_of`` maps a computation to the streams it reads; ``writers`` a stream to the
    sources that write it. A cycle ends the path where it closes.
    """
    path = [start]
    current = start
    while True:
        node = nodes[current]
        if node["kind"] != "computation" or not str(node.get("held_by", "")).startswith("input"):
            return path
        lowest: tuple[int, str, str] | None = None
        for stream in readers_of.get(current, ()):
            for source in writers.get(stream, ()):
                if source not in nodes:
                    continue
                mark = nodes[source].get("watermark")
                state = nodes[source].get("state")
                rank = -1 if state == "no report yet" else (mark if mark is not None else -1)
                if state == "complete":
                    continue
                if lowest is None or rank < lowest[0]:
                    lowest = (rank, stream, source)
        if lowest is None or lowest[2] in path:
            return path
        _, stream, source = lowest
        path += [node_id("stream", stream), source]
        current = source


def _reads(
    nodes: Sequence[Mapping[str, Any]], edges: Sequence[Mapping[str, str]]
) -> dict[str, list[str]]:
    streams = {n["id"]: n["name"] for n in nodes if n["kind"] == "stream"}
    reads: dict[str, list[str]] = {}
    for edge in edges:
        if edge["from"] in streams:
            reads.setdefault(edge["to"], []).append(streams[edge["from"]])
    return reads


def _injectors(rows: Sequence[SourceStatus]) -> dict[str, dict[str, Any]]:
    """Each injector's node, its processes' rows gathered (health and watermark added later)."""
    injectors: dict[str, dict[str, Any]] = {}
    for row in rows:
        parsed = parse_injector_source(row.source)
        if parsed is None:
            continue
        name, process = parsed
        injector = injectors.setdefault(
            name,
            {
                "id": f"injector/{name}",
                "kind": "injector",
                "name": name,
                "streams": [],
                "processes": [],
            },
        )
        injector["streams"] = sorted(set(injector["streams"]) | set(row.streams))
        injector["processes"].append(
            {
                "process": process,
                "state": row.state,
                "watermark": row.watermark,
                "lag_s": _seconds(row.lag),
            }
        )
    return injectors


def _headline(
    now: int,
    nodes: Sequence[Mapping[str, Any]],
    streams: Sequence[Mapping[str, Any]],
    readers: Mapping[str, Sequence[str]],
) -> dict[str, Any]:
    """Data freshness (now minus the lowest watermark of the computations whose outputs
    nothing reads), rates in and processed, Kafka lag and dead letters per minute."""
    computations = [n for n in nodes if n["kind"] == "computation"]
    read = {s for s, by in readers.items() if by}
    ends = [c for c in computations if not any(s in read for s in c["streams"])]
    live = [c["watermark"] for c in (ends or computations) if c["state"] == "reporting"]
    injected = {s for n in nodes if n["kind"] == "injector" for s in n["streams"]}
    rates = [s["rate"] for s in streams if s["name"] in injected]
    processed = [c["in_rate"] for c in computations if c["in_rate"] is not None]
    dead = [s["rate"] for s in streams if s["dead_letters"] and s["rate"] is not None]
    commits = [c["rates"].get("committed_keys") for c in computations]
    # Records behind their computation's input watermark, as its driver counts them.
    late = [r for c in computations if (r := c["rates"].get("late")) is not None]
    return {
        "freshness_s": _seconds(max(0, now - min(live))) if live else None,
        "input_rate": sum(r for r in rates if r is not None) if rates else None,
        "processed_rate": sum(processed) if processed else None,
        "kafka_lag": sum(c["backlog"] for c in computations),
        "system_latency_s": max(
            (c["waiting_s"] for c in computations if c["waiting_s"] is not None), default=None
        ),
        "committed_keys_per_second": sum(c for c in commits if c is not None)
        if any(c is not None for c in commits)
        else None,
        "dead_letters_per_min": sum(dead) * 60 if dead else None,
        "late_per_min": sum(late) * 60 if late else None,
        "computations": len(computations),
        "stalled": sum(1 for n in nodes if n.get("health") == "stalled"),
    }


def _inputs(report: WatermarkReport | None) -> list[str]:
    """The streams a computation reads: the topics its report says it consumed."""
    return [] if report is None else sorted(report.consumed)


def _seconds(micros: int | None) -> float | None:
    return None if micros is None else round(micros / _MICROS, 3)


def _said(node: Mapping[str, Any]) -> str:
    if node["health"] == "complete":
        return "input complete"
    if node["health"] == "waiting":
        return "has reported no watermark yet"
    if node["health"] == "stalled":
        return f"watermark has not moved; held by {node.get('held_by') or 'its input'}"
    return "watermark moving"
