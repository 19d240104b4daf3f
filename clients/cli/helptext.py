"""How ``--help`` reads: every command's description is its module docstring, as plain
text. The docstrings mark names as reStructuredText literals (````--server````), which a
terminal would show with their backticks: the marks are dropped and each paragraph is
filled again to the terminal's width, its list items (lines starting ``- ``) kept apart.
Imports only the standard library: the parser is built on every start-up."""

from __future__ import annotations

import argparse
import re
import textwrap

LITERAL = "``"
_LIST_ITEM = re.compile(r"\n(?=- )")


def plain(text: str) -> str:
    """``text`` without reStructuredText's literal marks."""
    return text.replace(LITERAL, "")


def fill(text: str, width: int, indent: str = "") -> str:
    """``text`` as plain paragraphs (blank lines apart) filled to ``width``; a list item
    is its own line, its continuation lines under its text."""
    paragraphs = []
    for paragraph in plain(text).strip("\n").split("\n\n"):
        items = _LIST_ITEM.split(paragraph)
        lines = [
            textwrap.fill(
                " ".join(item.split()),
                width,
                initial_indent=indent,
                subsequent_indent=indent + ("  " if item.startswith("- ") else ""),
                break_long_words=False,
                break_on_hyphens=False,  # --cache-dir stays whole
            )
            for item in items
        ]
        paragraphs.append("\n".join(lines))
    return "\n\n".join(paragraphs)


class PlainFormatter(argparse.HelpFormatter):
    """Descriptions and epilogs by paragraph (``fill``), options' help without literal
    marks."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return fill(text, width, indent)

    def _split_lines(self, text: str, width: int) -> list[str]:
        return super()._split_lines(plain(text), width)


class PlainParser(argparse.ArgumentParser):
    """An ArgumentParser with ``PlainFormatter``; the subcommands' parsers are made of
    this class too (``add_subparsers`` uses the parent's class)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs["formatter_class"] = PlainFormatter
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
