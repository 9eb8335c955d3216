"""The Spark runtime: a topology as Spark Structured Streaming queries.

- :mod:`.runner`: :func:`run_topology` and :class:`RunningTopology`, one query per
  computation (the entry point);
- :mod:`.batch`: a query's ``foreachBatch`` function, one micro-batch on the driver;
- :mod:`.executor`: what runs on the executors (routing, the interval tasks);
- :mod:`.driver_watermarks`: a computation's low-watermark bookkeeping on the driver;
- :mod:`.metrics`: what a batch counts;
- :mod:`.prometheus`: those counts and the watermarks as Prometheus metrics;
- :mod:`.session`: the Spark session and the Kafka source millstream configures.

The model (``millstream.engine`` outside this package) imports none of it.
"""

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

__all__ = [
    "DEFAULT_KEYSPACE",
    "AvailableNow",
    "BatchMetrics",
    "ComputationMetrics",
    "MetricCounts",
    "ProcessingTime",
    "RunningTopology",
    "Trigger",
    "load_topology",
    "run_topology",
]
