"""The proving ground's faults: what each kind does, the tiers of a run, and the seeded
schedule that draws a run's faults (:func:`schedule`)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Final

__all__ = [
    "CRASHES",
    "FAULTS",
    "INPUT_FAULTS",
    "PAUSES",
    "RESOURCE_FAULTS",
    "SPLITS",
    "SPLIT_HOT_SHARE",
    "SPLIT_STEPS",
    "TIERS",
    "TRANSACTION_FAULTS",
    "WORKER_KILLS",
    "Fault",
    "Tier",
    "pause_point",
    "run_kinds",
    "schedule",
]

FAULTS: Final = {
    "driver-batch": "kill -9 of the driver as a micro-batch starts",
    "driver-send": "kill -9 of the driver between a commit and the send of its productions",
    "driver-report": "kill -9 of the driver before it publishes a watermark report",
    "worker": "kill -9 of a Spark Python worker holding an interval's lease",
    "zombie": "SIGSTOP of the driver holding a lease; a new driver takes over; SIGCONT",
    "kafka": "kill -9 of the Kafka broker, the injector restarted meanwhile, then restart",
    "cassandra": "kill -9 of the Cassandra node, the injector restarted meanwhile, then restart",
    "injector": "kill -9 of the injector, then restart from its checkpoint",
    "split": "kill -9 of the driver amid a split or merge of intervals (retired, copied, purged)",
    "split-zombie": "SIGSTOP of the driver amid a split or merge, its sources' keys exported; "
    "a new driver finishes the change and runs on; SIGCONT",
    "driver-transaction": "kill -9 of the driver while a task's productions are in an open "
    "Kafka transaction",
    "worker-transaction": "kill -9 of the Spark Python worker whose productions are in an open "
    "Kafka transaction",
    "driver-delivered": "kill -9 of the driver after a task's Kafka transaction committed, "
    "before its pending rows are deleted",
    "kafka-outage": "the Kafka broker unreachable (SIGSTOP) for a minute, then SIGCONT",
    "cassandra-outage": "the Cassandra node unreachable (SIGSTOP) for a minute, then SIGCONT",
    "disk-full": "the disk under the driver's checkpoints full, then space again (needs root)",
    "poison": "a record the engine fails on, and tombstones, among the input: dead letters",
    "hanging": "a Kafka transaction no coordinator counts left open on tally's output stream "
    "(what a broker's crash can leave): the driver must abort it",
}

# Resource faults: slow (an outage lasts a minute) or needing root (a tmpfs to fill).
RESOURCE_FAULTS: Final = ("kafka-outage", "cassandra-outage", "disk-full")
# Input faults: messages that must not stop a stream (each costs the batch's bisection), and a
# transaction left hanging on an output stream (it waits for the driver's sweep, 30 s apart).
INPUT_FAULTS: Final = ("poison", "hanging")
# Crashes on the transactional path of strong productions (with the other crashes).
TRANSACTION_FAULTS: Final = ("driver-transaction", "worker-transaction", "driver-delivered")
# The crashes every tier runs; the CI tier leaves the resource and input faults out.
CRASHES: Final = tuple(
    kind for kind in FAULTS if kind not in RESOURCE_FAULTS and kind not in INPUT_FAULTS
)

# Where each pause-point fault parks a process, and which computation it waits in.
PAUSES: Final = {
    "driver-batch": "driver.batch",
    "driver-send": "executor.send",
    "driver-report": "driver.report",
    "worker": "executor.commit",
    "zombie": "executor.commit",
    "split": "rebalance.copy",  # or the step the schedule names (Fault.place)
    "split-zombie": "rebalance.export",
    "driver-transaction": "executor.transaction",
    "worker-transaction": "executor.transaction",
    "driver-delivered": "executor.delivered",
}
# The pause-point faults that kill the parked Spark Python worker (the others: the driver).
WORKER_KILLS: Final = ("worker", "worker-transaction")
SPLIT_STEPS: Final = ("rebalance.fence", "rebalance.export", "rebalance.copy", "rebalance.purge")
# The faults that hit a split or merge: tally's intervals then split and merge by load.
SPLITS: Final = ("split", "split-zombie")
SPLIT_HOT_SHARE: Final = 0.8
"""The share of a run's records on one hash range's keys when it has a fault of
:data:`SPLITS`."""


@dataclass(frozen=True, slots=True)
class Tier:
    """A size of run: ``records`` over ``keys`` at ``rate`` per second, ``faults`` of each
    kind."""

    records: int
    keys: int
    rate: float
    faults: int
    kinds: tuple[str, ...] = tuple(FAULTS)
    key_intervals: int = 4


TIERS: Final = {
    # driver-transaction kills in the span driver-send does (after the Cassandra commit,
    # before the Kafka commit), only later in it: the CI tier runs it alone there.
    # 6,000 records: each of its twelve input steps spans a whole 5 s window of event time,
    # so every step closes one and the rollup has a batch for a fault to hit.
    "ci": Tier(
        records=6_000,
        keys=20,
        rate=150.0,
        faults=1,
        kinds=tuple(k for k in CRASHES if k != "driver-send"),
    ),
    "t1": Tier(records=100_000, keys=100, rate=2_000.0, faults=3),
    # About ten minutes: the crashes, the full disk and the input faults, three of each.
    "t2": Tier(
        records=60_000,
        keys=100,
        rate=1_000.0,
        faults=3,
        kinds=(*CRASHES, "disk-full", *INPUT_FAULTS),
    ),
}


@dataclass(frozen=True, slots=True)
class Fault:
    """One scheduled fault: its kind, the computation it aims at, the pause before it."""

    kind: str
    computation: str
    delay: float
    place: str = ""  # the pause point's place, when the kind has several


def run_kinds(tier: Tier, kinds: tuple[str, ...] | None) -> tuple[str, ...]:
    """The kinds a run schedules: ``kinds`` as named, else the tier's."""
    return tier.kinds if kinds is None else kinds


def schedule(seed: int, tier: Tier, kinds: tuple[str, ...] | None = None) -> list[Fault]:
    """The seed's fault schedule: ``tier.faults`` of each kind (default: the tier's), in a
    shuffled order."""
    rng = random.Random(seed)
    faults: list[Fault] = []
    for kind in tier.kinds if kinds is None else kinds:
        for _ in range(tier.faults):
            computation = (
                "tally"
                if kind in ("driver-send", "zombie", *SPLITS, "poison", *TRANSACTION_FAULTS)
                else rng.choice(("tally", "rollup"))
            )
            place = rng.choice(SPLIT_STEPS) if kind == "split" else ""
            faults.append(Fault(kind, computation, round(rng.uniform(0.5, 3.0), 2), place))
    rng.shuffle(faults)
    return faults


def pause_point(fault: Fault) -> str:
    """The pause point where ``fault`` parks its process."""
    return fault.place or PAUSES[fault.kind]
