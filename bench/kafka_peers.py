"""The pure-Kafka peers of ``bench/throughput.py``, each run as a process of its own.

* ``loop``: a confluent-kafka consume→produce loop with no state, which forwards every input
  message as it is: the raw floor of Python and Kafka (no guarantee).
* ``quix``: Quix Streams 3 with ``processing_guarantee="exactly-once"``: per key, a count in
  its RocksDB state (backed by a changelog topic), and for every input message one output
  message with the key's new count, in Kafka transactions.

Both stop once they have handled ``--records`` input messages (Quix commits its last
transaction on the way out) and print one JSON line: ``{"first_record_at": <wall clock s of
the first input message they got>, "handled": <n>}``. This file imports only the standard
library, confluent-kafka and (for ``quix``) quixstreams, because ``quix`` runs in a virtualenv
of its own: every Quix Streams 3 release caps confluent-kafka below 2.13, whose wheels carry no
type information, so it cannot share millstream's environment without breaking ``mypy
--strict``. ``bench/throughput.py`` creates that virtualenv on first use with::

    python -m venv ~/.millstream/bench/quix-venv
    ~/.millstream/bench/quix-venv/bin/python -m pip install 'quixstreams==3.28.1'

    python bench/kafka_peers.py loop --bootstrap 127.0.0.1:9092 --source IN --sink OUT \\
        --records 20000
    QUIX_PYTHON bench/kafka_peers.py quix ... --state-dir DIR --group GROUP --pad 44
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import sys
import time
import uuid
from typing import Any

QUIX_REQUIREMENT = "quixstreams==3.28.1"


def run_loop(args: argparse.Namespace) -> dict[str, Any]:
    from confluent_kafka import Consumer, Producer

    consumer = Consumer(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": args.group or f"bench-loop-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    producer = Producer(
        {
            "bootstrap.servers": args.bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
        }
    )
    first: float | None = None
    handled = 0
    try:
        consumer.subscribe([args.source])
        while handled < args.records:
            messages = consumer.consume(num_messages=1_000, timeout=0.1)
            if messages and first is None:
                first = time.time()
            for message in messages:
                if message.error() is not None:
                    continue
                producer.produce(args.sink, key=message.key(), value=message.value())
                handled += 1
            producer.poll(0)
        if producer.flush(60):
            raise RuntimeError("the loop's output was not acknowledged by Kafka within 60 s")
    finally:
        consumer.close()
    return {"first_record_at": first, "handled": handled}


def run_quix(args: argparse.Namespace) -> dict[str, Any]:
    quixstreams: Any = importlib.import_module("quixstreams")
    app = quixstreams.Application(
        broker_address=args.bootstrap,
        consumer_group=args.group,
        auto_offset_reset="earliest",
        processing_guarantee="exactly-once",
        state_dir=args.state_dir,
        loglevel="WARNING",
    )
    source = app.topic(args.source, key_deserializer="bytes", value_deserializer="bytes")
    sink = app.topic(args.sink, key_serializer="bytes", value_serializer="bytes")
    counter = _QuixCounter(args.pad, args.work_us)
    frame = app.dataframe(source)
    frame = frame.apply(counter, stateful=True)
    frame.to_topic(sink)
    app.run(count=args.records, collect=False)
    return {"first_record_at": counter.first, "handled": counter.handled}


class _QuixCounter:
    """The stateful step: the key's new count, zero-padded to ``pad`` bytes."""

    def __init__(self, pad: int, work_us: float = 0.0) -> None:
        self.pad = pad
        self.work_us = work_us
        self.first: float | None = None
        self.handled = 0

    def __call__(self, value: bytes, state: Any) -> bytes:
        if self.first is None:
            self.first = time.time()
        self.handled += 1
        spend_cpu(self.work_us)
        total = int(state.get("count", 0)) + 1
        state.set("count", total)
        return str(total).encode().rjust(self.pad, b"0")


def spend_cpu(microseconds: float) -> None:
    """Busy for ``microseconds`` of this thread's CPU: a record's costly work (a model)."""
    if microseconds > 0:
        until = time.thread_time() + microseconds / 1e6
        while time.thread_time() < until:
            pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("peer", choices=["loop", "quix"])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--source", required=True)
    parser.add_argument("--sink", required=True)
    parser.add_argument("--records", type=int, required=True)
    parser.add_argument("--group", default="")
    parser.add_argument("--state-dir", default="")
    parser.add_argument("--pad", type=int, default=0, help="bytes of each output value (quix)")
    parser.add_argument(
        "--work-us", type=float, default=0.0, help="CPU µs of work per record (quix)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    result = run_loop(args) if args.peer == "loop" else run_quix(args)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
