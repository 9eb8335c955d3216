"""Deprecated: moved to :mod:`millstream.spark.runner`; this alias goes in 0.3."""

import warnings

from millstream.spark.runner import *  # noqa: F403
from millstream.spark.runner import __all__ as __all__

warnings.warn(
    "millstream.engine.spark.runner moved to millstream.spark.runner",
    DeprecationWarning,
    stacklevel=2,
)
