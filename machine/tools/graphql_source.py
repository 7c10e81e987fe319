"""A GraphQL API as a tool source: `tools.<name>.query(query=..., variables=...)` for reads,
made at once, and `tools.<name>.mutate(...)` for mutations, which wait for a person.

Two tools that take a GraphQL document, rather than a generated tool per field: choosing the
fields it needs is what the code uses GraphQL for, and a document is what a person approving
a mutation can read. Each document is parsed and validated against the API's schema by
graphql-core before anything is journaled or paused: a query refuses a mutation (and the
reverse), an unknown field or a missing variable is named, so an approval is never spent on
a document the API would refuse. The schema is read from the endpoint (introspection) or
from a file (SDL, or an introspection result as JSON); calls go over HTTP with the same bounds
and credentials as OpenAPI's.

Schemas are taken as published. GitHub's breaks some of GraphQL's own rules about schemas
(interface fields deprecated in one implementation only) and its SDL defines a field twice:
graphql-core refuses such a schema whole, and refuses to validate any document against it.
So the rules a schema breaks are logged once, when it is loaded, and documents are
validated with the schema assumed valid: every rule about the document still holds.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from graphql import (
    GraphQLError,
    GraphQLSchema,
    OperationDefinitionNode,
    OperationType,
    build_ast_schema,
    build_client_schema,
    get_introspection_query,
    parse,
    validate,
    validate_schema,
)
from graphql.validation.validate import validate_sdl
from pydantic import JsonValue

from lockgate.machine.policy import PolicyDecision
from lockgate.machine.tools.errors import InvalidToolSource, ToolFailed
from lockgate.machine.tools.http_calls import Auth, HttpLimits, send
from lockgate.machine.tools.spec import ToolContext, ToolSpec

log = logging.getLogger("lockgate.sources")

#: GraphQL errors a failure quotes at most (the rest are counted).
QUOTED_ERRORS = 3
#: A schema's broken rules a load warning quotes at most.
QUOTED_RULES = 3

_ARGUMENTS: dict[str, JsonValue] = {
    "type": "object",
    "properties": {
        "query": {"type": "string", "minLength": 1, "description": "The GraphQL document."},
        "variables": {"type": "object", "description": "Values of its $variables."},
    },
    "required": ["query"],
    "additionalProperties": False,
}


class GraphQLOperation:
    """`query` or `mutate` of one GraphQL source."""

    def __init__(self, source: GraphQLSource, kind: OperationType) -> None:
        self._source, self.kind = source, kind
        read = kind is OperationType.QUERY
        self.spec = ToolSpec(
            source=source.name,
            name="query" if read else "mutate",
            description=(
                f"Run a GraphQL {'query' if read else 'mutation'} against {source.endpoint} "
                "(one operation; variables as a dict)"
            ),
            parameters=_ARGUMENTS,
            returns="dict[str, Any]",
            idempotent=read,
            default_policy=PolicyDecision.APPROVE if read else PolicyDecision.REQUIRE_APPROVAL,
            secrets=(source.auth.secret,) if source.auth is not None else (),
            operation=kind.value,
        )

    def problems(self, arguments: Mapping[str, JsonValue]) -> list[str]:
        """What the API would refuse in the document, found before any pause."""
        text = arguments.get("query")
        if not isinstance(text, str):
            return []  # the JSON Schema already refused it
        try:
            document = parse(text)
        except GraphQLError as exc:
            return [f"argument 'query' is not GraphQL: {exc.message}"]
        operations = [d for d in document.definitions if isinstance(d, OperationDefinitionNode)]
        if len(operations) != 1:
            return [f"argument 'query' must hold one operation (it holds {len(operations)})"]
        kind = operations[0].operation
        if kind is not self.kind:
            other = {
                OperationType.QUERY: "query",
                OperationType.MUTATION: "mutate",
            }.get(kind)
            use = f": use tools.{self._source.name}.{other}" if other else " (not supported)"
            return [f"argument 'query' is a {kind.value}{use}"]
        return [f"argument 'query': {e.message}" for e in validate(self._source.schema, document)]

    def call(self, arguments: dict[str, JsonValue], context: ToolContext) -> JsonValue:
        body: dict[str, JsonValue] = {"query": arguments["query"]}
        if "variables" in arguments:
            body["variables"] = arguments["variables"]
        answer = send(
            "POST", self._source.endpoint, f"GraphQL {self.spec.name}", self._source.limits,
            query={}, headers={}, body=body, sent=True,
            auth=self._source.auth, secrets=context.secrets,
        )  # fmt: skip
        if not isinstance(answer, dict):
            raise ToolFailed(f"GraphQL {self.spec.name}: the API answered no GraphQL response")
        errors = answer.get("errors")
        if isinstance(errors, list) and errors:
            said = [str(e.get("message", e)) if isinstance(e, dict) else str(e) for e in errors]
            more = f" (and {len(said) - QUOTED_ERRORS} more)" if len(said) > QUOTED_ERRORS else ""
            raise ToolFailed(
                f"GraphQL {self.spec.name}: the API answered errors: "
                + "; ".join(said[:QUOTED_ERRORS])
                + more
            )
        return answer.get("data")


class GraphQLSource:
    """One GraphQL endpoint and its schema."""

    #: Its kind of table (`machine.tools.kinds`), as `list_sources` shows it.
    kind = "graphql"

    def __init__(
        self,
        name: str,
        endpoint: str,
        schema: GraphQLSchema,
        *,
        limits: HttpLimits | None = None,
        auth: Auth | None = None,
    ) -> None:
        self.name, self.endpoint, self.schema = name, endpoint, schema
        self.limits, self.auth = limits or HttpLimits(), auth
        kinds = [OperationType.QUERY]
        if schema.mutation_type is not None:
            kinds.append(OperationType.MUTATION)
        self._tools = [GraphQLOperation(self, kind) for kind in kinds]

    def tools(self) -> Sequence[GraphQLOperation]:
        return self._tools


def _first_lines(messages: Sequence[str]) -> str:
    quoted = "; ".join(m.splitlines()[0] for m in messages[:QUOTED_RULES])
    more = len(messages) - QUOTED_RULES
    return quoted + (f" (and {more} more)" if more > 0 else "")


def as_published(name: str, schema: GraphQLSchema) -> GraphQLSchema:
    """`schema`, built with `assume_valid`, after logging once the rules it breaks."""
    kwargs: dict[str, Any] = {**schema.to_kwargs(), "assume_valid": False}
    checked = GraphQLSchema(**kwargs)
    broken = [error.message for error in validate_schema(checked)]
    if broken:
        log.warning(
            "source %r: its schema breaks %d of GraphQL's rules for schemas, and is used as "
            "published (documents are still validated against it): %s",
            name,
            len(broken),
            _first_lines(broken),
        )
    return schema


def schema_from_sdl(name: str, sdl: str) -> GraphQLSchema:
    """The schema an SDL document (or an introspection result as JSON) describes."""
    if sdl.lstrip().startswith("{"):
        return schema_from_introspection(name, _json(name, sdl))
    try:
        document = parse(sdl)
    except GraphQLError as exc:
        raise InvalidToolSource(f"source {name!r}: its schema is not SDL ({exc.message})") from None
    # Published SDL that defines a field twice (GitHub's does) is read as the endpoint
    # serves it: graphql-core merges what it need not refuse.
    broken = [error.message for error in validate_sdl(document)]
    if broken:
        log.warning(
            "source %r: its SDL is read as published despite: %s", name, _first_lines(broken)
        )
    try:
        return as_published(name, build_ast_schema(document, assume_valid=True))
    except (GraphQLError, TypeError) as exc:
        raise InvalidToolSource(f"source {name!r}: its schema is not usable ({exc})") from None


def _json(name: str, text: str) -> object:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise InvalidToolSource(
            f"source {name!r}: its schema file is neither SDL nor introspection JSON ({exc})"
        ) from None


def schema_from_introspection(name: str, answer: object) -> GraphQLSchema:
    """The schema an introspection result describes (`{"__schema": ...}`, or a response
    whose `data` holds it)."""
    data = answer.get("data", answer) if isinstance(answer, dict) else None
    if not isinstance(data, dict) or "__schema" not in data:
        raise InvalidToolSource(
            f"source {name!r}: its schema is not an introspection result (no __schema)",
            hint="Give the SDL, or the JSON answer to the introspection query.",
        )
    try:
        return as_published(name, build_client_schema(data, assume_valid=True))  # type: ignore[arg-type]
    except (GraphQLError, TypeError) as exc:
        raise InvalidToolSource(
            f"source {name!r}: its introspection is not usable ({exc})"
        ) from None


def schema_by_introspection(
    name: str,
    endpoint: str,
    limits: HttpLimits,
    auth: Auth | None = None,
    secrets: Mapping[str, str] | None = None,
) -> GraphQLSchema:
    """The endpoint's schema, asked of the endpoint itself (with the source's credential,
    its secret's value in `secrets`). The answer is a schema document, bounded as one
    (`LOCKGATE_MAX_SOURCE_DOCUMENT_BYTES`), not as a tool's answer."""
    bound = replace(
        limits,
        max_response_bytes=limits.document_bytes,
        size_setting="LOCKGATE_MAX_SOURCE_DOCUMENT_BYTES",
        too_large="raise it, or give the schema as a file (SDL, or the introspection JSON).",
    )
    try:
        answer = send(
            "POST", endpoint, "GraphQL introspection", bound,
            query={}, headers={}, body={"query": get_introspection_query()}, sent=True,
            auth=auth, secrets=secrets,
        )  # fmt: skip
    except ToolFailed as exc:
        raise InvalidToolSource(f"source {name!r}: {exc.message}") from None
    data = answer.get("data") if isinstance(answer, dict) else None
    if not isinstance(data, dict):
        raise InvalidToolSource(
            f"source {name!r}: {endpoint} did not answer the introspection query",
            hint='Give the schema as an SDL file instead (schema = "schema.graphql").',
        )
    return schema_from_introspection(name, data)
