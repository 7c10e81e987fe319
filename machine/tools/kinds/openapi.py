"""`[[openapi]]`: an OpenAPI 3.0/3.1 document, each operation a tool."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from lockgate.machine.tools.errors import InvalidToolSource
from lockgate.machine.tools.openapi_catalogue import CatalogueShelf, catalogue_key
from lockgate.machine.tools.source_entries import auth_table, document_text, in_words, is_url, named
from lockgate.machine.tools.source_kind import (
    AUTH_ARGUMENT,
    NAME_ARGUMENT,
    CommandLine,
    SourceKind,
    admin_tool,
    arguments,
)
from lockgate.machine.tools.source_tables import Origin

if TYPE_CHECKING:
    from lockgate.machine.secrets import SecretStore
    from lockgate.machine.tools.http_calls import HttpLimits
    from lockgate.machine.tools.openapi import OpenApiSource

log = logging.getLogger("lockgate.sources")

KEYS = ("document", "base_url", "auth")


def build(
    entry: Mapping[str, Any],
    origin: Origin,
    limits: HttpLimits,
    secrets: SecretStore | None = None,
    *,
    document_url: str | None = None,
) -> OpenApiSource:
    """`document_url`: where the document (given as text) was fetched from, which its
    relative server URLs are relative to."""
    from lockgate.machine.tools.documents import load_document
    from lockgate.machine.tools.openapi import OpenApiSource

    name = named(entry, origin, "openapi", KEYS)
    where = entry.get("document")
    if not isinstance(where, str) or not where.strip():
        raise InvalidToolSource(f"source {name!r} in {origin} has no document")
    base_url = entry.get("base_url")
    if base_url is not None and not isinstance(base_url, str):
        raise InvalidToolSource(f"source {name!r} in {origin}: base_url must be a string")
    text, url = document_text(name, where, origin.directory, limits)
    auth = auth_table(name, entry.get("auth"), origin)
    # Only the operator's: a principal's limits keep nothing (`HttpLimits.for_principal`).
    shelf = CatalogueShelf(limits.catalogues) if limits.catalogues and origin.commands else None
    key = catalogue_key(text) if shelf is not None else ""
    kept = shelf.get(key) if shelf is not None else None
    with in_words(entry):
        if kept is not None:
            source = OpenApiSource.from_catalogue(
                name, kept, base_url=base_url, document_url=url or document_url,
                limits=limits, auth=auth,
            )  # fmt: skip
            log.info("source %r: served from the tools built before from the same document", name)
            # Built from the document, the source logs these itself (once, as it builds).
            for warning in source.left_out:
                log.warning("source %r: %s", name, warning)
        else:
            document = load_document(text, name=name, trusted=origin.commands)
            if not isinstance(document, Mapping):
                raise InvalidToolSource(
                    f"source {name!r}: its document is not a JSON or YAML object"
                )
            source = OpenApiSource(
                name, document, base_url=base_url, document_url=url or document_url,
                limits=limits, auth=auth,
            )  # fmt: skip
            if shelf is not None:
                shelf.put(key, source.catalogue())
    return source


def settle(
    entry: Mapping[str, Any], origin: Origin, limits: HttpLimits, secrets: SecretStore | None
) -> tuple[dict[str, Any], OpenApiSource]:
    """Stored with its document as text (fetched once) and the base URL it resolved to."""
    name = named(entry, origin, "openapi", KEYS)
    config = dict(entry)
    where = entry.get("document")
    if not isinstance(where, str) or not where.strip():
        raise InvalidToolSource(f"source {name!r} in {origin} has no document")
    text, url = document_text(name, where, origin.directory, limits, trusted=origin.commands)
    config["document"] = text
    source = build(config, origin, limits, secrets, document_url=url)
    config["base_url"] = source.base_url
    return config, source


def _command_line(given: CommandLine) -> dict[str, Any]:
    entry: dict[str, Any] = {"document": given.target}
    if given.base_url is not None:
        entry["base_url"] = given.base_url
    return entry


ADD = admin_tool(
    "add_openapi_source",
    "Add an OpenAPI 3.0/3.1 API as a source of tools for your code: each operation becomes "
    "tools.<name>.<operationId>(...). document: the document's JSON or YAML text, or its "
    "http(s) URL. Returns {name, kind, scope, tools}.",
    arguments(
        ["name", "document"],
        name=NAME_ARGUMENT,
        document={"type": "string", "minLength": 1, "description": "The text, or its URL."},
        base_url={
            "type": "string",
            "pattern": "^https?://",
            "description": "Optional: where calls go, instead of the document's first server.",
        },
        auth=AUTH_ARGUMENT,
    ),
    read=False,
)

OPENAPI = SourceKind(
    name="openapi",
    keys=KEYS,
    about="an OpenAPI 3.0/3.1 document, each operation a tool",
    build=build,
    settle=settle,
    offline=lambda entry: not is_url(entry.get("document")),
    add_tool=ADD,
    command_line=_command_line,
    target_help="the document's file or URL",
)
