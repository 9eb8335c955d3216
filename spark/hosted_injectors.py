"""The injectors a running topology hosts on threads of its driver (paper 5.2), stopped with
it (:meth:`~millstream.spark.runner.RunningTopology.add_injector`)."""

from __future__ import annotations

import logging
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass, replace

from millstream.engine.config import MillstreamConfig, RunSettings
from millstream.engine.errors import TopologyError
from millstream.injectors.connect import connect_injector
from millstream.injectors.process import InjectorOptions, InjectorProcess
from millstream.injectors.source import Source

__all__ = ["HostedInjectors"]

_log = logging.getLogger(__name__)


@dataclass
class _Hosted:
    """An injector process and the driver thread it runs on."""

    process: InjectorProcess
    thread: threading.Thread
    failure: BaseException | None = None


class HostedInjectors:
    """The injector processes of one running topology, by name.

    Each is connected as ``connect_injector`` connects one (its checkpoint in the run's
    keyspace, its streams' topics provisioned; no metrics endpoint of its own) and runs on a
    thread of the driver until its source is exhausted or :meth:`stop`. A failure stops the
    injector alone, and is kept for :meth:`failure`.
    """

    def __init__(self, config: MillstreamConfig, settings: RunSettings) -> None:
        self._config = config
        self._settings = replace(settings, metrics_port=0)
        self._lock = threading.Lock()
        self._hosted: dict[str, _Hosted] = {}
        # The injectors' connections, closed by stop().
        self._connections = ExitStack()

    def add(
        self, name: str, source: Source, options: InjectorOptions | None = None
    ) -> InjectorProcess:
        """Connect injector ``name`` over ``source`` and start it on a thread of its own."""
        with self._lock:
            if name in self._hosted:
                raise TopologyError(f"injector {name!r} already runs under this topology")
        process = self._connections.enter_context(
            connect_injector(self._config, name, source, options, self._settings)
        )
        # A daemon: an injector whose source ignores stop() is left behind by stop(), and
        # must not then hold the driver's interpreter from exiting.
        thread = threading.Thread(
            target=self._run, args=(name,), name=f"injector-{name}", daemon=True
        )
        with self._lock:
            self._hosted[name] = _Hosted(process, thread)
        thread.start()
        return process

    @property
    def processes(self) -> dict[str, InjectorProcess]:
        """Every injector process added, by name (stopped ones too)."""
        with self._lock:
            return {name: hosted.process for name, hosted in self._hosted.items()}

    def failure(self) -> BaseException | None:
        """The error the first injector that stopped with one stopped with, if any."""
        with self._lock:
            hosted = list(self._hosted.values())
        return next((one.failure for one in hosted if one.failure is not None), None)

    def stop(self, timeout: float = 60.0) -> None:
        """Stop every injector, wait up to ``timeout`` seconds for their threads, and close
        their connections.

        An injector whose thread is still running then (its source's ``poll`` ignoring its
        timeout) is logged and left behind: its thread does not keep the process alive, and
        what it read but did not checkpoint is read again by its next run.
        """
        with self._lock:
            hosted = list(self._hosted.values())
        for one in hosted:
            one.process.stop()
        deadline = time.monotonic() + timeout
        for one in hosted:
            one.thread.join(max(0.0, deadline - time.monotonic()))
            if one.thread.is_alive():
                _log.warning(
                    "injector %r did not stop within %s s; closing its connections under it "
                    "and leaving its thread behind",
                    one.process.name,
                    timeout,
                )
        self._connections.close()

    def _run(self, name: str) -> None:
        hosted = self._hosted[name]
        try:
            hosted.process.run(until_exhausted=True)
        except BaseException as exc:  # raised on the caller's thread by failure()
            _log.error("injector %r stopped with an error: %r", name, exc)
            hosted.failure = exc
