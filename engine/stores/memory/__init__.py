"""The in-process interval store, for tests and the testing helpers."""

from millstream.engine.stores.memory.store import (
    DEFAULT_MAX_BATCH_BYTES,
    LATE_ROUNDS,
    AppliedCommit,
    FaultPoint,
    InjectedCrash,
    MemoryIntervalStore,
    UnknownOutcome,
)

__all__ = [
    "DEFAULT_MAX_BATCH_BYTES",
    "LATE_ROUNDS",
    "AppliedCommit",
    "FaultPoint",
    "InjectedCrash",
    "MemoryIntervalStore",
    "UnknownOutcome",
]
