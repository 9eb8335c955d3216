"""What user code sees while it runs for one key: the :class:`Context`.

A context is scoped to one call (one input record or one timer firing) for one key. Every
change made through it (state, timers, productions) is pending until the engine commits the
key's changes atomically, together with the record's dedup ID; if the call raises, none of
them happen and the input becomes a dead letter. User code must not keep per-key data
anywhere else: only what goes through the context survives a retry on another worker.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Generic, TypeVar, overload

from millstream.engine.clock import Clock
from millstream.engine.codecs import Codec
from millstream.engine.records import Record
from millstream.engine.timers import TimeDomain, Timer

__all__ = ["Context", "TypedState"]

T = TypeVar("T")
D = TypeVar("D")


class Context(ABC):
    """The per-key API of a running call: state, timers, productions, time."""

    @property
    @abstractmethod
    def key(self) -> str:
        """The key this call runs for."""

    @property
    @abstractmethod
    def input_low_watermark(self) -> int:
        """Bound on the timestamps of future input: later records have timestamps >= this.

        A record with a smaller timestamp is late; the computation decides what to do with it.
        """

    @property
    @abstractmethod
    def clock(self) -> Clock:
        """The engine's injected wall clock; use it rather than reading the system time."""

    @abstractmethod
    def get_state(self) -> bytes | None:
        """The key's state as this call sees it, or ``None`` if it has none."""

    @abstractmethod
    def set_state(self, value: bytes) -> None:
        """Replace the key's state (pending until the commit)."""

    @abstractmethod
    def clear_state(self) -> None:
        """Remove the key's state (pending until the commit)."""

    def state(self, codec: Codec[T]) -> TypedState[T]:
        """Typed access to the key's state through ``codec``."""
        return TypedState(self, codec)

    @abstractmethod
    def timer(self, tag: str) -> Timer | None:
        """The key's timer named ``tag``, if one is set."""

    @abstractmethod
    def set_timer(
        self, tag: str, timestamp: int, domain: TimeDomain = TimeDomain.EVENT_TIME
    ) -> None:
        """Set (or replace) the key's timer ``tag`` to fire at ``timestamp`` µs in ``domain``."""

    @abstractmethod
    def delete_timer(self, tag: str) -> None:
        """Delete the key's timer ``tag``; deleting an unset tag does nothing."""

    @abstractmethod
    def produce(self, stream: str, value: bytes, timestamp: int, key: str | None = None) -> Record:
        """Produce a record to a declared output ``stream``; returns it with its record ID.

        ``key`` defaults to the current key. Pick a ``timestamp`` no smaller than those of the
        records it derives from, or downstream watermarks will call it late. Raises
        ``UndeclaredStreamError``, ``OversizedRecordError`` or ``AbsurdTimestampError``.
        """


class TypedState(Generic[T]):
    """A key's state seen through a codec."""

    def __init__(self, context: Context, codec: Codec[T]) -> None:
        self._context = context
        self._codec = codec

    @overload
    def get(self) -> T | None: ...

    @overload
    def get(self, default: D) -> T | D: ...

    def get(self, default: D | None = None) -> T | D | None:
        """The decoded state, or ``default`` if the key has none."""
        raw = self._context.get_state()
        return default if raw is None else self._codec.decode(raw)

    def set(self, value: T) -> None:
        self._context.set_state(self._codec.encode(value))

    def clear(self) -> None:
        self._context.clear_state()
