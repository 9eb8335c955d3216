"""Deprecated: moved to :mod:`millstream.devtools.proving`; this alias goes in 0.3."""

import warnings

from millstream.devtools.proving import *  # noqa: F403
from millstream.devtools.proving import __all__ as __all__

warnings.warn(
    "millstream.connectors.proving moved to millstream.devtools.proving",
    DeprecationWarning,
    stacklevel=2,
)
