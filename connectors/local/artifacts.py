"""Deprecated: moved to :mod:`millstream.connectors.maven`; this alias goes in 0.3."""

import warnings

from millstream.connectors.maven import *  # noqa: F403
from millstream.connectors.maven import __all__ as __all__

warnings.warn(
    "millstream.connectors.local.artifacts moved to millstream.connectors.maven",
    DeprecationWarning,
    stacklevel=2,
)
