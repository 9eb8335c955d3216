"""Deprecated: moved to :mod:`millstream.spark.batch`; this alias goes in 0.3."""

import warnings

from millstream.spark.batch import *  # noqa: F403
from millstream.spark.batch import __all__ as __all__

warnings.warn(
    "millstream.engine.spark.batch moved to millstream.spark.batch",
    DeprecationWarning,
    stacklevel=2,
)
