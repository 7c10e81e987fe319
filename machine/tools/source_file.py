"""The tool sources every principal gets, from a TOML file the operator keeps in version
control (`LOCKGATE_SOURCES_FILE`):

    [[openapi]]
    name = "petstore"                  # agent code calls tools.petstore.<operation>(...)
    document = "specs/petstore.yaml"   # a path (relative to this file), a URL, or the text
    base_url = "https://api.example"   # optional: else the document's first server
    auth = { bearer = "petstore_token" }  # optional: a secret (LOCKGATE_SECRET_PETSTORE_TOKEN)
                                          # as bearer, basic ("user:password"), or
                                          # { header = "X-Api-Key", secret = "..." },
                                          # { query = "api_key", secret = "..." }

    [[graphql]]
    name = "shop"                      # tools.shop.query(query=...) and tools.shop.mutate(...)
    endpoint = "https://shop.example/graphql"
    schema = "shop.graphql"            # optional: an SDL file; else asked of the endpoint
    auth = { bearer = "shop_token" }   # optional, as for OpenAPI

    [[mcp]]
    name = "files"                     # tools.files.<upstream tool>(...)
    command = ["npx", "some-mcp-server"]  # run over stdio; or url = "https://.../mcp"
    env = { ROOT = "/srv/files" }      # optional: variables the command gets
    cwd = "servers"                    # optional: where it runs (default: this file's folder)

    [[python]]                         # your own tools (machine.tools.plugins)
    factory = "my_tools:make_source"   # module:callable returning a ToolSource
    options = { region = "eu" }        # optional: keyword arguments for the factory

Any table may also say `expose = "direct"`: its tools are then MCP tools of their own too,
beside `execute` (`LoadedSources.direct`; the server lists and calls them, each call a
one-call execution through the same journal, policy and approvals). The default,
`expose = "code"`, offers them to agent code only.

Read once at start-up; a document that cannot be read or is not OpenAPI 3.0/3.1 stops the
server with a message naming the source, rather than leaving its tools silently missing. The
kinds of table are `machine.tools.kinds`, one file each.
"""

from __future__ import annotations

import logging
import time
import tomllib
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from lockgate.machine.secrets import SecretStore
from lockgate.machine.tools.errors import InvalidToolSource
from lockgate.machine.tools.http_calls import HttpLimits
from lockgate.machine.tools.kinds import KINDS, TABLE_NAMES, kind_named
from lockgate.machine.tools.source_tables import Origin
from lockgate.machine.tools.spec import ToolSource

log = logging.getLogger("lockgate.sources")

#: How a source's tools may be reached: from agent code only, or as MCP tools too.
EXPOSE = ("code", "direct")


class LoadedSources(list[ToolSource]):
    """The sources of a sources file, in order, and the names of those exposed directly."""

    def __init__(self, sources: list[ToolSource], direct: frozenset[str]) -> None:
        super().__init__(sources)
        self.direct = direct


def _exposure(entry: Mapping[str, Any], where: str) -> tuple[dict[str, Any], bool]:
    """The table without its `expose` key (which every kind takes), and whether it said
    `direct`."""
    table = dict(entry)
    expose = table.pop("expose", "code")
    if expose not in EXPOSE:
        raise InvalidToolSource(
            f"{where}: expose must be {' or '.join(repr(e) for e in EXPOSE)}, not {expose!r}",
            hint='expose = "direct" lists its tools as MCP tools beside execute.',
        )
    return table, expose == "direct"


def load_sources(
    path: Path, limits: HttpLimits, secrets: SecretStore | None = None
) -> LoadedSources:
    """`secrets` resolve a GraphQL source's credential for its introspection at start-up."""
    try:
        config = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InvalidToolSource(
            f"the sources file {path} cannot be read ({exc.strerror})",
            hint="Check LOCKGATE_SOURCES_FILE.",
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise InvalidToolSource(f"the sources file {path} is not valid TOML: {exc}") from None
    unknown = sorted(set(config) - {kind.name for kind in KINDS})
    if unknown:
        raise InvalidToolSource(
            f"the sources file {path} has unknown sections: {', '.join(unknown)}",
            hint=f"Each source is an {TABLE_NAMES} table.",
        )
    origin = Origin(f"the sources file {path}", path.parent)
    made: list[ToolSource] = []
    direct: set[str] = set()
    for kind in KINDS:
        for number, given in enumerate(config.get(kind.name, []), start=1):
            label = f"[[{kind.name}]] number {number} of {path}"
            if not isinstance(given, Mapping):
                raise InvalidToolSource(f"{label} is not a table")
            entry, exposed = _exposure(given, label)
            if not kind.named:  # its messages say which table it is
                made.append(kind.build(entry, replace(origin, label=label), limits, secrets))
                if exposed:
                    direct.add(made[-1].name)
                continue
            # Said as each one loads, so a start with a large API is never silent for long.
            log.info("loading %s source %r", kind.name, entry.get("name"))
            began = time.monotonic()
            made.append(kind.build(entry, origin, limits, secrets))
            log.info(
                "loaded %s source %r: %d tools in %.1f s",
                kind.name,
                made[-1].name,
                len(made[-1].tools()),
                time.monotonic() - began,
            )
            if exposed:
                direct.add(made[-1].name)
    return LoadedSources(made, frozenset(direct))


def build_source(
    kind: str,
    entry: Mapping[str, Any],
    origin: Origin,
    limits: HttpLimits,
    secrets: SecretStore | None = None,
) -> ToolSource:
    """The source a table of a storable kind (`[[openapi]]`, ...) describes."""
    return kind_named(kind, stored=True).build(entry, origin, limits, secrets)


def settled_source(
    kind: str,
    entry: Mapping[str, Any],
    origin: Origin,
    limits: HttpLimits,
    secrets: SecretStore | None = None,
) -> tuple[dict[str, Any], ToolSource]:
    """The source `entry` describes, and `entry` as it is stored: what was fetched to build
    it kept as text (an OpenAPI document, a GraphQL schema from introspection), with the
    base URL it resolved to, so every instance builds the same tools from it and fetches
    nothing."""
    return kind_named(kind, stored=True).settled(entry, origin, limits, secrets)
