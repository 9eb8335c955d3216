"""Kafka's own command-line tools, run from the stack's artifacts: no Kafka distribution.

The ``kafka-tools`` profile of the pinned artifacts (``millstream/connectors/pom.xml``) holds
``kafka-tools``, whose classes the distribution's ``bin/*.sh`` scripts run: the console
consumer is ``kafka-console-consumer.sh``. :func:`kafka_tool_argv` gives the command line
that runs one of them with the stack's Java (:func:`~millstream.devtools.local.java.find_java`)
on that classpath; ``python -m millstream.devtools.local.kafka_tools CLASS ARGS...`` runs it::

    python -m millstream.devtools.local.kafka_tools \\
        org.apache.kafka.tools.consumer.ConsoleConsumer --bootstrap-server 127.0.0.1:9092 \\
        --topic anomalies --from-beginning --isolation-level read_committed

As with the distribution's scripts, the tool logs warnings and errors to stderr
(``kafka-tools-log4j2.properties`` beside this module): stdout is what it prints.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from millstream.connectors.maven import MavenArtifacts, Progress
from millstream.devtools.local.java import JavaRuntime, find_java
from millstream.engine.config import MillstreamConfig, load_config

__all__ = ["CONSOLE_CONSUMER", "TOOLS_LOG4J2_CONFIG", "kafka_tool_argv", "main"]

CONSOLE_CONSUMER: Final = "org.apache.kafka.tools.consumer.ConsoleConsumer"
"""The class ``kafka-console-consumer.sh`` runs."""

TOOLS_LOG4J2_CONFIG: Final = Path(__file__).with_name("kafka-tools-log4j2.properties")
"""The tools' log4j2 configuration: WARN and above to stderr."""

_PROFILE: Final = "kafka-tools"


def _to_stderr(message: str) -> None:
    print(message, file=sys.stderr)


def kafka_tool_argv(
    main_class: str,
    args: Sequence[str] = (),
    *,
    config: MillstreamConfig | None = None,
    java: JavaRuntime | None = None,
    artifacts: MavenArtifacts | None = None,
    heap: str = "256m",
    progress: Progress = _to_stderr,
) -> list[str]:
    """The command line that runs Kafka's tool ``main_class`` with ``args``, as the Kafka
    distribution's script of that tool would, from the stack's artifacts.

    ``main_class`` is a class of the ``kafka-tools`` profile's classpath, e.g.
    :data:`CONSOLE_CONSUMER`; ``args`` are the tool's own options (``--bootstrap-server``
    included: nothing is added). ``java`` defaults to :func:`find_java`'s Java 17, and
    ``artifacts`` to the stack's cache, ``<home>/artifacts`` of ``config`` (default:
    :func:`~millstream.engine.config.load_config`, so ``MILLSTREAM_HOME`` counts). Resolving
    the classpath runs Maven only the first time after a change of the POM, and tells
    ``progress`` (default: stderr) while it does. ``heap`` is the JVM's maximum heap (the
    distribution's scripts use 256m).
    """
    home = (config or load_config()).home
    runtime = java or find_java()
    jars = (artifacts or MavenArtifacts(home / "artifacts", progress)).classpath(_PROFILE)
    return [
        str(runtime.executable),
        f"-Xmx{heap}",
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={TOOLS_LOG4J2_CONFIG}",
        "-cp",
        os.pathsep.join(str(jar) for jar in jars),
        main_class,
        *args,
    ]


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m millstream.devtools.local.kafka_tools CLASS [ARGS...]``: replace this
    process with the tool, so its exit status and output are the tool's."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(
            "usage: python -m millstream.devtools.local.kafka_tools CLASS [ARGS...]\n"
            f"runs Kafka's tool CLASS (e.g. {CONSOLE_CONSUMER}) from the stack's artifacts",
            file=sys.stderr,
        )
        raise SystemExit(0 if args else 2)
    command = kafka_tool_argv(args[0], args[1:])
    os.execv(command[0], command)


if __name__ == "__main__":
    main()
