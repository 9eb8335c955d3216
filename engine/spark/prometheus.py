"""Deprecated: moved to :mod:`millstream.spark.prometheus`; this alias goes in 0.3."""

import warnings

from millstream.spark.prometheus import *  # noqa: F403
from millstream.spark.prometheus import __all__ as __all__

warnings.warn(
    "millstream.engine.spark.prometheus moved to millstream.spark.prometheus",
    DeprecationWarning,
    stacklevel=2,
)
