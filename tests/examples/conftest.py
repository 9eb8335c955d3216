"""The examples' packages (``zeitgeist``, ``search_pipeline``) import as a user's would, from
``examples/`` on the path."""

from __future__ import annotations

import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
if str(EXAMPLES) not in sys.path:
    sys.path.insert(0, str(EXAMPLES))
