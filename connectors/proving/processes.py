"""Deprecated: moved to :mod:`millstream.devtools.proving.processes`; this alias goes in 0.3."""

import warnings

from millstream.devtools.proving.processes import *  # noqa: F403
from millstream.devtools.proving.processes import __all__ as __all__

warnings.warn(
    "millstream.connectors.proving.processes moved to millstream.devtools.proving.processes",
    DeprecationWarning,
    stacklevel=2,
)
