"""Deprecated: moved to :mod:`millstream.cli`; this alias goes in 0.3."""

import warnings

from millstream.cli import *  # noqa: F403
from millstream.cli import __all__ as __all__

warnings.warn("millstream.engine.cli moved to millstream.cli", DeprecationWarning, stacklevel=2)
