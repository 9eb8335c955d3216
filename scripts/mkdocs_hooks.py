"""MkDocs hooks of the documentation site (mkdocs.yml, ``hooks:``).

- The API reference reads the sources through ``.typecheck/millstream/<package>``, links
  named as the packages are imported (setup.cfg's ``package_dir`` maps ``millstream.engine``
  onto ``engine/``, which mkdocstrings cannot follow), the tree ``scripts/test`` makes for
  mypy. The hook makes it before the first page is rendered, so ``mkdocs build`` works on a
  fresh clone. Each link is swapped in atomically: a mypy run beside it never misses one.
- Docstrings cite names the Sphinx way (``:class:`~millstream.engine.records.Record```),
  which Markdown renders as the role's text before the name: the hook shows the name alone,
  as code (``Record``, or the full path without ``~``).
"""

from __future__ import annotations

import configparser
import html
import os
import re
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SOURCES = REPO / ".typecheck"

_ROLE = re.compile(r":(?:class|func|meth|mod|attr|data|exc|obj|const):<code>([^<]*)</code>")


def package_dirs() -> dict[str, str]:
    """setup.cfg's ``package_dir``: import name -> source folder."""
    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg")
    lines = config["options"]["package_dir"].strip().splitlines()
    pairs = (line.split("=", 1) for line in lines)
    return {name.strip(): folder.strip() for name, folder in pairs}


def link_sources(root: Path) -> None:
    """Make ``root/millstream/<package>`` link to each package's source folder."""
    for name, folder in package_dirs().items():
        link = root / name.replace(".", "/")
        link.parent.mkdir(parents=True, exist_ok=True)
        target = REPO / folder
        if link.is_symlink() and Path(os.readlink(link)) == target:
            continue
        fresh = link.with_name(f".{link.name}.{os.getpid()}")
        fresh.unlink(missing_ok=True)
        fresh.symlink_to(target, target_is_directory=True)
        os.replace(fresh, link)


def on_config(config: Any) -> Any:
    link_sources(SOURCES)
    return config


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
    # A literal block's "Example::" reads "Example:".
    return _ROLE.sub(_cited, html_text).replace("::</p>", ":</p>")
