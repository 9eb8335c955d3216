"""What the command modules share when they declare their commands: the help layout and the
argument types.

Paths on the command line are taken from the directory the command runs in: :func:`path_here`
makes them absolute as they are parsed, so nothing that changes directory later (Spark, a
subprocess) can read them from elsewhere.
"""

from __future__ import annotations

import argparse
import itertools
import os
import textwrap
from pathlib import Path

__all__ = [
    "PlainHelp",
    "add_command",
    "add_query_mode",
    "path_here",
    "positive",
    "writable_file_here",
]


class PlainHelp(argparse.HelpFormatter):
    """Help text as written: paragraphs (separated by a blank line) are refilled to the
    terminal's width, and indented lines (a table) are kept as they are."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        paragraphs = []
        for paragraph in textwrap.dedent(text).strip().split("\n\n"):
            lines: list[str] = []
            for indented, run in itertools.groupby(
                paragraph.splitlines(), key=lambda line: line.startswith(" ")
            ):
                if indented:
                    lines += [indent + line for line in run]
                else:
                    words = " ".join(" ".join(run).split())
                    lines += textwrap.wrap(
                        words, width, initial_indent=indent, subsequent_indent=indent
                    )
            paragraphs.append("\n".join(lines))
        return "\n\n".join(paragraphs)


def add_command(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    *,
    summary: str,
    description: str,
) -> argparse.ArgumentParser:
    """A command's parser: ``summary`` is its line in ``millstream --help``, ``description``
    opens its own ``--help``."""
    return commands.add_parser(
        name, help=summary, description=description, formatter_class=PlainHelp
    )


def add_query_mode(parser: argparse.ArgumentParser, *, one_query: str) -> None:
    """``--one-query`` / ``--query-each`` into ``one_query`` (``None``: neither given, the
    configuration's ``[run] one_query`` decides); ``one_query`` says what the first does."""
    queries = parser.add_mutually_exclusive_group()
    queries.add_argument(
        "--one-query",
        dest="one_query",
        action="store_const",
        const=True,
        default=None,
        help=f"{one_query} (default: [run] one_query, off)",
    )
    queries.add_argument(
        "--query-each",
        dest="one_query",
        action="store_const",
        const=False,
        help="one streaming query per computation (the default), whatever [run] one_query says",
    )


def positive(text: str) -> int:
    """A whole number of at least 1."""
    try:
        number = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {number}")
    return number


def path_here(text: str) -> Path:
    """A path as given, absolute: relative to the working directory, ``~`` expanded."""
    if not text:
        raise argparse.ArgumentTypeError("an empty path")
    return Path(os.path.abspath(os.path.expanduser(text)))


def writable_file_here(text: str) -> Path:
    """A file to write at the end (:func:`path_here`), whose directory exists already: a long
    run must not fail at its last step on a typo."""
    path = path_here(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a directory; name a file in it")
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"directory {str(path.parent)!r} does not exist")
    return path
