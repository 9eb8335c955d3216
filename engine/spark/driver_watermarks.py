"""Deprecated: moved to :mod:`millstream.spark.driver_watermarks`; this alias goes in 0.3."""

import warnings

from millstream.spark.driver_watermarks import *  # noqa: F403
from millstream.spark.driver_watermarks import __all__ as __all__

warnings.warn(
    "millstream.engine.spark.driver_watermarks moved to millstream.spark.driver_watermarks",
    DeprecationWarning,
    stacklevel=2,
)
