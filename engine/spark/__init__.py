"""Deprecated: moved to :mod:`millstream.spark`; this alias goes in 0.3."""

import warnings

from millstream.spark import *  # noqa: F403
from millstream.spark import __all__ as __all__

warnings.warn("millstream.engine.spark moved to millstream.spark", DeprecationWarning, stacklevel=2)
