"""Deprecated: moved to :mod:`millstream.devtools.local.security`; this alias goes in 0.3."""

import warnings

from millstream.devtools.local.security import *  # noqa: F403
from millstream.devtools.local.security import __all__ as __all__

warnings.warn(
    "millstream.connectors.local.security moved to millstream.devtools.local.security",
    DeprecationWarning,
    stacklevel=2,
)
