"""An injector process's checkpoint: its source position, fenced by a sequencer (paper 6.2).

The checkpoint lives in the interval store, as the state of one key in a partition of its
own (computation ``injector/<name>/<process>``, interval 0), so it gets the store's whole
protocol: a process *acquires* the partition when it starts, which moves the sequencer, and
every checkpoint it writes carries ``IF sequencer = mine``. Two copies of one process (a
restarted one and a zombie that was only paused) can therefore never both advance it: the
older copy's next checkpoint fails with :class:`~millstream.engine.errors.InjectorFencedError`
and it stops. A write with an unknown outcome is resolved before the process goes on: the
:class:`~millstream.engine.errors.UnknownOutcomeError` propagates (an outage, which the process
waits out, :mod:`millstream.engine.outages`), and the next :meth:`CheckpointStore.save` asks
``was_applied`` before it writes anything else, however long Cassandra was away meanwhile.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from millstream.engine.errors import (
    FencedError,
    InjectorError,
    InjectorFencedError,
    UnknownOutcomeError,
)
from millstream.engine.records import MIN_EVENT_TIME
from millstream.engine.sequencer import Lease
from millstream.engine.state import KeyChanges
from millstream.engine.store import IntervalStore
from millstream.injectors.source import Position

__all__ = ["Checkpoint", "CheckpointStore", "checkpoint_partition"]

_KEY = "checkpoint"
_VERSION = 1
# Checkpoints carry no dedup IDs; the store still wants a TTL for them.
_NO_DEDUP_TTL = 1


def checkpoint_partition(injector: str, process: str) -> str:
    """The store's computation name under which one injector process checkpoints."""
    return f"injector/{injector}/{process}"


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """What a process resumes from: the source position and the watermark it reported."""

    position: Position | None = None
    watermark: int = MIN_EVENT_TIME

    def encode(self) -> bytes:
        document: dict[str, Any] = {
            "version": _VERSION,
            "position": None if self.position is None else dict(self.position),
            "watermark": self.watermark,
        }
        try:
            return json.dumps(document, separators=(",", ":"), sort_keys=True).encode()
        except (TypeError, ValueError) as exc:
            raise InjectorError(
                f"the source's position {self.position!r} is not JSON ({exc}); a position "
                "must be a dict of plain values (str, int, float, bool, lists, dicts)"
            ) from exc

    @classmethod
    def decode(cls, data: bytes) -> Checkpoint:
        try:
            document = json.loads(data)
            if document["version"] != _VERSION:
                raise ValueError(f"version {document['version']!r}, expected {_VERSION}")
            watermark = document["watermark"]
            if not isinstance(watermark, int):
                raise ValueError(f"watermark {watermark!r} is not an integer")
            return cls(document["position"], watermark)
        except (ValueError, TypeError, KeyError) as exc:
            raise InjectorError(
                f"the stored injector checkpoint is unreadable ({exc}): {data[:200]!r}; "
                "delete it to start the injector from its source's beginning"
            ) from exc


class CheckpointStore:
    """One injector process's fenced checkpoint; see the module docstring."""

    def __init__(self, store: IntervalStore, injector: str, process: str) -> None:
        self.store = store
        self.partition = checkpoint_partition(injector, process)
        self._lease: Lease | None = None
        # The marker of a write whose outcome is unknown, and what it wrote.
        self._unresolved: tuple[bytes, Checkpoint] | None = None

    @property
    def token(self) -> int:
        """The sequencer this process holds (grows with every start of the process)."""
        if self._lease is None:
            raise InjectorError("the checkpoint was not acquired: call acquire() first")
        return self._lease.token

    def acquire(self) -> Checkpoint:
        """Take the checkpoint over from any earlier copy and read it."""
        self._lease = self.store.acquire(self.partition, 0)
        # A new lease fences any write of the old one whose outcome was unknown.
        self._unresolved = None
        state = self.store.read_state(self._lease, _KEY)
        return Checkpoint() if state is None else Checkpoint.decode(state)

    def save(self, checkpoint: Checkpoint) -> None:
        """Write ``checkpoint`` if this process still holds the partition.

        A write whose outcome is unknown raises its
        :class:`~millstream.engine.errors.UnknownOutcomeError`; call ``save`` again (with the
        same checkpoint, after a wait): it first resolves that write with ``was_applied``, as
        the store's contract demands before any other write, and writes again only if it did
        not apply. A failure of the resolution itself (Cassandra down) leaves it pending.
        """
        lease = self._lease
        if lease is None:
            raise InjectorError("the checkpoint was not acquired: call acquire() first")
        try:
            if self._unresolved is not None:
                marker, pending = self._unresolved
                applied = self.store.was_applied(lease, marker)
                self._unresolved = None
                if applied and pending == checkpoint:
                    return
            try:
                self.store.commit(
                    lease,
                    [KeyChanges(_KEY, state=checkpoint.encode())],
                    dedup_ttl=_NO_DEDUP_TTL,
                )
            except UnknownOutcomeError as exc:
                self._unresolved = (exc.marker, checkpoint)
                raise
        except FencedError as exc:
            raise self._fenced() from exc

    def _fenced(self) -> InjectorFencedError:
        return InjectorFencedError(
            f"another process took over {self.partition!r} (its sequencer moved past "
            f"{self.token}): this copy is a zombie and stops without checkpointing"
        )
