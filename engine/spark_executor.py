"""Deprecated: moved to :mod:`millstream.spark.executor`; this alias goes in 0.3."""

import warnings

from millstream.spark.executor import *  # noqa: F403
from millstream.spark.executor import __all__ as __all__

warnings.warn(
    "millstream.engine.spark_executor moved to millstream.spark.executor",
    DeprecationWarning,
    stacklevel=2,
)
