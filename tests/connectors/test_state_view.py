"""``millstream state``: decoding and rendering without services, then the command on a key
that the real per-key protocol committed to Cassandra (state, a pending timer, productions
that Kafka never acknowledged)."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from types import SimpleNamespace
from typing import TYPE_CHECKING

import pytest

from millstream import cli
from millstream.connectors import cassandra as cassandra_connector
from millstream.connectors import state_view
from millstream.connectors.state_view import (
    KeyView,
    decode_state,
    key_intervals_of,
    read_view,
    show_state,
    view_document,
    view_text,
)
from millstream.engine.clock import ManualClock, SystemClock
from millstream.engine.codecs import AvroCodec, IntCodec, JsonCodec
from millstream.engine.computation import Computation
from millstream.engine.config import MillstreamConfig
from millstream.engine.context import Context
from millstream.engine.deadletters import (
    DeadLetter,
    Origin,
    default_dead_letter_stream,
    encode_dead_letter,
)
from millstream.engine.errors import ConfigError
from millstream.engine.keys import key_interval
from millstream.engine.layout import IntervalLayout
from millstream.engine.productions import Production
from millstream.engine.protocol import Delivery, IntervalWorker
from millstream.engine.records import Record, injector_record_id
from millstream.engine.store import IntervalStore
from millstream.engine.stores.cassandra import CassandraIntervalStore, create_schema
from millstream.engine.stores.memory.store import MemoryIntervalStore
from millstream.engine.testing import SendOutcome, TestingSink
from millstream.engine.timers import TimeDomain, Timer
from millstream.engine.topology import ComputationOptions, Topology

if TYPE_CHECKING:
    from cassandra.cluster import Session

MINUTE = 60_000_000
START = 1_699_999_980_000_000  # 2023-11-14T22:13:00Z, a whole minute
INTERVALS = 4
JSON = JsonCodec()


class WindowCount(Computation):
    """Counts a key's records per minute in JSON state, with a timer at the window's end, and
    produces each record's running count."""

    def process_record(self, ctx: Context, record: Record) -> None:
        state = ctx.state(JSON)
        count = state.get({"count": 0})["count"] + 1
        state.set({"count": count})
        ctx.set_timer("window", (record.timestamp // MINUTE + 1) * MINUTE)
        ctx.produce("counts", JSON.encode({"seen": count}), record.timestamp)


def topology() -> Topology:
    """What ``--topology tests.connectors.test_state_view:topology`` loads."""
    built = Topology("state_view_test", streams=["clicks"])
    built.add_computation(
        "windows",
        WindowCount(),
        inputs=["clicks"],
        outputs=["counts"],
        options=ComputationOptions(key_intervals=INTERVALS),
    )
    return built


def click(key: str, offset: int) -> Delivery:
    record = Record(key, b"", START + offset, injector_record_id("clicks", 0, offset))
    return Delivery(key, record)


def run_unacknowledged(store: IntervalStore, batches: list[list[Delivery]]) -> None:
    """Commit ``batches`` through the real protocol, each key's in its interval; the sink
    acknowledges nothing, so every production stays pending, and no timer is due."""
    spec = topology().computations["windows"]
    sink = TestingSink(lambda _: SendOutcome.UNACKNOWLEDGED)
    workers: dict[int, IntervalWorker] = {}
    for batch in batches:
        by_interval: dict[int, list[Delivery]] = {}
        for delivery in batch:
            by_interval.setdefault(key_interval(delivery.key, INTERVALS), []).append(delivery)
        for interval, deliveries in by_interval.items():
            if interval not in workers:
                workers[interval] = IntervalWorker(
                    spec, interval, store=store, sink=sink, clock=SystemClock()
                )
            workers[interval].process(deliveries, input_low_watermark=START)


def other_interval_key(key: str) -> str:
    """A key whose interval differs from ``key``'s."""
    mine = key_interval(key, INTERVALS)
    return next(f"user-{n}" for n in range(100) if key_interval(f"user-{n}", INTERVALS) != mine)


# -- decoding and rendering -----------------------------------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize(
    ("data", "codec", "shown"),
    [
        (JSON.encode({"count": 2}), "auto", {"state": {"count": 2}, "state_encoding": "json"}),
        (b"caf\xc3\xa9", "auto", {"state": "café", "state_encoding": "text"}),
        (IntCodec().encode(5), "auto", {"state": "0000000000000005", "state_encoding": "hex"}),
        (b"\xff\x00", "auto", {"state": "ff00", "state_encoding": "hex"}),
        (IntCodec().encode(-3), "int", {"state": -3, "state_encoding": "int"}),
        (b"\x01\x02", "int", {"state": "0102", "state_encoding": "hex"}),
        (b'{"a": 1}', "text", {"state": '{"a": 1}', "state_encoding": "text"}),
        (b'{"a": 1}', "hex", {"state": "7b2261223a20317d", "state_encoding": "hex"}),
        (b"not json", "json", {"state": "not json", "state_encoding": "text"}),
    ],
)
def test_decode_state_says_which_encoding_it_shows(
    data: bytes, codec: str, shown: dict[str, object]
) -> None:
    assert decode_state(data, codec) == shown  # type: ignore[arg-type]


@pytest.mark.unit
def test_decode_state_reads_avro_whose_schema_is_registered() -> None:
    schema = {
        "type": "record",
        "name": "test.state_view.Window",
        "fields": [{"name": "count", "type": "long"}, {"name": "digest", "type": "bytes"}],
    }
    data = AvroCodec[dict[str, object]](schema).encode({"count": 7, "digest": b"\x01\xff"})
    assert decode_state(data) == {
        "state": {"count": 7, "digest": b"\x01\xff"},
        "state_encoding": "avro test.state_view.Window",
    }
    view = KeyView("c", "k", 0, 1, 1, data, (), ())
    assert 'state (avro test.state_view.Window, 14 bytes): {"count": 7, "digest": "01ff"}' in (
        view_text(view)
    )
    # Asked for JSON, the same bytes are not JSON: shown as hex.
    assert decode_state(data, "json")["state_encoding"] == "hex"


@pytest.mark.unit
def test_the_view_of_a_key_the_protocol_committed() -> None:
    store = MemoryIntervalStore(ManualClock(START))
    run_unacknowledged(store, [[click("alice", 1), click("alice", 2)]])
    interval = key_interval("alice", INTERVALS)
    view = read_view(
        store,
        "windows",
        interval,
        "alice",
        sequencer=store.sequencer("windows", interval),
        intervals=INTERVALS,
    )
    window_end = START + MINUTE
    assert view.sequencer == 1
    assert view.state == JSON.encode({"count": 2})
    assert [(t.tag, t.timestamp, t.domain) for t in view.timers] == [
        ("window", window_end, TimeDomain.EVENT_TIME)
    ]
    document = view_document(view, value_format="json")
    assert document["state"] == {"count": 2}
    assert [(p["stream"], p["key"], p["value"]) for p in document["pending_productions"]] == [
        ("counts", "alice", {"seen": 1}),
        ("counts", "alice", {"seen": 2}),
    ]
    text = view_text(view).splitlines()
    assert text[:6] == [
        "computation 'windows', key 'alice'",
        f"interval {interval} of {INTERVALS}, sequencer 1",
        'state (json, 11 bytes): {"count": 2}',
        "timers: 1",
        f"  'window' event_time at {window_end} (2023-11-14T22:14:00.000000Z)",
        f"pending productions of interval {interval} (any key): 2",
    ]
    assert text[6].startswith(
        f"  to 'counts' key 'alice' at {START + 1} (2023-11-14T22:13:00.000001Z) id "
    )
    assert text[6].endswith(': {"seen":1}')

    other = other_interval_key("alice")
    empty = read_view(store, "windows", key_interval(other, INTERVALS), other, sequencer=None)
    assert empty.is_empty
    assert empty.productions == ()


@pytest.mark.unit
def test_a_dead_letter_production_shows_its_error() -> None:
    letter = DeadLetter.from_error("windows", Origin("clicks", 0, 5), ValueError("bad"), b"x")
    stream = default_dead_letter_stream("windows")
    record = Record("alice", encode_dead_letter(letter), START, injector_record_id("dl", 0, 1))
    timer = Timer("alice", "alarm", START, TimeDomain.WALL_TIME)
    view = KeyView("windows", "alice", 2, None, 9, None, (timer,), (Production(stream, record),))
    text = view_text(view, codec="int")
    assert "state: none" in text
    assert "interval 2, sequencer 9" in text
    assert f"  'alarm' wall_time at {START} (2023-11-14T22:13:00.000000Z)" in text
    assert text.endswith(": dead letter, ValueError: bad")


@pytest.mark.unit
def test_key_intervals_come_from_the_topology() -> None:
    assert key_intervals_of(topology(), "windows") == INTERVALS
    with pytest.raises(ConfigError, match=r"has no computation 'nope' \(it has: windows\)"):
        key_intervals_of(topology(), "nope")


# -- the command on the real store ------------------------------------------------------------


@pytest.mark.unit
def test_a_computation_with_nothing_stored_is_nothing_found(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Cluster:
        metadata = SimpleNamespace(keyspaces={"ks": SimpleNamespace(tables={"intervals": {}})})

        def shutdown(self) -> None:
            pass

    class Store:
        """The table holds intervals of one computation, ``windows``."""

        def __init__(self, *args: object, **kwargs: object) -> None:
            pass

        def read_layout(self, computation: str) -> None:
            return None

        def intervals(self) -> dict[str, list[int]]:
            return {"windows": [0, 1]}

    cluster = Cluster()
    session = SimpleNamespace(cluster=cluster)
    monkeypatch.setattr(cassandra_connector, "connect", lambda config: (cluster, session))
    monkeypatch.setattr(state_view, "CassandraIntervalStore", Store)
    out, errors = io.StringIO(), io.StringIO()
    found = show_state(MillstreamConfig(), "nope", "alice", keyspace="ks", out=out, errors=errors)
    assert found == 1
    assert out.getvalue() == ""
    assert errors.getvalue() == (
        "key 'alice' of computation 'nope' has no state and no timers in ks.intervals: the "
        "computation has no interval there (computations there: windows); check the name and "
        "--keyspace\n"
    )


@pytest.mark.integration
def test_state_command_shows_what_the_protocol_committed_to_cassandra(
    cassandra: Session,
    cassandra_keyspace: Callable[[], str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    keyspace = cassandra_keyspace()
    create_schema(cassandra, keyspace)
    store = CassandraIntervalStore(cassandra, keyspace, SystemClock())
    other = other_interval_key("alice")
    # Two batches of one owner, which keeps its lease: the sequencer of alice's interval
    # moved once. Another worker's batch (a duplicate, dropped) moves it again.
    run_unacknowledged(store, [[click("alice", 1), click(other, 3)], [click("alice", 2)]])
    interval = key_interval("alice", INTERVALS)
    assert store.sequencer("windows", interval) == 1
    run_unacknowledged(store, [[click("alice", 2)]])
    window_end = START + MINUTE

    # Without --intervals or --topology: found by reading the computation's two intervals.
    assert cli.main(["state", "windows", "alice", "--keyspace", keyspace, "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["interval"] == interval
    assert found["intervals"] is None
    assert found["sequencer"] == 2
    assert (found["state"], found["state_encoding"]) == ({"count": 2}, "json")
    assert [(t["tag"], t["domain"], t["timestamp"], t["time"]) for t in found["timers"]] == [
        ("window", "event_time", window_end, "2023-11-14T22:14:00.000000Z")
    ]
    assert found["timers"][0]["set_by"] == injector_record_id("clicks", 0, 2).hex()
    assert [
        (p["stream"], p["key"], p["timestamp"], p["value"]) for p in found["pending_productions"]
    ] == [
        ("counts", "alice", START + 1, '{"seen":1}'),
        ("counts", "alice", START + 2, '{"seen":2}'),
    ]

    # With the topology: its key_intervals name the interval; the same rows.
    target = "tests.connectors.test_state_view:topology"
    command = ["state", "windows", "alice", "--keyspace", keyspace]
    assert cli.main([*command, "--topology", target, "--json", "--value", "json"]) == 0
    named = json.loads(capsys.readouterr().out)
    assert named == {
        **found,
        "intervals": INTERVALS,
        "pending_productions": [
            {**p, "value": json.loads(p["value"])} for p in found["pending_productions"]
        ],
    }

    assert cli.main([*command, "--intervals", str(INTERVALS)]) == 0
    text = capsys.readouterr().out
    assert f"interval {interval} of {INTERVALS}, sequencer 2\n" in text
    assert 'state (json, 11 bytes): {"count": 2}\n' in text
    assert f"  'window' event_time at {window_end} (2023-11-14T22:14:00.000000Z)\n" in text

    # A key with nothing stored, an unknown computation, a keyspace without the table.
    assert cli.main(["state", "windows", "nobody", "--keyspace", keyspace]) == 1
    assert capsys.readouterr().err == (
        f"key 'nobody' of computation 'windows' has no state and no timers in "
        f"{keyspace}.intervals: none of the 2 intervals of the computation holds it\n"
    )
    nobody = key_interval("nobody", INTERVALS)
    assert cli.main([*command[:2], "nobody", *command[3:], "--intervals", "4"]) == 1
    assert f"looked in its interval {nobody} of 4" in capsys.readouterr().err
    assert cli.main(["state", "nope", "alice", "--keyspace", keyspace]) == 1
    assert capsys.readouterr().err == (
        f"key 'alice' of computation 'nope' has no state and no timers in {keyspace}.intervals: "
        "the computation has no interval there (computations there: windows); check the name "
        "and --keyspace\n"
    )

    # Once a driver stored the computation's layout, it says where keys are: not a count
    # given on the command line (or a topology whose default changed since).
    assert store.write_layout("windows", IntervalLayout.initial(INTERVALS), None)
    assert cli.main([*command, "--intervals", str(2 * INTERVALS), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {**found, "intervals": INTERVALS}
    assert cli.main([*command[:2], "nobody", *command[3:], "--intervals", "8"]) == 1
    assert capsys.readouterr().err == (
        f"key 'nobody' of computation 'windows' has no state and no timers in "
        f"{keyspace}.intervals: looked in its interval {nobody} of the {INTERVALS} stored "
        "(not 8: the stored layout says where keys are)\n"
    )

    empty = cassandra_keyspace()
    assert cli.main(["state", "windows", "alice", "--keyspace", empty]) == 2
    assert f"keyspace {empty!r} has no table 'intervals'" in capsys.readouterr().err
