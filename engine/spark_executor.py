"""Deprecated: moved to :mod:`millstream.engine.spark.executor`; this alias goes in 0.3."""

import warnings

from millstream.engine.spark.executor import *  # noqa: F403
from millstream.engine.spark.executor import __all__ as __all__

warnings.warn(
    "millstream.engine.spark_executor moved to millstream.engine.spark.executor",
    DeprecationWarning,
    stacklevel=2,
)
