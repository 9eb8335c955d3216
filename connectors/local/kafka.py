"""Deprecated: moved to :mod:`millstream.devtools.local.kafka`; this alias goes in 0.3."""

import warnings

from millstream.devtools.local.kafka import *  # noqa: F403
from millstream.devtools.local.kafka import __all__ as __all__

warnings.warn(
    "millstream.connectors.local.kafka moved to millstream.devtools.local.kafka",
    DeprecationWarning,
    stacklevel=2,
)
