"""Deprecated: moved to :mod:`millstream.devtools.local.process`; this alias goes in 0.3."""

import warnings

from millstream.devtools.local.process import *  # noqa: F403
from millstream.devtools.local.process import __all__ as __all__

warnings.warn(
    "millstream.connectors.local.process moved to millstream.devtools.local.process",
    DeprecationWarning,
    stacklevel=2,
)
