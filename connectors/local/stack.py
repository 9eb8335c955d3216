"""Deprecated: moved to :mod:`millstream.devtools.local.stack`; this alias goes in 0.3."""

import warnings

from millstream.devtools.local.stack import *  # noqa: F403
from millstream.devtools.local.stack import __all__ as __all__

warnings.warn(
    "millstream.connectors.local.stack moved to millstream.devtools.local.stack",
    DeprecationWarning,
    stacklevel=2,
)
