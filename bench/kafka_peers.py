"""The pure-Kafka peers of ``bench/throughput.py``, each run as a process of its own.

* ``loop``: a confluent-kafka consume→produce loop with no state, which forwards every input
  message as it is: the raw floor of Python and Kafka (no guarantee).
* ``quix``: Quix Streams 3 with ``processing_guarantee="exactly-once"``: per key, a count in
  its RocksDB state (backed by a changelog topic), and for every input message one output
  message with the key's new count, in Kafka transactions.
* ``bytewax``: Bytewax 0.21, one worker: the same count with ``stateful_map``, its state
  snapshotted into SQLite recovery partitions each epoch, out through its Kafka sink (at
  least once: its free edition has no transactional sink).
* ``pathway``: Pathway 0.33, two threads: the same count (a Python function per row, as in
  the others, its counts kept by the process), reading the topic to its end
  (``mode="static"``), its input persisted to the filesystem for recovery, out through its
  Kafka writer (at least once, like Bytewax's).

Each stops once it has handled ``--records`` input messages (Quix commits its last
transaction on the way out; Bytewax stops at the topic's end) and prints one JSON line:
``{"first_record_at": <wall clock s of the first input message it got>, "handled": <n>}``.
This file imports only the standard library, confluent-kafka and the peer's framework,
because the frameworks run in virtualenvs of their own: every Quix Streams 3 release caps
confluent-kafka below 2.13, whose wheels carry no type information, so it cannot share
millstream's environment without breaking ``mypy --strict``, and Bytewax is kept apart the
same way. ``bench/throughput.py`` creates them on first use, for example::

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
BYTEWAX_REQUIREMENT = "bytewax[kafka]==0.21.1"
PATHWAY_REQUIREMENT = "pathway==0.33.0"


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


def run_bytewax(args: argparse.Namespace) -> dict[str, Any]:
    """Bytewax: one worker, its state snapshotted to SQLite recovery partitions every epoch
    (the default 10 s), output at least once through its Kafka sink; it reads the topic to
    its end (``tail=False``) and stops there."""
    from datetime import timedelta
    from pathlib import Path

    op: Any = importlib.import_module("bytewax.operators")
    dataflow: Any = importlib.import_module("bytewax.dataflow")
    kafka: Any = importlib.import_module("bytewax.connectors.kafka")
    recovery: Any = importlib.import_module("bytewax.recovery")
    testing: Any = importlib.import_module("bytewax.testing")

    state_dir = Path(args.state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    recovery.init_db_dir(state_dir, 1)
    counter = _Counter(args.pad, args.work_us)

    def count(total: int | None, value: bytes) -> tuple[int, bytes]:
        total = (total or 0) + 1
        return total, counter.count(total)

    flow = dataflow.Dataflow("bench_count")
    source = kafka.KafkaSource(
        [args.bootstrap],
        [args.source],
        tail=False,
        add_config={"group.id": args.group, "enable.auto.commit": "false"},
    )
    messages = op.input("in", flow, source)
    keyed = op.key_on("key", messages, lambda m: m.key.decode())
    values = op.map_value("value", keyed, lambda m: m.value)
    counts = op.stateful_map("count", values, count)
    out = op.map("out", counts, lambda kv: kafka.KafkaSinkMessage(kv[0].encode(), kv[1]))
    op.output("sink", out, kafka.KafkaSink([args.bootstrap], args.sink))
    testing.run_main(
        flow,
        epoch_interval=timedelta(seconds=10),
        recovery_config=recovery.RecoveryConfig(state_dir),
    )
    return {"first_record_at": counter.first, "handled": counter.handled}


def run_pathway(args: argparse.Namespace) -> dict[str, Any]:
    """Pathway: two worker threads (``PATHWAY_THREADS``), the topic read to its end
    (``mode="static"``), each row given its key's new count by a Python function (one output
    per input, as every other row of the benchmark writes; Pathway's own ``groupby().reduce``
    would write one update per key and minibatch instead), its input persisted to the
    filesystem, output at least once through its Kafka writer."""
    import os
    import threading

    os.environ.setdefault("PATHWAY_THREADS", "2")
    pw: Any = importlib.import_module("pathway")
    counter = _Counter(args.pad, args.work_us)
    totals: dict[bytes, int] = {}
    lock = threading.Lock()  # the worker threads share the counts

    def count(key: bytes) -> bytes:
        with lock:
            total = totals.get(key, 0) + 1
            totals[key] = total
            return counter.count(total)

    settings = {"bootstrap.servers": args.bootstrap}
    # A generated row ID: the message key would make rows of one key replace each other.
    rows = pw.io.kafka.read(
        {**settings, "group.id": args.group},
        args.source,
        format="raw",
        mode="static",
        autogenerate_key=True,
    )
    counted = rows.select(
        key=pw.this.key,
        value=pw.apply_with_type(count, bytes, pw.this.key),
    )
    pw.io.kafka.write(
        counted, settings, args.sink, format="raw", key=counted.key, value=counted.value
    )
    backend = pw.persistence.Backend.filesystem(args.state_dir)
    pw.run(
        monitoring_level=pw.MonitoringLevel.NONE,
        persistence_config=pw.persistence.Config(backend),
    )
    return {"first_record_at": counter.first, "handled": counter.handled}


class _Counter:
    """Counts calls, notes the first's wall time, spends the work, pads the new count."""

    def __init__(self, pad: int, work_us: float = 0.0) -> None:
        self.pad = pad
        self.work_us = work_us
        self.first: float | None = None
        self.handled = 0

    def count(self, total: int) -> bytes:
        if self.first is None:
            self.first = time.time()
        self.handled += 1
        spend_cpu(self.work_us)
        return str(total).encode().rjust(self.pad, b"0")


class _QuixCounter(_Counter):
    """Quix's stateful step: the key's new count, kept in its state."""

    def __call__(self, value: bytes, state: Any) -> bytes:
        total = int(state.get("count", 0)) + 1
        state.set("count", total)
        return self.count(total)


def spend_cpu(microseconds: float) -> None:
    """Busy for ``microseconds`` of this thread's CPU: a record's costly work (a model)."""
    if microseconds > 0:
        until = time.thread_time() + microseconds / 1e6
        while time.thread_time() < until:
            pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("peer", choices=["loop", "quix", "bytewax", "pathway"])
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
    runs = {
        "loop": run_loop,
        "quix": run_quix,
        "bytewax": run_bytewax,
        "pathway": run_pathway,
    }
    result = runs[args.peer](args)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
