"""Deprecated: moved to :mod:`millstream.devtools.local`; this alias goes in 0.3."""

import warnings

warnings.warn(
    "millstream.connectors.local moved to millstream.devtools.local",
    DeprecationWarning,
    stacklevel=2,
)
