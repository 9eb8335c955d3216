"""The JVM options of the JVMs a test run starts.

A test run's Spark drivers live for seconds to a minute: C2's compiles never pay back. With
C1 alone (-XX:TieredStopAtLevel=1) three runner tests took 66-75 against 89 CPU-s. The test
session puts it in SPARK_SUBMIT_OPTS (tests/conftest.py), which reaches every driver JVM
spark-submit starts, in the test's process or in the CLI's; whatever the environment already
says wins.
"""

from __future__ import annotations

from dataclasses import replace

from millstream.engine.config import MillstreamConfig

__all__ = ["SHORT_LIVED_JVM", "for_short_lived_services"]

SHORT_LIVED_JVM = "-XX:TieredStopAtLevel=1"


def for_short_lived_services(config: MillstreamConfig) -> MillstreamConfig:
    """``config`` with a stack's Kafka and Cassandra JVMs on C1 alone (unless configured):
    for a stack that lives for one module. Whole runs (2026-12-03, two workers): the
    replicated stack's module took 414 against 538 s and the secured stack's 81 against 90;
    the session's stack, which serves the other tests for half an hour, made them a sixth
    slower on C1 (the run after the exclusive modules 986 against 833 s), so it keeps C2.
    The whole run so (drivers and these two stacks on C1) took 1,645 s of pytest and 2,759
    CPU-s of the machine, against 1,839 s and 3,193 CPU-s with every JVM on C2 and 1,867 s
    and 3,029 CPU-s with every JVM on C1."""
    options = (SHORT_LIVED_JVM,)
    return replace(
        config,
        kafka_java_options=config.kafka_java_options or options,
        cassandra_java_options=config.cassandra_java_options or options,
    )
