"""Deprecated: moved to :mod:`millstream.devtools.local.spark_standalone`; goes in 0.3."""

import warnings

from millstream.devtools.local.spark_standalone import *  # noqa: F403
from millstream.devtools.local.spark_standalone import __all__ as __all__

warnings.warn(
    "millstream.connectors.local.spark_standalone moved to "
    "millstream.devtools.local.spark_standalone",
    DeprecationWarning,
    stacklevel=2,
)
