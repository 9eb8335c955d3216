"""A process's interval workers: made at first use and kept, with their soft state."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from millstream.engine.cache import StateCache
from millstream.engine.clock import Clock
from millstream.engine.layout import IntervalLayout
from millstream.engine.productions import ProductionSink, TransactionalSink
from millstream.engine.protocol import IntervalWorker
from millstream.engine.store import IntervalStore
from millstream.engine.topology import ComputationSpec

__all__ = ["WorkerPool"]


class WorkerPool:
    """The :class:`IntervalWorker` s of one process, made at first use and kept: a worker's
    soft state is what saves its next batch on the interval a rescan (the sequencer tells
    the worker whether it is still valid).

    The workers share ``store``, ``sink``, ``clock``, and ``cache``, ``user_code`` and
    ``transactions`` when given (see :class:`IntervalWorker`). A worker is keyed by ``run``
    (a runtime's token for one declaration of the computation: a computation removed and
    declared again never reuses the workers of the earlier one), the computation and the
    interval.
    """

    def __init__(
        self,
        store: IntervalStore,
        sink: ProductionSink,
        clock: Clock,
        *,
        cache: StateCache | None = None,
        user_code: AbstractContextManager[Any] | None = None,
        transactions: TransactionalSink | None = None,
    ) -> None:
        self.store = store
        self.sink = sink
        self.clock = clock
        self.cache = cache
        self.user_code = user_code
        self.transactions = transactions
        self._workers: dict[tuple[str, str, int], IntervalWorker] = {}

    def worker(
        self,
        spec: ComputationSpec,
        interval: int,
        layout: IntervalLayout | None = None,
        *,
        run: str = "",
    ) -> tuple[IntervalWorker, bool]:
        """The worker of ``spec``'s ``interval``, told the current ``layout`` (if given), and
        whether it was made before (its soft state may be reused)."""
        key = (run, spec.name, interval)
        worker = self._workers.get(key)
        if worker is None:
            worker = IntervalWorker(
                spec,
                interval,
                store=self.store,
                sink=self.sink,
                clock=self.clock,
                cache=self.cache,
                user_code=self.user_code,
                layout=layout,
                transactions=self.transactions,
            )
            self._workers[key] = worker
            return worker, False
        if layout is not None:
            worker.layout = layout  # its own range is the same; the others may have split
        return worker, True

    def existing(
        self, spec: ComputationSpec, interval: int, *, run: str = ""
    ) -> IntervalWorker | None:
        """The worker of ``spec``'s ``interval`` if this pool made one, else ``None``."""
        return self._workers.get((run, spec.name, interval))

    def __len__(self) -> int:
        return len(self._workers)
