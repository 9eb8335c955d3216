"""Deprecated: moved to :mod:`millstream.devtools.proving.ground`; this alias goes in 0.3."""

import warnings

from millstream.devtools.proving.ground import *  # noqa: F403
from millstream.devtools.proving.ground import __all__ as __all__

warnings.warn(
    "millstream.connectors.proving.ground moved to millstream.devtools.proving.ground",
    DeprecationWarning,
    stacklevel=2,
)
