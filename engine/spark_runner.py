"""Deprecated: moved to :mod:`millstream.engine.spark.runner`; this alias goes in 0.3."""

import warnings

from millstream.engine.spark.runner import *  # noqa: F403
from millstream.engine.spark.runner import __all__ as __all__

warnings.warn(
    "millstream.engine.spark_runner moved to millstream.engine.spark.runner",
    DeprecationWarning,
    stacklevel=2,
)
