"""`[[graphql]]`: a GraphQL endpoint, as `query` and `mutate` tools checked against its
schema (an SDL file, or asked of the endpoint by introspection)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from lockgate.machine.tools.errors import InvalidToolSource
from lockgate.machine.tools.source_entries import auth_table, document_text, in_words, named
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
    from lockgate.machine.tools.graphql_source import GraphQLSource
    from lockgate.machine.tools.http_calls import HttpLimits

KEYS = ("endpoint", "schema", "auth")


def build(
    entry: Mapping[str, Any], origin: Origin, limits: HttpLimits, secrets: SecretStore | None
) -> GraphQLSource:
    from lockgate.machine.secrets import EnvironmentSecrets, MissingSecret
    from lockgate.machine.tools.graphql_source import (
        GraphQLSource,
        schema_by_introspection,
        schema_from_sdl,
    )

    name = named(entry, origin, "graphql", KEYS)
    endpoint = entry.get("endpoint")
    if not isinstance(endpoint, str) or not endpoint.startswith(("http://", "https://")):
        raise InvalidToolSource(f"source {name!r} in {origin}: endpoint must be an http(s) URL")
    auth = auth_table(name, entry.get("auth"), origin)
    sdl = entry.get("schema")
    with in_words(entry):
        if sdl is not None:
            if not isinstance(sdl, str):
                raise InvalidToolSource(f"source {name!r} in {origin}: schema must be a file name")
            text, _ = document_text(name, sdl, origin.directory, limits)
            schema = schema_from_sdl(name, text)
        else:
            values: dict[str, str] = {}
            if auth is not None:
                store = secrets if secrets is not None else EnvironmentSecrets()
                try:
                    values = store.resolve([auth.secret], source=name)
                except MissingSecret as exc:
                    raise InvalidToolSource(
                        f"source {name!r}: its introspection needs {exc.message}", hint=exc.hint
                    ) from None
            schema = schema_by_introspection(name, endpoint, limits, auth, values)
        return GraphQLSource(name, endpoint, schema, limits=limits, auth=auth)


def settle(
    entry: Mapping[str, Any], origin: Origin, limits: HttpLimits, secrets: SecretStore | None
) -> tuple[dict[str, Any], GraphQLSource]:
    """Stored with its schema as SDL text (introspected once, when it is added)."""
    from graphql import print_schema

    config = dict(entry)
    source = build(config, origin, limits, secrets)
    if "schema" not in config:
        config["schema"] = print_schema(source.schema)
    return config, source


def _command_line(given: CommandLine) -> dict[str, Any]:
    entry: dict[str, Any] = {"endpoint": given.target}
    if given.schema is not None:
        entry["schema"] = given.schema
    return entry


ADD = admin_tool(
    "add_graphql_source",
    "Add a GraphQL endpoint as a source: tools.<name>.query(query=..., variables=...) and "
    "tools.<name>.mutate(...). schema: optional SDL text; without it the endpoint is "
    "introspected. Returns {name, kind, scope, tools}.",
    arguments(
        ["name", "endpoint"],
        name=NAME_ARGUMENT,
        endpoint={"type": "string", "pattern": "^https?://"},
        schema={"type": "string", "minLength": 1, "description": "Optional SDL text."},
        auth=AUTH_ARGUMENT,
    ),
    read=False,
)

GRAPHQL = SourceKind(
    name="graphql",
    keys=KEYS,
    about="a GraphQL endpoint, as query and mutate tools",
    build=build,
    settle=settle,
    offline=lambda entry: "schema" in entry,
    add_tool=ADD,
    command_line=_command_line,
    target_help="the endpoint URL (--schema: an SDL file, instead of introspection)",
)
