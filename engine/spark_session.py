"""Deprecated: moved to :mod:`millstream.engine.spark.session`; this alias goes in 0.3."""

import warnings

from millstream.engine.spark.session import *  # noqa: F403
from millstream.engine.spark.session import __all__ as __all__

warnings.warn(
    "millstream.engine.spark_session moved to millstream.engine.spark.session",
    DeprecationWarning,
    stacklevel=2,
)
