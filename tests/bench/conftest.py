"""The benchmarks' helpers import as the scripts import them: ``bench`` from the repository's
root, ``zeitgeist`` from ``examples``."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for path in (ROOT, ROOT / "examples"):  # `bench`, and `zeitgeist` as its scripts find it
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))
