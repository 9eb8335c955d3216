"""The Spark runtime: a topology as Spark Structured Streaming queries.

The names a job needs are importable from here (the front door): :func:`run_topology`, the
:class:`RunningTopology` it returns (its injectors, :meth:`~RunningTopology.add_injector`;
:meth:`~RunningTopology.await_input_complete`; a context manager that stops it all), the
triggers, :class:`RunSettings` (the run's deployment), :func:`spark_session` and the
:class:`Console` that shows a run's progress (fed by ``on_batch``).

- :mod:`.runner`: :func:`run_topology` and :class:`RunningTopology`, one query per
  computation (the entry point);
- :mod:`.user_code`: the job's own code, shipped to the executors by value;
- :mod:`.batch`: a query's ``foreachBatch`` function, one micro-batch on the driver;
- :mod:`.isolation` and :mod:`.quarantine`: a record that makes the engine fail (a poison
  pill) found by bisecting its batch, and kept in the query's checkpoint;
- :mod:`.executor`: what runs on the executors (routing, the interval tasks);
- :mod:`.driver_watermarks`: a computation's low-watermark bookkeeping on the driver;
- :mod:`.metrics`: what a batch counts;
- :mod:`.prometheus`: those counts and the watermarks as Prometheus metrics;
- :mod:`.session`: the Spark session and the Kafka source millstream configures;
- :mod:`.console`: what a person running a topology sees of its progress.

The model (``millstream.engine`` outside this package) imports none of it.
"""

from millstream.engine.config import RunSettings
from millstream.spark.console import Console
from millstream.spark.metrics import BatchMetrics, ComputationMetrics, MetricCounts
from millstream.spark.runner import (
    DEFAULT_KEYSPACE,
    AvailableNow,
    ProcessingTime,
    RunningTopology,
    Trigger,
    load_topology,
    run_topology,
)
from millstream.spark.session import spark_session

__all__ = [
    "DEFAULT_KEYSPACE",
    "AvailableNow",
    "BatchMetrics",
    "ComputationMetrics",
    "Console",
    "MetricCounts",
    "ProcessingTime",
    "RunSettings",
    "RunningTopology",
    "Trigger",
    "load_topology",
    "run_topology",
    "spark_session",
]
