"""Markdown building blocks of the generated README: table rows, code lists, list items and
the anchors GitHub gives headings."""

from __future__ import annotations

import re
import textwrap
from collections.abc import Iterable


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ").strip()


def code_list(names: Iterable[str]) -> str:
    return ", ".join(f"`{n}`" for n in names)


def slug(title: str) -> str:
    """The anchor GitHub gives a heading."""
    kept = re.sub(r"[^\w\- ]", "", title.strip().lower())
    return kept.replace(" ", "-")


def table_row(cells: Iterable[str]) -> str:
    return "| " + " | ".join(_cell(c) for c in cells) + " |"


def bullet(text: str) -> str:
    """A Markdown list item, wrapped like the rest of the README's prose."""
    return textwrap.fill(
        text,
        width=96,
        initial_indent="- ",
        subsequent_indent="  ",
        break_long_words=False,
        break_on_hyphens=False,
    )
