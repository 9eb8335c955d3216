"""A computation query's checkpoint directory, as millstream reads and fences it.

Spark keeps a query's write-ahead log there: ``offsets/<batch>`` (the batch's Kafka range,
written before the batch runs) and ``commits/<batch>`` (written after), and each Kafka
source's offsets at the query's very start (``sources/<source>/0``). millstream reads the
offset log for each batch's end offsets and the sources' for where the first batch starts,
and adds one file of its own, the *claim*
(``millstream-driver``): the driver that started the query last writes its id there.

Two drivers can run one query for a while: a driver stopped for long (a SIGSTOP, a GC pause,
a network cut) that comes back after a supervisor started its successor is a *zombie*.
Spark's own fence lets the first writer of a batch's log entry win and fails the other
query with ``CONCURRENT_STREAM_LOG_UPDATE``; which one loses is a race, so the successor can
lose to a zombie that resumed right before its next entry. The claim settles who stays:

- a driver whose claim was overwritten is the zombie: it stops at its next batch
  (:func:`fence_checkpoint`) before it acquires any interval, and when it loses a race;
- the driver that holds the claim restarts its query after a race it lost
  (:meth:`RunningTopology.raise_failure <millstream.spark.runner.RunningTopology.raise_failure>`):
  the restarted query runs the batch the zombie logged, whose records the sequencers and
  dedup keep exactly once.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Final

from millstream.engine.errors import FencedError, TopologyError

__all__ = [
    "CLAIM_FILE",
    "MEMBERS_FILE",
    "admit_members",
    "batch_offsets",
    "checkpoint_holder",
    "claim_checkpoint",
    "fence_checkpoint",
    "initial_offsets",
    "latest_batch",
    "lost_checkpoint_race",
    "query_members",
]

CLAIM_FILE: Final = "millstream-driver"
MEMBERS_FILE: Final = "millstream-computations"
"""In the checkpoint of a topology's one query (``RunSettings.one_query``): the computations
it ran last, as a JSON list."""

# What a query's error says when another driver wrote or claimed its checkpoint: Spark's
# fence (a second writer of one batch's log entry), or ours (:func:`fence_checkpoint`).
_SPARK_RACE: Final = "CONCURRENT_STREAM_LOG_UPDATE"
_MOVED_PAST: Final = "has moved past batch"
_TOOK_OVER: Final = "took over computation"


def claim_checkpoint(checkpoint: Path, driver: str) -> None:
    """Make ``driver`` the holder of the query's checkpoint (it starts the query now): any
    other driver still running the query is a zombie from here on."""
    checkpoint.mkdir(parents=True, exist_ok=True)
    # Written whole, then renamed over the claim: a reader sees the old id or the new one.
    written = checkpoint / f".{CLAIM_FILE}.{uuid.uuid4().hex}"
    written.write_text(driver, encoding="utf-8")
    os.replace(written, checkpoint / CLAIM_FILE)


def checkpoint_holder(checkpoint: Path) -> str | None:
    """The driver that started the query last (``None``: no driver claimed it yet)."""
    try:
        return (checkpoint / CLAIM_FILE).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None


def fence_checkpoint(
    checkpoint: Path, batch_id: int, computation: str, driver: str | None = None
) -> None:
    """Raise :class:`~millstream.engine.errors.FencedError` if this driver may no longer run
    ``batch_id``: another driver claimed the query (``driver`` is this one's id), or took its
    checkpoint past the batch (it logged the next batch's offsets or committed this one,
    which the driver running ``batch_id`` never does itself before it returns).

    Spark's own fence (two writers of one batch's log entry) acts only when a zombie writes
    its next entry, after its ``foreachBatch`` ran; this stops it before.
    """
    holder = checkpoint_holder(checkpoint)
    if driver is not None and holder is not None and holder != driver:
        raise FencedError(
            f"driver {holder} {_TOOK_OVER} {computation!r} (its checkpoint "
            f"{checkpoint}) while this driver ({driver}) ran batch {batch_id}; this driver is "
            "a zombie (it was stopped or cut off) and stops, leaving the work to the other"
        )
    if (checkpoint / "offsets" / str(batch_id + 1)).exists() or (
        checkpoint / "commits" / str(batch_id)
    ).exists():
        raise FencedError(
            f"another driver runs computation {computation!r}: its checkpoint {checkpoint} "
            f"{_MOVED_PAST} {batch_id}, which this driver was running; this driver is "
            "a zombie (it was stopped or cut off) and stops, leaving the work to the other"
        )


def lost_checkpoint_race(error: BaseException | str) -> bool:
    """Whether a query stopped because another driver wrote its checkpoint first or claimed
    it (:func:`checkpoint_holder` then tells which of the two drivers is the zombie)."""
    text = str(error)
    return any(marker in text for marker in (_SPARK_RACE, _MOVED_PAST, _TOOK_OVER))


def batch_offsets(checkpoint: Path, batch_id: int) -> dict[str, dict[int, int]] | None:
    """The Kafka end offsets of a batch, from the query's offset log (``None``: no entry).

    The log is Spark's write-ahead record of each batch's range: a version line, a metadata
    line, then one JSON line per source (``{"topic": {"partition": offset}}``).
    """
    file = checkpoint / "offsets" / str(batch_id)
    try:
        lines = file.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return None
    if len(lines) < 3 or not lines[0].startswith("v"):
        raise TopologyError(
            f"cannot read Spark's offset log entry {file}: unexpected layout {lines[:1]!r}; "
            "this Spark version is not supported by millstream"
        )
    offsets: dict[str, dict[int, int]] = {}
    for line in lines[2:]:
        if line.strip() in ("", "-"):
            continue
        try:
            _add_offsets(offsets, line)
        except (ValueError, AttributeError) as exc:
            raise TopologyError(f"cannot read Spark's offset log entry {file}: {exc}") from exc
    return offsets


def _add_offsets(offsets: dict[str, dict[int, int]], line: str) -> None:
    """Add one JSON line of Spark's, ``{"topic": {"partition": offset}}``, to ``offsets``;
    raises ``ValueError`` or ``AttributeError`` on anything else."""
    for topic, partitions in json.loads(line).items():
        offsets.setdefault(topic, {}).update({int(p): int(o) for p, o in partitions.items()})


def initial_offsets(checkpoint: Path) -> dict[str, dict[int, int]]:
    """Where the query's Kafka sources started its first batch, from their initial offset
    files (``sources/<source>/0``; empty if Spark wrote none, as before a first batch).

    Spark's Kafka source resolves its ``startingOffsets`` (``earliest``, say) to numbers once,
    at the query's start, and writes them there before the first batch: a NUL byte (kept for
    Spark 2.1.0), a version line, then ``{"topic": {"partition": offset}}``. They are the
    first batch's start exactly, where asking Kafka for its earliest offsets later would
    cost a round trip and could find that retention moved them.
    """
    offsets: dict[str, dict[int, int]] = {}
    try:
        sources = sorted(os.listdir(checkpoint / "sources"))
    except FileNotFoundError:
        return offsets
    for source in sources:
        file = checkpoint / "sources" / source / "0"
        try:
            text = file.read_text(encoding="utf-8")
        except FileNotFoundError:
            continue
        version, _, body = text.lstrip("\0").partition("\n")
        try:
            if not version.startswith("v"):
                raise ValueError(f"unexpected version line {version[:20]!r}")
            _add_offsets(offsets, body)
        except (ValueError, AttributeError) as exc:
            raise TopologyError(
                f"cannot read Spark's initial offsets {file}: {exc}; "
                "this Spark version is not supported by millstream"
            ) from exc
    return offsets


def latest_batch(checkpoint: Path) -> int | None:
    """The id of the query's latest batch in its offset log (``None``: none yet)."""
    try:
        names = os.listdir(checkpoint / "offsets")
    except FileNotFoundError:
        return None
    ids = [int(name) for name in names if name.isdigit()]
    return max(ids) if ids else None


def query_members(checkpoint: Path) -> set[str]:
    """The computations the topology query checkpointed in ``checkpoint`` ran last (none: it
    never ran), as :func:`admit_members` recorded them."""
    try:
        return set(json.loads((checkpoint / MEMBERS_FILE).read_text(encoding="utf-8")))
    except FileNotFoundError:
        return set()


def admit_members(checkpoint: Path, members: Mapping[str, Iterable[str]]) -> None:
    """Record ``members`` (computation: its input topics) as the computations of the
    topology query checkpointed in ``checkpoint``, or raise
    :class:`~millstream.engine.errors.TopologyError` if one of them cannot join it.

    The query's offset log is shared by its computations: a topic's offsets are where all of
    them are. A computation new to the query would start a topic the query read before at
    the query's offset, not at the topic's start, and miss what was read without it: refused.
    One whose topics are all new to the query starts them at their earliest offsets, as
    Spark's Kafka source starts a partition new to a checkpoint, and joins. A computation
    taken out simply is not listed any more (coming back, it is new again).
    """
    latest = latest_batch(checkpoint)
    if latest is not None:
        read = batch_offsets(checkpoint, latest) or {}
        known = query_members(checkpoint)
        for name, topics in sorted(members.items()):
            shared = sorted(topic for topic in set(topics) if topic in read)
            if name not in known and shared:
                raise TopologyError(
                    f"computation {name!r} cannot join the topology's one query "
                    f"({checkpoint}): it did not run in it before, and the query has already "
                    f"read {', '.join(shared)} past what {name!r} has seen. Run the topology "
                    "with one_query = false, or give it a new checkpoint_root and keyspace to "
                    "start over"
                )
    checkpoint.mkdir(parents=True, exist_ok=True)
    written = checkpoint / f".{MEMBERS_FILE}.{uuid.uuid4().hex}"
    written.write_text(json.dumps(sorted(members)), encoding="utf-8")
    os.replace(written, checkpoint / MEMBERS_FILE)
