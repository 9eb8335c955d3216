"""millstream's engine: MillWheel's programming model and its runtime.

The names a computation needs are importable from here (the front door); the rest lives in
one module per concept (:mod:`~millstream.engine.records`, :mod:`~millstream.engine.state`,
:mod:`~millstream.engine.timers`, :mod:`~millstream.engine.watermarks`, ...). Testing helpers
are in :mod:`millstream.engine.testing`, the Spark runtime in :mod:`millstream.spark`.
"""

from millstream.engine.codecs import AvroCodec, BytesCodec, Codec, IntCodec, JsonCodec
from millstream.engine.computation import Computation
from millstream.engine.context import Context, TypedState
from millstream.engine.errors import MillstreamError
from millstream.engine.rebalance import RebalancePolicy
from millstream.engine.records import MAX_EVENT_TIME, MIN_EVENT_TIME, Deletion, Record
from millstream.engine.timers import TimeDomain, Timer
from millstream.engine.topology import ComputationOptions, InputStream, Topology, record_key

__all__ = [
    "MAX_EVENT_TIME",
    "MIN_EVENT_TIME",
    "AvroCodec",
    "BytesCodec",
    "Codec",
    "Computation",
    "ComputationOptions",
    "Context",
    "Deletion",
    "InputStream",
    "IntCodec",
    "JsonCodec",
    "MillstreamError",
    "RebalancePolicy",
    "Record",
    "TimeDomain",
    "Timer",
    "Topology",
    "TypedState",
    "record_key",
]
