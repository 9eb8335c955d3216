"""The Python examples of the README and of the documentation site run as written.

Every ```` ```python ```` block of ``README.md`` and ``docs/**/*.md`` is a unit test: it runs in
a fresh namespace, as module ``docs_example``, so a wrong example fails the suite. What needs
the real services (Kafka, Cassandra, Spark) sits under ``if __name__ == "__main__":``: it is
compiled and its imports are checked, but it does not run. Text that is not Python to run is
fenced as another language (``sh``, ``text``, ``toml``), never as a variant of ``python``.
The examples' packages (``zeitgeist``) import from ``examples/``, as the guides say to run them.
"""

from __future__ import annotations

import ast
import importlib
import re
from dataclasses import dataclass
from pathlib import Path
from types import CodeType, ModuleType

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```(?P<info>[^\n]*)\n(?P<body>.*?)^```[ \t]*$", re.S | re.M)


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the block's first line of code
    info: str  # the fence's info string: its language and attributes
    source: str

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    def compiled(self) -> CodeType:
        # Padded so that a traceback names the line of the page.
        return compile("\n" * (self.line - 1) + self.source, str(self.page), "exec")


def blocks(page: Path) -> list[Block]:
    text = page.read_text(encoding="utf-8")
    return [
        Block(
            page, text.count("\n", 0, match.start("body")) + 1, match["info"].strip(), match["body"]
        )
        for match in FENCE.finditer(text)
    ]


ALL = [block for page in PAGES for block in blocks(page)]
PYTHON = [block for block in ALL if block.info == "python"]


def test_the_readme_and_the_docs_have_python_examples() -> None:
    pages = {block.page for block in PYTHON}
    assert ROOT / "README.md" in pages
    assert len(pages) > 5


def test_every_python_block_is_fenced_to_run() -> None:
    # ```py, ```python3 or ```python title="..." would be skipped without a word.
    assert [b.name for b in ALL if b.info.startswith("py") and b.info != "python"] == []


@pytest.fixture(autouse=True)
def _examples_on_the_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "examples"))


@pytest.mark.parametrize("block", PYTHON, ids=[block.name for block in PYTHON])
def test_example_runs(block: Block) -> None:
    exec(block.compiled(), {"__name__": "docs_example"})


@pytest.mark.parametrize("block", PYTHON, ids=[block.name for block in PYTHON])
def test_example_imports_public_current_names(block: Block) -> None:
    """Every import of the block resolves, those it does not run included, and none names a
    module that moved (its docstring says "Deprecated:")."""
    for node in ast.walk(ast.parse(block.source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                _current(importlib.import_module(alias.name), block)
        elif isinstance(node, ast.ImportFrom):
            assert node.module is not None
            module = _current(importlib.import_module(node.module), block)
            for alias in node.names:
                found = getattr(module, alias.name, None)
                if found is None:
                    found = importlib.import_module(f"{node.module}.{alias.name}")
                if isinstance(found, ModuleType):
                    _current(found, block)


def _current(module: ModuleType, block: Block) -> ModuleType:
    assert not (module.__doc__ or "").startswith("Deprecated"), (
        f"{block.name} imports {module.__name__}, which moved: {module.__doc__}"
    )
    return module
