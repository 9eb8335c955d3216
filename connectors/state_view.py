"""Looking at one key's hard state from a shell: ``millstream state COMPUTATION KEY``.

When a key misbehaves (a window that never closes, a count that looks wrong), the operator
wants what the store holds for it, not what a worker caches: its state bytes, its timers and
the sequencer of its interval, read from Cassandra at ``QUORUM`` through the interval store's
own reads (so the table layout is known in one place), plus the interval's pending
productions. A production does not record which key made it (one row holds a whole commit
batch), so these are the whole interval's: records committed but not yet acknowledged by
Kafka, which is also what holds the computation's low watermark back.

Which interval holds the key: with the computation's number of key intervals (``--intervals``,
or taken from its topology), the one :func:`~millstream.engine.keys.key_interval` names;
without it, every interval of the computation in the table is read for the key (see
:meth:`~millstream.engine.stores.cassandra.CassandraIntervalStore.intervals`).

State is opaque bytes (paper 4.4), one value per key; the codec that wrote it lives in user
code (``ctx.state(codec)``) and is declared nowhere, so :func:`decode_state` guesses safely
unless told: Avro single-object encoding whose writer schema is registered (the shipped ones,
and those a topology module registers when ``--topology`` imports it), then UTF-8 JSON, then
printable UTF-8 text, then hex; and it always says which one it used. ``IntCodec`` values (8 raw
bytes) cannot be told from other bytes: ask for ``int``.

Reading never writes: the store's reads take the partition from a lease and check no token,
so the view passes one holding the sequencer it read, and acquires nothing.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import Any, Final, Literal, TextIO, get_args

from millstream.connectors import cassandra as cassandra_connector
from millstream.connectors.streams import ValueFormat, event_time_iso, render_record, render_value
from millstream.engine.clock import SystemClock
from millstream.engine.codecs import IntCodec
from millstream.engine.config import MillstreamConfig
from millstream.engine.errors import ConfigError, MillstreamError, RecordDecodeError
from millstream.engine.keys import MAX_KEY_INTERVALS, key_interval
from millstream.engine.productions import Production
from millstream.engine.records import (
    SINGLE_OBJECT_MARKER,
    decode_single_object,
    default_registry,
)
from millstream.engine.sequencer import INITIAL_SEQUENCER, Lease
from millstream.engine.store import IntervalStore, KeySnapshot
from millstream.engine.stores.cassandra import (
    DEFAULT_KEYSPACE,
    DEFAULT_TABLE,
    CassandraIntervalStore,
)
from millstream.engine.timers import Timer, firing_order
from millstream.engine.topology import Topology

__all__ = [
    "STATE_CODECS",
    "KeyView",
    "StateCodec",
    "decode_state",
    "key_intervals_of",
    "read_view",
    "show_state",
    "view_document",
    "view_text",
]

StateCodec = Literal["auto", "json", "int", "text", "hex"]
"""How :func:`decode_state` reads state bytes: guessed (``auto``), or as one codec writes them."""

STATE_CODECS: Final[tuple[StateCodec, ...]] = get_args(StateCodec)
# The CRC-64-AVRO fingerprint after the single-object marker (millstream.engine.records).
_FINGERPRINT_BYTES = 8
_INT_BYTES = 8


@dataclass(frozen=True, slots=True)
class KeyView:
    """What the store holds for ``key`` of ``computation``, as read at one moment.

    ``intervals`` is the computation's number of key intervals if it was known (``None``:
    the interval was found by reading every one). ``sequencer`` is the interval's, ``None`` if
    no worker ever acquired it. ``timers`` are in firing order; ``productions`` are the
    interval's pending ones, of any key, oldest event time first.
    """

    computation: str
    key: str
    interval: int
    intervals: int | None
    sequencer: int | None
    state: bytes | None
    timers: tuple[Timer, ...]
    productions: tuple[Production, ...]

    @property
    def is_empty(self) -> bool:
        """Whether the key has neither state nor timers (what the exit code tells)."""
        return self.state is None and not self.timers


def read_view(
    store: IntervalStore,
    computation: str,
    interval: int,
    key: str,
    *,
    sequencer: int | None,
    intervals: int | None = None,
) -> KeyView:
    """The key's state and timers and the interval's pending productions, through the store
    contract's reads (so any backend serves; nothing is written or acquired)."""
    lease = _lease(computation, interval, sequencer)
    snapshot = store.read_keys(lease, [key])[key]
    return KeyView(
        computation=computation,
        key=key,
        interval=interval,
        intervals=intervals,
        sequencer=sequencer,
        state=snapshot.state,
        timers=tuple(sorted(snapshot.timers.values(), key=firing_order)),
        productions=tuple(
            sorted(store.pending_productions(lease), key=lambda p: p.record.timestamp)
        ),
    )


def decode_state(data: bytes, codec: StateCodec = "auto") -> dict[str, Any]:
    """``{"state": ..., "state_encoding": ...}``: ``data`` decoded, and how.

    ``auto`` tries Avro single-object encoding with a registered writer schema (encoding
    ``"avro <schema name>"``), then JSON, printable UTF-8 text and hex, much as ``millstream
    tail --value json`` does. A named codec decodes with it, or falls back as ``tail`` does
    (to text or hex) where ``data`` is not in it; the encoding names what was shown, never
    what was asked for.
    """
    if codec == "auto":
        avro = _avro(data)
        if avro is not None:
            return avro
    if codec == "int":
        if len(data) == _INT_BYTES:
            return {"state": IntCodec().decode(data), "state_encoding": "int"}
        return {"state": data.hex(), "state_encoding": "hex"}
    shown_as = "json" if codec == "auto" else codec
    shown = render_value(data, shown_as, "state")
    if (
        codec == "auto"
        and shown.get("state_encoding") == "text"
        and not shown["state"].isprintable()
    ):
        # UTF-8, but not text a person wrote: an IntCodec count is mostly NUL bytes.
        return {"state": data.hex(), "state_encoding": "hex"}
    shown.setdefault("state_encoding", shown_as)
    return shown


def key_intervals_of(topology: Topology, computation: str) -> int:
    """The key intervals ``computation`` of ``topology`` starts with where no Spark job ran
    it (:meth:`~millstream.engine.topology.ComputationOptions.starting_intervals`): the
    number for a store no driver stored a layout in yet."""
    spec = topology.computations.get(computation)
    if spec is None:
        names = ", ".join(sorted(topology.computations)) or "none"
        raise ConfigError(
            f"topology {topology.name!r} has no computation {computation!r} (it has: {names})"
        )
    return spec.options.starting_intervals()


def view_document(
    view: KeyView, *, codec: StateCodec = "auto", value_format: ValueFormat = "text"
) -> dict[str, Any]:
    """The JSON object ``millstream state --json`` prints for ``view``.

    ``state`` is ``null`` (and ``state_encoding`` absent) for a key without state; timers
    carry ``tag``, ``domain``, ``timestamp`` (µs), ``time`` (ISO 8601) and ``set_by`` (the
    hex cause ID of the call that set them); pending productions are rendered as
    ``millstream tail`` renders records, with ``value_format``.
    """
    state = {"state": None} if view.state is None else decode_state(view.state, codec)
    return {
        "computation": view.computation,
        "key": view.key,
        "interval": view.interval,
        "intervals": view.intervals,
        "sequencer": view.sequencer,
        **state,
        "timers": [
            {
                "tag": timer.tag,
                "domain": timer.domain.value,
                "timestamp": timer.timestamp,
                "time": event_time_iso(timer.timestamp),
                "set_by": timer.set_by.hex(),
            }
            for timer in view.timers
        ],
        "pending_productions": [
            {"stream": p.stream} | render_record(p.stream, p.record, value_format)
            for p in view.productions
        ],
    }


def view_text(
    view: KeyView, *, codec: StateCodec = "auto", value_format: ValueFormat = "text"
) -> str:
    """What ``millstream state`` prints for ``view``: the fields of :func:`view_document`,
    one line each."""
    document = view_document(view, codec=codec, value_format=value_format)
    of = "" if view.intervals is None else f" of {view.intervals}"
    never = "never acquired" if view.sequencer is None else str(view.sequencer)
    lines = [
        f"computation {view.computation!r}, key {view.key!r}",
        f"interval {view.interval}{of}, sequencer {never}",
    ]
    if view.state is None:
        lines.append("state: none")
    else:
        shown = _shown(document["state"])
        encoding = document["state_encoding"]
        lines.append(f"state ({encoding}, {len(view.state)} bytes): {shown}")
        if encoding == "hex" and len(view.state) == _INT_BYTES and codec == "auto":
            lines.append("  (8 bytes: --codec int shows an IntCodec value)")
    lines.append(f"timers: {len(view.timers)}")
    for timer in document["timers"]:
        lines.append(
            f"  {timer['tag']!r} {timer['domain']} at {timer['timestamp']} ({timer['time']})"
        )
    lines.append(
        f"pending productions of interval {view.interval} (any key): {len(view.productions)}"
    )
    for entry in document["pending_productions"]:
        lines.append(
            f"  to {entry['stream']!r} key {entry['key']!r} at {entry['timestamp']} "
            f"({entry['time']}) id {entry['record_id']}: {_production_value(entry)}"
        )
    return "\n".join(lines)


def show_state(
    config: MillstreamConfig,
    computation: str,
    key: str,
    *,
    keyspace: str = DEFAULT_KEYSPACE,
    table: str = DEFAULT_TABLE,
    intervals: int | None = None,
    codec: StateCodec = "auto",
    value_format: ValueFormat = "text",
    as_json: bool = False,
    out: TextIO | None = None,
    errors: TextIO | None = None,
) -> int:
    """Print the key's view to ``out`` (:func:`view_text`, or :func:`view_document` as one
    line of JSON); returns the exit code: 0, or 1 if the key has neither state nor timers,
    also because the computation has nothing in the table (then only a message saying where
    it looked goes to ``errors``).

    Raises :class:`~millstream.engine.errors.MillstreamError` if Cassandra cannot be reached,
    the keyspace or table does not exist, or ``intervals`` is out of range.
    """
    out = sys.stdout if out is None else out
    errors = sys.stderr if errors is None else errors
    if intervals is not None and not 1 <= intervals <= MAX_KEY_INTERVALS:
        raise ConfigError(f"--intervals must be in [1, {MAX_KEY_INTERVALS}], not {intervals}")
    try:
        cluster, session = cassandra_connector.connect(config)
    except Exception as exc:  # NoHostAvailable and the like: nothing was read
        hosts = ",".join(config.cassandra_hosts)
        raise MillstreamError(
            f"cannot reach Cassandra at {hosts} port {config.cassandra_port} ({exc}); is it up?"
        ) from exc
    try:
        _check_table(session, keyspace, table)
        store = CassandraIntervalStore(session, keyspace, SystemClock(), table=table)
        view, where = _find(store, computation, key, intervals)
    finally:
        cluster.shutdown()
    if view is None:
        print(
            f"key {key!r} of computation {computation!r} has no state and no timers in "
            f"{keyspace}.{table}: {where}",
            file=errors,
        )
        return 1
    if as_json:
        document = view_document(view, codec=codec, value_format=value_format)
        out.write(_json(document) + "\n")
    else:
        out.write(view_text(view, codec=codec, value_format=value_format) + "\n")
    return 0


def _find(
    store: CassandraIntervalStore, computation: str, key: str, intervals: int | None
) -> tuple[KeyView | None, str]:
    """The key's view (``None`` if it has nothing stored) and where it was looked for.

    The computation's stored layout, once a driver wrote it, says which interval holds the
    key. Without one (no driver ran it: a test's worker), ``intervals`` says, and without
    that every interval of the computation in the table is read for the key's rows and the
    one holding them is shown.
    """
    layout = store.read_layout(computation)
    if layout is not None:
        # The driver wrote it at the first batch and keeps it: it, not a count from the
        # command line or the topology (whose default may have changed since), says where
        # the key is.
        interval = layout.interval_of(key)
        sequencer = store.sequencer(computation, interval)
        view = read_view(
            store,
            computation,
            interval,
            key,
            sequencer=sequencer,
            intervals=len(layout.ids) if layout.is_initial else None,
        )
        if layout.is_initial:
            where = f"looked in its interval {interval} of the {len(layout.ids)} stored"
        else:
            where = f"looked in its interval {interval} of the layout {list(layout.ids)}"
        if intervals is not None and intervals != len(layout.ids):
            where += f" (not {intervals}: the stored layout says where keys are)"
        return (None if view.is_empty else view), where
    if intervals is not None:
        interval = key_interval(key, intervals)
        sequencer = store.sequencer(computation, interval)
        view = read_view(
            store, computation, interval, key, sequencer=sequencer, intervals=intervals
        )
        never = "never acquired" if sequencer is None else f"sequencer {sequencer}"
        where = (
            f"looked in its interval {interval} of {intervals} ({never}, "
            f"{len(view.productions)} pending production(s))"
        )
        return (None if view.is_empty else view), where
    known = store.intervals()
    candidates = known.get(computation)
    if not candidates:
        names = ", ".join(sorted(known)) or "none"
        return None, (
            f"the computation has no interval there (computations there: {names}); check the "
            "name and --keyspace"
        )
    holding = [
        interval
        for interval in candidates
        if not _is_empty(store.read_keys(_lease(computation, interval, None), [key])[key])
    ]
    if len(holding) > 1:
        raise MillstreamError(
            f"key {key!r} of {computation!r} has rows in intervals {holding}: its "
            "key_intervals changed while it had state; name the current number with "
            "--intervals or --topology"
        )
    if not holding:
        return None, f"none of the {len(candidates)} intervals of the computation holds it"
    interval = holding[0]
    sequencer = store.sequencer(computation, interval)
    return read_view(store, computation, interval, key, sequencer=sequencer), ""


def _check_table(session: Any, keyspace: str, table: str) -> None:
    """Refuse, with what to check, a keyspace or table that does not exist (the store would
    fail to prepare its statements, with advice meant for writers)."""
    metadata = session.cluster.metadata.keyspaces.get(keyspace)
    if metadata is None:
        raise MillstreamError(
            f"keyspace {keyspace!r} does not exist; name the one the topology runs with "
            "(millstream run --keyspace, default millstream) in --keyspace"
        )
    if table not in metadata.tables:
        raise MillstreamError(
            f"keyspace {keyspace!r} has no table {table!r}: no topology has run with it yet"
        )


def _lease(computation: str, interval: int, sequencer: int | None) -> Lease:
    """A lease to read with: the store's reads take its partition and check no token."""
    token = INITIAL_SEQUENCER if sequencer is None else sequencer
    return Lease(computation, interval, token, cache_valid=False)


def _is_empty(snapshot: KeySnapshot) -> bool:
    return snapshot.state is None and not snapshot.timers


def _avro(data: bytes) -> dict[str, Any] | None:
    """``data`` decoded as Avro single-object encoding with a registered writer schema, or
    ``None`` if it is not that."""
    marker = len(SINGLE_OBJECT_MARKER)
    registry = default_registry()
    fingerprint = data[marker : marker + _FINGERPRINT_BYTES]
    if data[:marker] != SINGLE_OBJECT_MARKER or fingerprint not in registry:
        return None
    writer = registry.lookup(fingerprint)
    try:
        value = decode_single_object(data, writer, registry)
    except RecordDecodeError:
        return None
    return {"state": value, "state_encoding": f"avro {writer.name}"}


def _production_value(entry: dict[str, Any]) -> str:
    if "dead_letter" in entry:
        letter = entry["dead_letter"]
        return f"dead letter, {letter['error_type']}: {letter['error_message']}"
    return _shown(entry["value"])


def _shown(value: Any) -> str:
    """A value for a person: text as it is (its encoding is named beside it), else JSON."""
    return value if isinstance(value, str) else _json(value)


def _json(value: Any) -> str:
    """Compact JSON; bytes (in Avro values) as hex, anything else unknown as its text."""
    return json.dumps(value, ensure_ascii=False, default=_plain)


def _plain(value: Any) -> Any:
    if isinstance(value, bytes | bytearray):
        return bytes(value).hex()
    return str(value)
