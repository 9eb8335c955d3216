"""Deprecated: moved to :mod:`millstream.devtools.proving.checks`; this alias goes in 0.3."""

import warnings

from millstream.devtools.proving.checks import *  # noqa: F403
from millstream.devtools.proving.checks import __all__ as __all__

warnings.warn(
    "millstream.connectors.proving.checks moved to millstream.devtools.proving.checks",
    DeprecationWarning,
    stacklevel=2,
)
