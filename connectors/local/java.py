"""Deprecated: moved to :mod:`millstream.devtools.local.java`; this alias goes in 0.3."""

import warnings

from millstream.devtools.local.java import *  # noqa: F403
from millstream.devtools.local.java import __all__ as __all__

warnings.warn(
    "millstream.connectors.local.java moved to millstream.devtools.local.java",
    DeprecationWarning,
    stacklevel=2,
)
