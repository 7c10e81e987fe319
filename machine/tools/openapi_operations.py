"""What one OpenAPI operation's tool takes: its arguments' JSON Schema (the path, query and
header parameters, and `body`), how each reaches the API, and how its body is sent.

OpenAPI 3.0's schema dialect is turned into JSON Schema 2020-12 first (`nullable`, boolean
`exclusiveMinimum`/`exclusiveMaximum`); 3.1's already is. `$ref`s are followed anywhere in
the document (`machine.tools.openapi_refs`), and what the schema refers to is carried with
it. Anything that keeps an operation from being served raises ValueError in words (its
source leaves that operation out, `machine.tools.openapi`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import JsonValue

from lockgate.machine.tools.form_bodies import BodyEncoding, chosen_media, encoding_of
from lockgate.machine.tools.openapi_refs import DocumentRefs
from lockgate.machine.tools.schema import check_schema
from lockgate.machine.tools.spec import PlainJson, identifier, is_plain_json


def to_json_schema(schema: Any) -> Any:
    """An OpenAPI 3.0 schema object as JSON Schema 2020-12 (a copy; the input is kept). A
    property named `nullable` (an object, not the keyword's boolean) is kept."""
    if isinstance(schema, list):
        return [to_json_schema(item) for item in schema]
    if not isinstance(schema, Mapping):
        return schema
    out = {
        key: to_json_schema(value)
        for key, value in schema.items()
        if key != "nullable" or not isinstance(value, bool)
    }
    for bound, exclusive in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
        if out.get(exclusive) is True and bound in out:
            out[exclusive] = out.pop(bound)
        elif isinstance(out.get(exclusive), bool):
            del out[exclusive]
    if schema.get("nullable") is True:
        declared = out.get("type")
        if isinstance(declared, str):
            out["type"] = [declared, "null"]
        elif declared is None:
            out = {"anyOf": [out, {"type": "null"}]}
    return out


def check_part(part: Any, where: str) -> None:
    """A part of the document a tool's schema refers to, checked as a JSON Schema."""
    if isinstance(part, bool):
        return
    if not isinstance(part, Mapping):
        raise ValueError(f"{where} is a {type(part).__name__}, not a schema")
    if not is_plain_json(part):
        raise ValueError(f"{where} holds a value JSON cannot (a YAML date, a non-text key?)")
    check_schema(part, where)


@dataclass(frozen=True)
class LeftOut:
    """An operation of the document that is not served, and why, in words. Named with its
    source's name only when shown: a catalogue kept for a document serves every source
    built from it, whatever each is called."""

    method: str  # as the document writes it: get, post…
    path: str
    tool: str  # the tool it would have been
    why: str

    def shown(self, source: str) -> str:
        where = f"{self.method.upper()} {self.path} (tool {source}.{self.tool})"
        return f"{where} is left out: {self.why}"


@dataclass(frozen=True)
class Parameter:
    argument: str  # the keyword agent code passes
    name: str  # the name the API knows
    location: str  # path | query | header


@dataclass(frozen=True)
class OperationShape:
    """What one operation's tool takes, and how its arguments reach the API."""

    parameters_schema: PlainJson
    parameters: tuple[Parameter, ...]
    body: str | None
    encoding: BodyEncoding | None


class OperationShapes:
    """Builds each operation's `OperationShape` from one document."""

    def __init__(self, document: Mapping[str, Any], *, legacy: bool) -> None:
        self._legacy = legacy
        self.refs = DocumentRefs(
            document, prepare=to_json_schema if legacy else None, check=check_part
        )

    def _schema(self, schema: Any) -> dict[str, Any]:
        converted = to_json_schema(schema) if self._legacy else schema
        if not isinstance(converted, Mapping):
            return {}
        out = dict(converted)
        target = self.refs.follow(out)
        if target is not out and isinstance(target, Mapping) and "type" in target:
            out["type"] = target["type"]  # shown in the signature; the $ref still applies
        return out

    def _declared(
        self, operation: Mapping[str, Any], shared: Sequence[Any]
    ) -> dict[tuple[str, str], Mapping[str, Any]]:
        """The operation's parameters by place and name: an operation's own replace the
        path's of the same name and place; a cookie's, or one without a name, is not sent."""
        by_key: dict[tuple[str, str], Mapping[str, Any]] = {}
        own = operation.get("parameters") or []
        for raw in [*(shared if isinstance(shared, list) else []), *own]:
            p = self.refs.follow(raw)
            if (
                isinstance(p, Mapping)
                and p.get("in") in ("path", "query", "header")
                and isinstance(p.get("name"), str)
            ):
                by_key[(str(p["in"]), p["name"])] = p
        return by_key

    def shape(self, operation: Mapping[str, Any], shared: Sequence[Any]) -> OperationShape:
        properties: dict[str, Any] = {}
        required: list[JsonValue] = []
        parameters: list[Parameter] = []
        for (location, api_name), p in self._declared(operation, shared).items():
            argument = identifier(api_name)
            while argument in properties:
                argument = f"{argument}_"
            schema = self._schema(p.get("schema", {}))
            if p.get("description"):
                schema.setdefault("description", p["description"])
            properties[argument] = schema
            parameters.append(Parameter(argument, api_name, location))
            if location == "path" or p.get("required"):
                required.append(argument)
        body_argument, encoding = None, None
        request = self.refs.follow(operation.get("requestBody"))
        content = request.get("content") if isinstance(request, Mapping) else None
        offered = chosen_media(content) if isinstance(content, Mapping) else None
        if isinstance(request, Mapping) and offered is not None:
            media, media_object = offered
            body_argument = "body" if "body" not in properties else "body_"
            raw_schema = self.refs.follow(media_object.get("schema", {}))
            properties[body_argument] = self._schema(media_object.get("schema", {}))
            encoding = encoding_of(media, media_object, raw_schema)
            if request.get("required"):
                required.append(body_argument)
        if not is_plain_json(properties):
            raise ValueError("its arguments' schema holds a value JSON cannot (a YAML date?)")
        parameters_schema = PlainJson(
            type="object", properties=properties, required=required, additionalProperties=False
        )
        # What the schema refers to, where `#/...` pointers resolve (the components, and any
        # other part of the document: a parameter of another path...), each part checked
        # plain JSON once: the ToolSpec keeps the schema as it is (`PlainJson`).
        parameters_schema.update(self.refs.carried(properties))
        return OperationShape(parameters_schema, tuple(parameters), body_argument, encoding)
