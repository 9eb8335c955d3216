"""Where a run's logs go: a file of its own under ``<home>/logs``, not the console.

A person running a job wants to see its progress and what needs them, not the chatter of the
libraries under it. :func:`route_logs` (called once by a program: ``millstream run``, the
Zeitgeist job) sends to ``<home>/logs/<name>-<date>-<time>.log``:

- Python logging: every logger from INFO (millstream's own, cassandra-driver's, pyspark's),
  py4j from WARNING, and librdkafka: confluent-kafka clients log through the Python logger
  named :data:`LIBRDKAFKA_LOGGER`, which :func:`~millstream.connectors.kafka.client_settings`
  gives every client;
- the Spark driver's JVM, which :func:`millstream.spark.session.spark_session` starts with
  :meth:`LogRouting.jvm_options` (log4j2 writes to the file, by ``log4j2.properties`` beside
  this module) and with its own stdout and stderr in the file (the JVM's warnings, and the
  stderr of the Python workers of local executors, which share the JVM).

The console (stderr) keeps WARNING and above from millstream's own loggers, one line each: a
record with a traceback shows its message and where the details are, and the traceback goes
to the file. With ``verbose`` every record comes to the console too, tracebacks and the JVM's
logs included. The newest :data:`KEEP` files are kept; older ones are deleted as a run starts.
"""

from __future__ import annotations

import logging
import re
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Final

from millstream.engine.config import MillstreamConfig
from millstream.engine.errors import MillstreamError

__all__ = [
    "KEEP",
    "LIBRDKAFKA_LOGGER",
    "LOG4J2_CONFIG",
    "ConsoleFormatter",
    "LogRouting",
    "active",
    "route_logs",
]

LIBRDKAFKA_LOGGER: Final = "librdkafka"
"""The Python logger confluent-kafka clients log to: librdkafka's own messages, which are
for the log file (a broker down is reported by the operation that cannot finish)."""

LOG4J2_CONFIG: Final = Path(__file__).with_name("log4j2.properties")
"""The driver JVM's log4j2 configuration: everything to ``-Dmillstream.log.file``, to the
console only from the level ``-Dmillstream.log.console`` names (default: nothing)."""

KEEP: Final = 50
"""Log files kept in ``<home>/logs``: a run deletes the oldest beyond these."""

_FILE_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_MAX_CONSOLE_LINE: Final = 240
# A line of an error's text that names an error: "pkg.SomeError: what" (a Python traceback's
# last line, inside a Py4J error's pages of JVM stack too).
_ERROR_LINE: Final = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b: .*")

_lock = threading.Lock()
_active: LogRouting | None = None


@dataclass
class LogRouting:
    """The routing :func:`route_logs` put in place; :meth:`close` takes it away again."""

    path: Path
    verbose: bool
    _handlers: list[logging.Handler] = field(default_factory=list, repr=False)
    _levels: dict[str, int] = field(default_factory=dict, repr=False)

    def jvm_options(self) -> str:
        """The driver JVM's options that send its log4j2 logs to :attr:`path` (and, verbose,
        its warnings to the console too), quoted for ``spark.driver.extraJavaOptions``."""
        console = "warn" if self.verbose else "off"
        return " ".join(
            (
                _java_option("log4j2.configurationFile", str(LOG4J2_CONFIG)),
                _java_option("millstream.log.file", str(self.path)),
                _java_option("millstream.log.console", console),
            )
        )

    def where(self) -> str:
        """Where the logs go, said once as a run starts."""
        if self.verbose:
            return f"logs go to {self.path} and here"
        return f"logs go to {self.path} (--verbose shows them here too)"

    def failed(self, exc: BaseException) -> str:
        """Write ``exc`` and its traceback to the log file (verbose: to the console too) and
        return the line a person reads: a :class:`MillstreamError`'s message (it says what
        to do), or the error's type and the line that names it; then where the details are.
        """
        record = logging.LogRecord(
            "millstream", logging.ERROR, __file__, 0, "the run failed", (), _exc_info(exc)
        )
        for handler in self._handlers if self.verbose else self._handlers[:1]:
            handler.handle(record)
        if isinstance(exc, MillstreamError):
            summary = str(exc)
        else:
            lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
            named = [line for line in lines if _ERROR_LINE.match(line)]
            found = named[-1] if named else lines[0] if lines else ""
            summary = f"{type(exc).__name__}: {found[:_MAX_CONSOLE_LINE]}".rstrip(": ")
        return f"{summary.rstrip('.')}; details in {self.path}"

    def close(self) -> None:
        """Remove the handlers and levels :func:`route_logs` set; the file stays."""
        global _active
        root = logging.getLogger()
        for handler in self._handlers:
            root.removeHandler(handler)
            handler.close()
        for name, level in self._levels.items():
            logging.getLogger(name or None).setLevel(level)
        self._handlers.clear()
        self._levels.clear()
        with _lock:
            if _active is self:
                _active = None


def active() -> LogRouting | None:
    """The routing in place in this process, if a program asked for one."""
    with _lock:
        return _active


def route_logs(
    config: MillstreamConfig, name: str, *, verbose: bool = False, keep: int = KEEP
) -> LogRouting:
    """Send this process's logs to a new file ``<home>/logs/<name>-<date>-<time>.log`` (see
    the module docstring); a routing already in place is closed first."""
    global _active
    previous = active()
    if previous is not None:
        previous.close()
    directory = config.home / "logs"
    directory.mkdir(parents=True, exist_ok=True)
    _prune(directory, keep - 1)
    path = _new_file(directory, name)
    file_handler = logging.FileHandler(path, encoding="utf-8")
    file_handler.setFormatter(logging.Formatter(_FILE_FORMAT))
    console = _ConsoleHandler()
    if verbose:
        console.setFormatter(logging.Formatter(_FILE_FORMAT))
    else:
        console.setLevel(logging.WARNING)
        console.addFilter(_millstream_only)
        console.setFormatter(ConsoleFormatter(path))
    routing = LogRouting(path, verbose, [file_handler, console])
    for logger_name, level in (("", logging.INFO), ("py4j", logging.WARNING)):
        logger = logging.getLogger(logger_name or None)
        routing._levels[logger_name] = logger.level
        logger.setLevel(level)
    root = logging.getLogger()
    for handler in routing._handlers:
        root.addHandler(handler)
    with _lock:
        _active = routing
    return routing


class ConsoleFormatter(logging.Formatter):
    """One line per record for a person: ``warning: <first line of the message>``, cut
    short if long; a record that carries a traceback, more lines or more words ends in
    ``; details in <log file>``."""

    def __init__(self, log_file: Path) -> None:
        super().__init__()
        self.log_file = log_file

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        first, _, rest = message.strip().partition("\n")
        cut = len(first) > _MAX_CONSOLE_LINE
        if cut:
            first = first[: _MAX_CONSOLE_LINE - 1] + "…"
        if cut or record.exc_info or record.exc_text or rest.strip():
            first = f"{first.rstrip('.')}; details in {self.log_file}"
        return f"{record.levelname.lower()}: {first}"


class _ConsoleHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to ``sys.stderr`` as it is when a record comes: a live display that took it
    over (:mod:`millstream.spark.console`) shows the line above itself."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


def _exc_info(
    exc: BaseException,
) -> tuple[type[BaseException], BaseException, TracebackType | None]:
    return type(exc), exc, exc.__traceback__


def _millstream_only(record: logging.LogRecord) -> bool:
    return record.name == "millstream" or record.name.startswith("millstream.")


def _new_file(directory: Path, name: str) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for number in range(1, 100):  # runs started within the same second
        path = directory / f"{name}-{stamp}{f'-{number}' if number > 1 else ''}.log"
        try:
            path.open("x").close()
        except FileExistsError:
            continue
        return path
    raise FileExistsError(f"no free log file name for {name!r} in {directory}")


def _prune(directory: Path, keep: int) -> None:
    """Delete the oldest ``*.log`` files beyond the newest ``keep``."""
    files = []
    for path in directory.glob("*.log"):
        try:
            files.append((path.stat().st_mtime, path))
        except FileNotFoundError:  # another run pruned it meanwhile
            continue
    files.sort(reverse=True)
    for _, path in files[max(0, keep) :]:
        path.unlink(missing_ok=True)


def _java_option(name: str, value: str) -> str:
    # Spark splits extraJavaOptions like a shell: quote, so a path may hold spaces.
    quoted = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'"-D{name}={quoted}"'
