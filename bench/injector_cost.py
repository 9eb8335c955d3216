"""What bringing a steady trickle of events into Kafka costs the machine, by way of doing it.

    python bench/injector_cost.py [--rate 200] [--seconds 20] [--rounds 2]

Three ways bring ``--rate`` events a second into a fresh topic for ``--seconds``, taking
turns for ``--rounds`` rounds, each in a process of its own:

* ``producer``, the floor: a plain Kafka producer (millstream's producer settings) that
  sends each event as it comes and waits for nothing until the end, what a user without
  millstream would run. It has no checkpoint: after a crash it cannot tell what it sent;
* ``injector, every poll``: millstream's injector checkpointing and reporting after every
  poll (``checkpoint_interval=0``, how it ran before 2026-12-05);
* ``injector``: millstream's injector as it runs by default
  (:data:`~millstream.injectors.process.DEFAULT_CHECKPOINT_INTERVAL`).

The events are paced by the benchmarks' own source (``bench.harness.GeneratedEvents``: each
poll returns the events due by then, so at a few hundred a second a poll holds one or two).
Prints, per way, the median over the rounds of the CPU cores it kept busy from its first poll
until Kafka had every event (start-up left out: connections, the checkpoint's keyspace): the
local stack's Kafka and Cassandra (read from /proc as the process says it starts and ends)
and the process itself, and the ratio of the total to the floor's. Needs the local stack
(``millstream up``).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `bench.*` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import (
    GeneratedEvents,
    drop_keyspace,
    inject_events,
    process_cpu,
    stack_services,
    unique_suffix,
)
from millstream.connectors import kafka as kafka_connector
from millstream.engine.config import MillstreamConfig, load_config
from millstream.engine.records import Record, encode_record, injector_record_id
from millstream.injectors.process import InjectorOptions

WAYS = ("producer", "injector, every poll", "injector")


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _say(**fields: float) -> None:
    """A line for the parent: it reads the services' CPU as each one arrives."""
    print(json.dumps(fields), flush=True)


def _run_way(config: MillstreamConfig, way: str, topic: str, rate: float, seconds: float) -> None:
    """Bring the events in one ``way``, saying when the first poll starts (after the
    connections, the checkpoint's keyspace and the injector's start) and when Kafka has them
    all, with this process's CPU seconds then."""
    count = int(rate * seconds)
    name = f"bench_{uuid.uuid4().hex[:8]}"
    if way == "producer":
        source = GeneratedEvents(name, topic, count, rate)
        source.open(None)
        producer = kafka_connector.producer(config)
        failed: list[str] = []

        def delivered(error: object, _message: object) -> None:
            if error is not None:
                failed.append(str(error))

        started = time.monotonic()
        _say(cpu=_cpu())
        while not source.done:
            for item in source.poll(0.2).records:
                record_id = injector_record_id(name, item.origin, item.offset)
                envelope = encode_record(Record(item.key, item.value, item.timestamp, record_id))
                producer.produce(
                    topic, key=item.key.encode(), value=envelope, on_delivery=delivered
                )
            producer.poll(0)
        if producer.flush(30) != 0 or failed:
            raise SystemExit(f"Kafka did not take every event within 30 s: {failed[:3]}")
        _say(cpu=_cpu(), events=count, wall=time.monotonic() - started, checkpoints=0)
        return
    options = InjectorOptions(checkpoint_interval=0) if way == "injector, every poll" else None
    keyspace = f"injcost_{uuid.uuid4().hex[:8]}"
    try:
        injection = inject_events(
            config,
            topic,
            count,
            rate,
            keyspace=keyspace,
            name=name,
            options=options,
            on_start=lambda: _say(cpu=_cpu()),
        )
        _say(
            cpu=_cpu(),
            events=injection.stats.emitted,
            wall=injection.seconds,
            checkpoints=injection.stats.checkpoints,
        )
    finally:
        drop_keyspace(config, keyspace)


def _one_round(
    config: MillstreamConfig, way: str, rate: float, seconds: float, services: dict[str, int]
) -> dict[str, float]:
    """One way in a child process: the cores it and each service kept busy from its first
    poll until Kafka had every event."""
    topic = f"injcost_{unique_suffix()}"
    kafka_connector.create_topics(config, [topic], partitions=2)
    try:
        child = subprocess.Popen(
            [sys.executable, __file__, "--way", way, "--topic", topic, "--rate", str(rate),
             "--seconds", str(seconds)],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert child.stdout is not None
        said = []
        readings = []
        for line in child.stdout:
            said.append(json.loads(line))
            readings.append({name: process_cpu(pid) or 0.0 for name, pid in services.items()})
        if child.wait() != 0 or len(said) != 2:
            raise SystemExit(f"{way} failed (exit status {child.returncode}); its errors above")
    finally:
        kafka_connector.delete_topics(config, [topic])
    first, last = said
    wall = last["wall"]
    cores = {name: (readings[1][name] - readings[0][name]) / wall for name in services}
    cores["process"] = (last["cpu"] - first["cpu"]) / wall
    cores["events/s"] = last["events"] / wall
    cores["checkpoints/s"] = last["checkpoints"] / wall
    return cores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=200.0, help="events a second")
    parser.add_argument("--seconds", type=float, default=20.0, help="seconds a way runs")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--way", choices=WAYS, help=argparse.SUPPRESS)  # a child's one way
    parser.add_argument("--topic", help=argparse.SUPPRESS)
    args = parser.parse_args()
    config = load_config()
    if args.way is not None:
        _run_way(config, args.way, args.topic, args.rate, args.seconds)
        return
    services = stack_services(config)
    if not services:
        raise SystemExit("no local stack running: start it with `millstream up`")
    rounds: dict[str, list[dict[str, float]]] = {way: [] for way in WAYS}
    for number in range(args.rounds):
        order = WAYS if number % 2 == 0 else tuple(reversed(WAYS))
        for way in order:
            result = _one_round(config, way, args.rate, args.seconds, services)
            rounds[way].append(result)
            print(f"  round {number + 1}, {way}: " + ", ".join(
                f"{name} {value:.2f}" for name, value in result.items()), flush=True)  # fmt: skip
    columns = [*services, "process"]
    print(
        f"\n{args.rate:,.0f} events/s for {args.seconds:.0f} s, median of {args.rounds} rounds; "
        "cores busy (of the machine's) while each way ran"
    )
    header = f"{'way':<22}{'events/s':>10}{'ckpt/s':>8}" + "".join(f"{c:>11}" for c in columns)
    print(header + f"{'total':>9}{'x floor':>9}")
    print("-" * (len(header) + 18))
    totals = {
        way: statistics.median(sum(r[c] for c in columns) for r in results)
        for way, results in rounds.items()
    }
    for way, results in rounds.items():
        cells = "".join(f"{statistics.median(r[c] for r in results):>11.3f}" for c in columns)
        print(
            f"{way:<22}{statistics.median(r['events/s'] for r in results):>10,.0f}"
            f"{statistics.median(r['checkpoints/s'] for r in results):>8.1f}{cells}"
            f"{totals[way]:>9.3f}{totals[way] / totals['producer']:>9.2f}"
        )


if __name__ == "__main__":
    main()
