"""The kinds of tool source, one file each: a new kind is its file and one line in `KINDS`.

Everything that reads a source's table asks this registry: the sources file
(`machine.tools.source_file`), stored sources (`machine.source_catalog`), agent code's
`tools.lockgate.add_*_source` (`machine.tools.admin_source`) and `lockgate sources add`.
"""

from __future__ import annotations

from lockgate.machine.tools.errors import InvalidToolSource
from lockgate.machine.tools.kinds.graphql import GRAPHQL
from lockgate.machine.tools.kinds.mcp import MCP
from lockgate.machine.tools.kinds.openapi import OPENAPI
from lockgate.machine.tools.kinds.python import PYTHON
from lockgate.machine.tools.source_kind import SourceKind

#: In the order the sources file's tables are built.
KINDS: tuple[SourceKind, ...] = (OPENAPI, GRAPHQL, MCP, PYTHON)

#: The kinds a source stored in the database may be (added at run time).
STORED_KINDS = tuple(kind for kind in KINDS if kind.stored)


def _spelled(kinds: tuple[SourceKind, ...], tables: bool = False) -> str:
    names = [f"[[{kind.name}]]" if tables else kind.name for kind in kinds]
    return ", ".join(names[:-1]) + f" or {names[-1]}" if len(names) > 1 else names[0]


#: "openapi, graphql or mcp": for messages and help.
STORED_NAMES = _spelled(STORED_KINDS)
#: "[[openapi]], [[graphql]], [[mcp]] or [[python]]": the sources file's tables.
TABLE_NAMES = _spelled(KINDS, tables=True)


def kind_named(name: str, *, stored: bool = False) -> SourceKind:
    """The kind `name`; `stored`: one that may be stored (refused in words otherwise)."""
    for kind in STORED_KINDS if stored else KINDS:
        if kind.name == name:
            return kind
    raise InvalidToolSource(f"unknown kind of source {name!r}", hint=f"A source is {STORED_NAMES}.")
