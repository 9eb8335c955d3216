"""The README's Python examples run as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)


def test_the_readme_has_python_examples() -> None:
    assert BLOCKS


@pytest.mark.parametrize("source", BLOCKS, ids=[f"block{n}" for n in range(len(BLOCKS))])
def test_readme_example_runs(source: str) -> None:
    exec(compile(source, str(README), "exec"), {"__name__": "readme_example"})
