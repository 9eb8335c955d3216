"""Deprecated: moved to :mod:`millstream.devtools.local.cassandra`; this alias goes in 0.3."""

import warnings

from millstream.devtools.local.cassandra import *  # noqa: F403
from millstream.devtools.local.cassandra import __all__ as __all__

warnings.warn(
    "millstream.connectors.local.cassandra moved to millstream.devtools.local.cassandra",
    DeprecationWarning,
    stacklevel=2,
)
