"""Weak productions (paper 5.3): a batch sends them before it commits, and checkpoints only
those the sink did not acknowledge in time (step 5 of :mod:`millstream.engine.protocol`)."""

from __future__ import annotations

import threading
from collections.abc import Set
from typing import Final

from millstream.engine.productions import Production, ProductionSink
from millstream.engine.state import KeyChanges

__all__ = ["WEAK_SEND_CHUNK", "WeakSends"]

WEAK_SEND_CHUNK: Final = 1024
"""Weak productions a batch's keys make before the batch starts sending them, on a thread of
its own, while its later keys run (step 5). A smaller batch sends them all once its keys have
run, on the worker's thread, in one send."""


class WeakSends:
    """Step 5's sends for one batch: its weak productions (:attr:`outbox`, each with the
    changes of the key that made it, where it is checkpointed if not acknowledged in time).

    Once the keys have made :data:`WEAK_SEND_CHUNK` productions not handed on yet, a thread
    sends them (:meth:`key_done`) while the next keys run, one send at a time, in key order:
    the sends' waits for acknowledgements then overlap user code instead of following it.
    A chunk that comes back with a production unacknowledged (a slow or absent broker) stops
    the thread: the rest go in :meth:`finish`'s one send, so after its keys ran a batch waits
    at most twice ``weak_production_delay`` (the chunk in flight, then that send), and only
    that once however many chunks it made.
    """

    def __init__(self, sink: ProductionSink, delay: float) -> None:
        self.outbox: list[tuple[KeyChanges, Production]] = []
        self._sink = sink
        self._delay = delay
        self._handed = 0  # outbox entries handed to the thread
        self._queued: list[Production] = []  # handed, not sent yet
        self._acked: set[bytes] = set()
        self._error: BaseException | None = None
        self._stopped = False  # the thread sends nothing more
        self._closing = False  # no more chunks will come
        self._ready = threading.Condition()
        self._thread: threading.Thread | None = None

    def key_done(self) -> None:
        """After a key's calls: hand the productions made since the last chunk to the thread,
        if they make a chunk and the thread still sends."""
        if self._stopped or len(self.outbox) - self._handed < WEAK_SEND_CHUNK:
            return
        chunk = [production for _, production in self.outbox[self._handed :]]
        self._handed = len(self.outbox)
        with self._ready:
            self._queued.extend(chunk)
            self._ready.notify()
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="millstream-weak-sends", daemon=True
            )
            self._thread.start()

    def _run(self) -> None:
        while True:
            with self._ready:
                while not self._queued and not self._closing:
                    self._ready.wait()
                if self._stopped or not self._queued:
                    return
                chunk, self._queued = self._queued, []
            try:
                acked = self._sink.send(chunk, self._delay)
            except BaseException as exc:  # raised by finish(), in the worker's thread
                self._error = exc
                self._stopped = True
                return
            self._acked.update(acked)
            if any(production.record_id not in acked for production in chunk):
                self._stopped = True
                return

    def finish(self) -> Set[bytes]:
        """Wait for the thread's sends, then send what it did not in one send; the IDs of the
        productions acknowledged. Raises what a send raised."""
        if self._thread is not None:
            with self._ready:
                self._closing = True
                self._ready.notify()
            self._thread.join()
            if self._error is not None:
                raise self._error
        rest = [*self._queued, *(production for _, production in self.outbox[self._handed :])]
        self._queued = []
        if rest:
            self._acked.update(self._sink.send(rest, self._delay))
        return self._acked

    def abandon(self) -> None:
        """The batch failed: the thread ends the send it is in and sends nothing more."""
        if self._thread is not None:
            with self._ready:
                self._stopped = self._closing = True
                self._queued = []
                self._ready.notify()
            self._thread.join()
