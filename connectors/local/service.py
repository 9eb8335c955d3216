"""Deprecated: moved to :mod:`millstream.devtools.local.service`; this alias goes in 0.3."""

import warnings

from millstream.devtools.local.service import *  # noqa: F403
from millstream.devtools.local.service import __all__ as __all__

warnings.warn(
    "millstream.connectors.local.service moved to millstream.devtools.local.service",
    DeprecationWarning,
    stacklevel=2,
)
