"""Deprecated: moved to :mod:`millstream.spark.session`; this alias goes in 0.3."""

import warnings

from millstream.spark.session import *  # noqa: F403
from millstream.spark.session import __all__ as __all__

warnings.warn(
    "millstream.engine.spark_session moved to millstream.spark.session",
    DeprecationWarning,
    stacklevel=2,
)
