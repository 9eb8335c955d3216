"""The static checks of the test command, as tests: mypy (strict), import-linter (the layers
import one way) and the documentation site's strict build.

Tests rather than steps before them: under ``scripts/test``'s two workers they run among the
files that need no service, in the minutes the second worker would otherwise wait while the
first has the machine to itself (the modules marked ``exclusive``), not ahead of every test.
Ruff, a fraction of a second, runs before the tests in ``scripts/test``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def check(argv: list[str], **environment: str) -> None:
    """Run one check in the repository; its whole output is the failure's message."""
    done = subprocess.run(
        argv,
        cwd=ROOT,
        env={**os.environ, **environment},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        check=False,
    )
    assert done.returncode == 0, f"{' '.join(argv)} exited with {done.returncode}:\n{done.stdout}"


@pytest.fixture(scope="module")
def typecheck_tree() -> str:
    """mypy and import-linter cannot follow setup.cfg's package_dir mapping (engine/ is
    millstream.engine), so they read the sources through a tree of links named as they are
    imported."""
    check([sys.executable, "scripts/typecheck_tree.py", ".typecheck"])
    return ".typecheck"


def test_the_code_type_checks_strictly(typecheck_tree: str) -> None:
    check([sys.executable, "-m", "mypy"])  # pyproject.toml, [tool.mypy]: reads typecheck_tree


def test_the_layers_import_one_way_and_the_examples_use_the_front_doors(
    typecheck_tree: str,
) -> None:
    # pyproject.toml, [tool.importlinter]
    check([str(BIN / "lint-imports"), "--no-cache"], PYTHONPATH=f"{typecheck_tree}:examples")


def test_the_documentation_site_builds_without_a_warning() -> None:
    # Into site/; the Python examples of its pages run in tests/test_docs.py. Not --quiet:
    # it drops the warnings before --strict counts them (a missing page then built green).
    check([str(BIN / "mkdocs"), "build", "--strict"], NO_MKDOCS_2_WARNING="1")
