"""Streams from a shell: ``millstream produce`` and ``millstream tail``
(:mod:`millstream.connectors.streams`).

``produce`` exits 1 if a line was rejected (the others were sent); ``tail`` exits 1 if it
printed no record, also when ``--follow`` ends with Ctrl-C, which is how it ends.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TextIO, cast

from millstream.cli.arguments import add_command, positive

__all__ = ["register", "run"]


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    produce = add_command(
        commands,
        "produce",
        summary="send JSON lines from stdin to a stream",
        description='Send JSON lines from stdin to a stream, one record each: {"key": str, '
        '"value": any JSON, "timestamp": microseconds (default: now), "id": str (optional)}. '
        "A line that is not a record is reported with its number and skipped (exit code 1); "
        "the others are sent.",
    )
    produce.add_argument("stream", metavar="STREAM", help="the stream (a Kafka topic of that name)")
    produce.add_argument(
        "--source",
        default="stdin",
        metavar="NAME",
        help="names the input: record IDs derive from it, so an input sent again under the "
        "same name is deduplicated downstream (default: stdin)",
    )
    produce.add_argument(
        "--partitions",
        type=positive,
        default=2,
        metavar="N",
        help="partitions of the topic if it is created (default: 2)",
    )
    produce.add_argument(
        "--report-watermark",
        action="store_true",
        help="then report a low watermark just past the newest timestamp sent, as source "
        "injector/produce-SOURCE/0 (it holds the stream there until it reports again)",
    )
    produce.set_defaults(handler=run)
    tail = add_command(
        commands,
        "tail",
        summary="print a stream's records as JSON lines",
        description="Print a stream's records as JSON lines (stream, partition, offset, key, "
        "timestamp, time, record_id, value); dead letters are decoded. Without --follow it "
        "stops at the end the stream had when it started. Exit code 1 if it printed no "
        "record.",
    )
    tail.add_argument("stream", metavar="STREAM", help="the stream (a Kafka topic of that name)")
    tail.add_argument(
        "--from-beginning", action="store_true", help="start at the oldest record, not the end"
    )
    tail.add_argument(
        "--follow", action="store_true", help="keep printing new records until Ctrl-C"
    )
    tail.add_argument("--dedup", action="store_true", help="print each record ID once")
    tail.add_argument(
        "--max", type=positive, default=None, metavar="N", help="stop after N records"
    )
    tail.add_argument(
        "--value",
        choices=("text", "json", "hex"),  # streams.VALUE_FORMATS, not imported for --help
        default="text",
        help="how to print values: UTF-8 text, parsed JSON, or hex (default: text)",
    )
    tail.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.command == "produce":
        return _produce(args)
    return _tail(args)


def _produce(args: argparse.Namespace) -> int:
    from millstream.connectors import streams
    from millstream.engine.config import load_config

    config = load_config()
    # Bytes: a line that is not UTF-8 is rejected alone (a StringIO has no buffer).
    lines = getattr(sys.stdin, "buffer", sys.stdin)
    summary = streams.produce_lines(
        config,
        args.stream,
        lines,
        source=args.source,
        partitions=args.partitions,
        report_watermark=args.report_watermark,
        errors=sys.stderr,
    )
    print(f"millstream produce: {summary.describe()}", file=sys.stderr)
    return summary.exit_code


def _tail(args: argparse.Namespace) -> int:
    from millstream.connectors import streams
    from millstream.engine.config import load_config

    config = load_config()
    out = _Counted(sys.stdout)
    try:
        streams.tail_stream(
            config,
            args.stream,
            out=cast(TextIO, out),  # tail_stream only writes and flushes
            from_beginning=args.from_beginning,
            follow=args.follow,
            dedup=args.dedup,
            max_records=args.max,
            value_format=args.value,
        )
    except KeyboardInterrupt:
        if not args.follow:
            raise
        # How --follow ends.
    except BrokenPipeError:
        # `millstream tail ... | head`: the reader is done. Keep the exit flush from failing.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return 0 if out.lines else 1


class _Counted:
    """``out``, counting the lines written to it."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.lines = 0

    def write(self, text: str) -> int:
        written = self.out.write(text)
        self.lines += text.count("\n")
        return written

    def flush(self) -> None:
        self.out.flush()
