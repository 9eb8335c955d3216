"""The millstream command: run topologies on Spark, look at their streams, watermarks and
state, run the local Kafka and Cassandra, and prove the guarantees under faults.

Paths given on the command line are taken from the directory the command runs in. MODULE in
MODULE:TOPOLOGY (run, state --topology) is imported from there too, or from PYTHONPATH.
Addresses, ports and the data directory come from millstream.toml and the MILLSTREAM_*
variables.

Exit codes, the same for every command:
  0    done
  1    done, and the answer is no: nothing found (state: the key or the
       computation has nothing stored; tail: no record printed; watermarks: no
       source has reported), a check failed (status: a service is not healthy;
       prove: a run lost or duplicated records), or input refused (produce: a
       line was rejected, the others were sent)
  2    not done: a usage error, a setting missing or malformed, Kafka or
       Cassandra unreachable or refusing; a line on stderr says what to fix (an
       unexpected error prints its traceback first; run's goes to its log file)
  130  interrupted (Ctrl-C); tail --follow ends this way, with 0 or 1 as above
"""

from __future__ import annotations

import argparse
import functools
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from millstream.cli import inspection, prove, run, stack, streams, ui
from millstream.cli.arguments import PlainHelp
from millstream.connectors import logs
from millstream.engine.errors import MillstreamError

if TYPE_CHECKING:
    from millstream.engine.config import MillstreamConfig

__all__ = ["guarded", "main"]

# The command groups, in the order `millstream --help` lists their commands.
_GROUPS = (stack, run, streams, inspection, ui, prove)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command ``argv`` names (default: the process's arguments); its exit code.

    Each command group is a module of this package: its ``register(subparsers)`` adds its
    commands, each with ``run(args) -> int`` as its handler, which :func:`guarded` runs.
    """
    args = _parser().parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    return guarded(handler)(args)


def guarded(handler: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """``handler`` (a command's ``run``), its failures turned into the exit codes of the
    module docstring, each said in one line on stderr that starts with ``millstream COMMAND:``.

    A :class:`MillstreamError` says what was wrong and what to do; a Kafka or Cassandra client
    error, or a timeout, is said with where the service was looked for and how to check it;
    anything else is a bug, shown with its traceback. All exit 2; Ctrl-C exits 130.

    A command that routed its logs to a file (``run``: :mod:`millstream.connectors.logs`)
    has the routing closed as it ends, and an error's traceback goes to that file: the line
    on stderr ends in where it is.
    """

    @functools.wraps(handler)
    def guarded_run(args: argparse.Namespace) -> int:
        command = f"millstream {args.command}"
        try:
            return handler(args)
        except KeyboardInterrupt:
            print(f"{command}: interrupted", file=sys.stderr)
            return 130
        except MillstreamError as exc:
            routing = logs.active()
            print(f"{command}: error: {routing.failed(exc) if routing else exc}", file=sys.stderr)
            return 2
        except Exception as exc:
            unreachable = _unreachable(exc)
            routing = logs.active()
            if unreachable is not None:
                if routing is not None:
                    routing.failed(exc)  # its traceback, for the log file
                print(f"{command}: error: {unreachable}", file=sys.stderr)
            elif routing is not None and not routing.verbose:
                print(
                    f"{command}: unexpected error ({routing.failed(exc)}); this is a bug in "
                    "millstream: please report it with that file",
                    file=sys.stderr,
                )
            else:
                traceback.print_exc()
                print(
                    f"{command}: unexpected error ({type(exc).__name__}); this is a bug in "
                    "millstream: please report it with the traceback above",
                    file=sys.stderr,
                )
            return 2
        finally:
            routing = logs.active()
            if routing is not None:
                routing.close()

    return guarded_run


def _unreachable(exc: Exception) -> str | None:
    """What to say about a service client's error (Kafka, Cassandra, a timeout); ``None`` for
    any other exception."""
    package = type(exc).__module__.partition(".")[0]
    # confluent_kafka's errors are defined in its C module, cimpl.
    if package in ("confluent_kafka", "cimpl"):
        where = _where(lambda config: f"Kafka at {config.kafka_bootstrap}")
        variable = "MILLSTREAM_KAFKA_BOOTSTRAP"
    elif package == "cassandra":
        where = _where(
            lambda config: (
                f"Cassandra at {','.join(config.cassandra_hosts)} port {config.cassandra_port}"
            )
        )
        variable = "MILLSTREAM_CASSANDRA_HOSTS"
    elif isinstance(exc, (TimeoutError, ConnectionError)):
        where = "Kafka or Cassandra"
        variable = "MILLSTREAM_KAFKA_BOOTSTRAP, MILLSTREAM_CASSANDRA_HOSTS"
    else:
        return None
    said = " ".join(str(exc).split()) or type(exc).__name__
    return (
        f"{where}: {said}; if it is down, `millstream status` shows the local stack and "
        f"`millstream up` starts it; if it runs elsewhere, set {variable}"
    )


def _where(describe: Callable[[MillstreamConfig], str]) -> str:
    from millstream.engine.config import load_config

    try:
        config = load_config()
    except MillstreamError:
        return "the service"
    return describe(config)


def _parser() -> argparse.ArgumentParser:
    summary, _, notes = (__doc__ or "").partition("\n\n")
    parser = argparse.ArgumentParser(
        prog="millstream", description=summary, epilog=notes, formatter_class=PlainHelp
    )
    commands = parser.add_subparsers(title="commands", dest="command", required=True)
    for group in _GROUPS:
        group.register(commands)
    return parser


if __name__ == "__main__":
    # spark-submit runs this file as a script (docs/guides/spark.md).
    sys.exit(main())
