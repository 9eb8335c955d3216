"""The Python a record costs a millstream worker, against the least any Python consumer pays.

    python bench/record_path.py [--records 100000] [--keys 10000] [--runs 5] [--weak]

No services: what a Spark Python worker does with each message of a batch, in this process,
on one thread, timed in CPU seconds (best of ``--runs``), so that changes of a few percent,
which the end-to-end benchmark (``bench/throughput.py``) cannot tell from its noise, show.
The workload is that benchmark's keyed count (one production per record, exactly-once,
strong productions, or with ``--weak`` weak ones) on ``--records`` envelopes over ``--keys``
keys in one interval:

* ``floor``: decode each envelope, count in a dict, encode the output's envelope with an ID
  derived from the input's: the least a Python consumer of these streams does per record;
* ``routing``: the executor's message router (:func:`millstream.spark.executor.message_router`),
  which decodes, keys and routes each message to an interval;
* ``protocol``: one batch of those deliveries through the per-key protocol
  (:class:`~millstream.engine.protocol.IntervalWorker`: dedup, state, user code, commit and
  delivery) on the in-memory store and a sink that keeps nothing, so neither Cassandra's
  row binding nor Kafka's producer is in it.

The process's garbage collector is tuned as a Spark Python worker's is, with the default
``[executor] gc_threshold`` (:func:`~millstream.spark.executor.tune_collector`). Prints each
step in µs a record, and as a multiple of the floor.
"""

from __future__ import annotations

import argparse
import gc
import time
from collections.abc import Callable, Sequence, Set

from millstream.connectors.stream_reader import InputMessage
from millstream.engine.clock import ManualClock
from millstream.engine.codecs import IntCodec
from millstream.engine.computation import Computation
from millstream.engine.config import MillstreamConfig
from millstream.engine.context import Context
from millstream.engine.productions import Production
from millstream.engine.protocol import Delivery, IntervalWorker, Rejected
from millstream.engine.records import (
    Record,
    decode_record,
    encode_record,
    injector_record_id,
    production_record_id,
)
from millstream.engine.stores.memory.store import MemoryIntervalStore
from millstream.engine.topology import ComputationOptions, ComputationSpec, InputStream
from millstream.spark.executor import message_router, tune_collector

STREAM = "events"
OUTPUT = "counts"


class Count(Computation):
    """``bench/throughput.py``'s keyed count: the key's new count, produced per record."""

    def process_record(self, ctx: Context, record: Record) -> None:
        state = ctx.state(IntCodec())
        count = state.get(0) + 1
        state.set(count)
        ctx.produce(OUTPUT, str(count).encode(), record.timestamp)


class AcknowledgingSink:
    """Acknowledges every production and keeps none of them."""

    def send(self, productions: Sequence[Production], timeout: float) -> Set[bytes]:
        return {production.record_id for production in productions}


def messages(records: int, keys: int) -> list[InputMessage]:
    """``records`` envelopes over ``keys`` keys, one partition, as the Kafka reader yields them."""
    return [
        InputMessage(
            STREAM,
            0,
            offset,
            1_700_000_000_000,
            None,
            encode_record(
                Record(
                    f"key-{offset % keys}",
                    b"v" * 16,
                    1_700_000_000_000_000 + offset,
                    injector_record_id(STREAM, 0, offset),
                )
            ),
        )
        for offset in range(records)
    ]


def spec(strong: bool = True) -> ComputationSpec:
    return ComputationSpec(
        name="count",
        computation=Count(),
        inputs=(InputStream(STREAM),),
        outputs=(OUTPUT,),
        options=ComputationOptions(key_intervals=1, strong_productions=strong),
    )


def floor(batch: list[InputMessage]) -> dict[str, int]:
    """The floor's counts per key (its outputs made and dropped)."""
    counts: dict[str, int] = {}
    out: list[bytes] = []
    for message in batch:
        assert message.value is not None
        record = decode_record(message.value)
        count = counts.get(record.key, 0) + 1
        counts[record.key] = count
        record_id = production_record_id("count", record.record_id, 0)
        out.append(
            encode_record(Record(record.key, str(count).encode(), record.timestamp, record_id))
        )
    return counts


def routing(batch: list[InputMessage]) -> list[Delivery | Rejected]:
    route = message_router(spec())
    return [route(message)[1] for message in batch]


def protocol(deliveries: list[Delivery | Rejected], strong: bool = True) -> dict[str, int]:
    """The counts per key the batch committed."""
    clock = ManualClock(1_700_000_000_000_000)
    store = MemoryIntervalStore(clock)
    worker = IntervalWorker(spec(strong), 0, store=store, sink=AcknowledgingSink(), clock=clock)
    result = worker.process(deliveries, 0)
    if result.processed != len(deliveries):
        raise RuntimeError(f"processed {result.processed} of {len(deliveries)} records")
    codec = IntCodec()
    return {key: codec.decode(value) for key, value in store.states("count").items()}


def cpu_seconds(steps: dict[str, Callable[[], object]], runs: int) -> dict[str, float]:
    """The least CPU time of ``runs`` runs of each step, the steps taking turns (so that
    what else the machine does weighs on each alike), each from a collected heap."""
    best = dict.fromkeys(steps, float("inf"))
    for _ in range(runs):
        for name, step in steps.items():
            gc.collect()
            started = time.process_time()
            step()
            best[name] = min(best[name], time.process_time() - started)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=5, help="runs of each step (best shown)")
    parser.add_argument("--weak", action="store_true", help="weak productions, not strong")
    args = parser.parse_args()
    strong = not args.weak
    tune_collector(MillstreamConfig().executor_gc_threshold)
    batch = messages(args.records, args.keys)
    deliveries = routing(batch)
    if protocol(deliveries, strong) != floor(batch):
        raise RuntimeError("the protocol's counts differ from the floor's")
    figures = cpu_seconds(
        {
            "floor": lambda: floor(batch),
            "routing": lambda: routing(batch),
            "protocol": lambda: protocol(deliveries, strong),
        },
        args.runs,
    )
    base = figures["floor"]
    print(
        f"record path: {args.records:,} records over {args.keys:,} keys, one interval, "
        f"{'strong' if strong else 'weak'} productions, CPU µs a record, best of {args.runs}"
    )
    for name, seconds in figures.items():
        print(f"  {name:<10} {seconds / args.records * 1e6:7.2f}   x{seconds / base:.2f} floor")
    total = figures["routing"] + figures["protocol"]
    print(f"  {'millstream':<10} {total / args.records * 1e6:7.2f}   x{total / base:.2f} floor")


if __name__ == "__main__":
    main()
