"""Deprecated: moved to :mod:`millstream.spark.metrics`; this alias goes in 0.3."""

import warnings

from millstream.spark.metrics import *  # noqa: F403
from millstream.spark.metrics import __all__ as __all__

warnings.warn(
    "millstream.engine.spark.metrics moved to millstream.spark.metrics",
    DeprecationWarning,
    stacklevel=2,
)
