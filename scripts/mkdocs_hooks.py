"""MkDocs hooks of the documentation site (mkdocs.yml, ``hooks:``).

- The API reference reads the sources through ``.typecheck/millstream/<package>``, the links
  ``scripts/typecheck_tree.py`` lays out for mypy (setup.cfg's ``package_dir`` maps
  ``millstream.engine`` onto ``engine/``, which mkdocstrings cannot follow either). The hook
  lays them out as the command starts, so ``mkdocs build`` works on a fresh clone.
- Docstrings cite names the Sphinx way (``:class:`~millstream.engine.records.Record```),
  which Markdown renders as the role's text before the name: the hook shows the name alone,
  as code (``Record``, or the full path without ``~``).
"""

from __future__ import annotations

import html
import re
import runpy
from pathlib import Path
from typing import Any

SCRIPTS = Path(__file__).resolve().parent
SOURCES = SCRIPTS.parent / ".typecheck"

_ROLE = re.compile(r":(?:class|func|meth|mod|attr|data|exc|obj|const):<code>([^<]*)</code>")


def on_startup(**_: Any) -> None:
    # Before on_config, in which mkdocstrings may set up its handlers' search paths.
    runpy.run_path(str(SCRIPTS / "typecheck_tree.py"))["main"](SOURCES)


def _cited(match: re.Match[str]) -> str:
    name = html.unescape(match.group(1))
    titled = re.fullmatch(r"(.+?)\s*<(.+)>", name)  # :meth:`title <target>`
    if titled:
        name = titled.group(1)
    elif name.startswith("~"):
        name = name.rsplit(".", 1)[-1]
    elif name.startswith("."):
        name = name[1:]
    return f"<code>{html.escape(name, quote=False)}</code>"


def on_page_content(html_text: str, **_: Any) -> str:
    # Before a literal block, "Example::" reads "Example:" and a "::" of its own goes.
    html_text = _ROLE.sub(_cited, html_text).replace("<p>::</p>", "")
    return html_text.replace("::</p>", ":</p>")
