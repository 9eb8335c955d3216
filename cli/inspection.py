"""Looking at a running topology: ``millstream watermarks`` and ``millstream state``.

``watermarks`` reads the watermark topic (no driver needed) and prints every source, lowest
first (:func:`millstream.engine.watermarks.watermark_overview`): a source that reported a time
shows it with its lag behind the wall clock; one whose input ended shows ``complete``, with no
lag; one that has reported no time yet shows ``no report yet`` (it holds its streams at the
beginning of time). Exit code 1 if no source has reported.

``state`` prints what Cassandra holds for one key of a computation
(:mod:`millstream.connectors.state_view`). Exit code 1 if the key, or the computation, has
nothing stored.

(Named ``inspection``, not ``inspect``: spark-submit runs this package's ``__init__.py`` as a
script, which puts this folder first on ``sys.path``, where a module named like one of the
standard library would shadow it.)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import TYPE_CHECKING

from millstream.cli.arguments import add_command, positive

if TYPE_CHECKING:
    from millstream.engine.config import MillstreamConfig
    from millstream.engine.watermarks import SourceStatus, WatermarkMessage

__all__ = ["register", "render_source", "run"]


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    watermarks = add_command(
        commands,
        "watermarks",
        summary="each source's low watermark, lag and what holds it",
        description="Print every source on the watermark topic, lowest watermark first: its "
        "low watermark and lag behind the wall clock, or 'complete' once its input ended, or "
        "'no report yet'; and what holds it. Expected injector processes that never reported "
        "are listed too: they hold their streams. Exit code 1 if no source has reported.",
    )
    watermarks.add_argument(
        "--json",
        action="store_true",
        help='one JSON object per source, with "state": "reporting", "complete" or '
        '"no report yet" ("lag" is null unless reporting)',
    )
    watermarks.set_defaults(handler=run)
    state = add_command(
        commands,
        "state",
        summary="a key's state, timers and pending productions",
        description="Print what Cassandra holds for one key of a computation: its state, its "
        "timers, and its interval's sequencer and pending productions. It reads only, so it "
        "is safe while the topology runs. Exit code 1 if the key, or the computation, has "
        "nothing stored.",
    )
    state.add_argument("computation", metavar="COMPUTATION", help="the computation's name")
    state.add_argument("key", metavar="KEY", help="the key, as the computation sees it")
    state.add_argument(
        "--keyspace",
        default=None,
        metavar="NAME",
        help="Cassandra keyspace of the state (default: [run] keyspace, millstream)",
    )
    where = state.add_mutually_exclusive_group()
    where.add_argument(
        "--topology",
        metavar="MODULE:TOPOLOGY",
        help="take the computation's key intervals from its topology (imported as for "
        "millstream run; its module's Avro schemas are registered too) if no driver stored "
        "its layout yet; default: the stored layout, else every interval of the computation",
    )
    where.add_argument(
        "--intervals",
        type=positive,
        metavar="N",
        help="the computation's key_intervals, if no driver stored its layout yet",
    )
    state.add_argument(
        "--codec",
        choices=("auto", "json", "int", "text", "hex"),  # state_view.STATE_CODECS
        default="auto",
        help="how to show the state (default auto: Avro with a registered schema, JSON, "
        "text, else hex)",
    )
    state.add_argument(
        "--value",
        choices=("text", "json", "hex"),
        default="text",
        help="how to show pending productions' values, as for tail (default: text)",
    )
    state.add_argument("--json", action="store_true", help="print one JSON object")
    state.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.command == "watermarks":
        return _watermarks(args)
    return _state(args)


def _watermarks(args: argparse.Namespace) -> int:
    from millstream.engine.clock import SystemClock
    from millstream.engine.config import load_config
    from millstream.engine.watermarks import watermark_overview

    config = load_config()
    rows = watermark_overview(_read_watermark_topic(config), SystemClock().now())
    for row in rows:
        if args.json:
            print(json.dumps(dataclasses.asdict(row)))
        else:
            print(render_source(row))
    if not rows:
        print(
            f"no source has reported on the watermark topic {config.kafka_watermark_topic!r} yet",
            file=sys.stderr,
        )
        return 1
    return 0


def render_source(row: SourceStatus) -> str:
    """One line of ``millstream watermarks``."""
    from millstream.connectors.streams import event_time_iso

    streams = f"  streams: {', '.join(row.streams)}"
    if row.state == "complete":
        return f"{row.source}: complete{streams}"
    if row.watermark is None or row.state == "no report yet":
        return f"{row.source}: no report yet  held by: {row.held_by}{streams}"
    lag = "" if row.lag is None else f"  lag {row.lag / 1e6:,.1f} s"
    heuristic = "".join(f"  p{p:g}: {_time(value)}" for p, value in sorted(row.percentiles.items()))
    timers = "" if row.timer_watermark is None else f"  timers at: {_time(row.timer_watermark)}"
    hot = (
        "  hot: " + ", ".join(f"interval {i} ({n:,} records)" for i, n in row.hot)
        if row.hot
        else ""
    )
    when = event_time_iso(row.watermark) or str(row.watermark)
    return f"{row.source}: {when}{lag}{heuristic}{timers}  held by: {row.held_by}{hot}{streams}"


def _time(value: int) -> str:
    """An event time of a report: the beginning and the end of time in words."""
    from millstream.connectors.streams import event_time_iso
    from millstream.engine.records import MAX_EVENT_TIME, MIN_EVENT_TIME

    if value <= MIN_EVENT_TIME:
        return "not yet"
    if value >= MAX_EVENT_TIME:
        return "complete"
    return event_time_iso(value) or str(value)


def _read_watermark_topic(
    config: MillstreamConfig, timeout: float = 30.0
) -> list[tuple[str, WatermarkMessage | None]]:
    """Every message of the watermark topic; none if the topic does not exist (no source
    ever reported). Raises :class:`MillstreamError` if Kafka does not answer in ``timeout``
    seconds."""
    from confluent_kafka import KafkaError, KafkaException

    from millstream.connectors.kafka import KafkaWatermarkTopic, consumer
    from millstream.engine.errors import MillstreamError

    topic = config.kafka_watermark_topic
    unreachable = (
        f"is Kafka up at {config.kafka_bootstrap}? (millstream status shows the local one)"
    )
    try:
        # A consumer's metadata request does not create the topic.
        probe = consumer(config, "millstream-watermarks")
        try:
            metadata = probe.list_topics(topic, timeout=timeout).topics.get(topic)
        finally:
            probe.close()
        missing = (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC)
        if metadata is None or (metadata.error is not None and metadata.error.code() in missing):
            return []
        reader = KafkaWatermarkTopic(config, create=False)
        try:
            return reader.read(timeout)
        finally:
            reader.close()
    except (KafkaException, TimeoutError) as exc:
        raise MillstreamError(
            f"could not read the watermark topic {topic!r} ({exc}); {unreachable}"
        ) from exc


def _state(args: argparse.Namespace) -> int:
    from millstream.connectors.state_view import key_intervals_of, show_state
    from millstream.engine.config import load_config

    intervals = args.intervals
    if args.topology is not None:
        from millstream.spark.runner import load_topology

        topology, _ = load_topology(args.topology)
        intervals = key_intervals_of(topology, args.computation)
    config = load_config()
    return show_state(
        config,
        args.computation,
        args.key,
        keyspace=args.keyspace or config.run.keyspace,
        intervals=intervals,
        codec=args.codec,
        value_format=args.value,
        as_json=args.json,
    )
