"""Deprecated: moved to :mod:`millstream.devtools.proving.workload`; this alias goes in 0.3."""

import warnings

from millstream.devtools.proving.workload import *  # noqa: F403
from millstream.devtools.proving.workload import __all__ as __all__

warnings.warn(
    "millstream.connectors.proving.workload moved to millstream.devtools.proving.workload",
    DeprecationWarning,
    stacklevel=2,
)
