"""An OpenAPI 3.0 or 3.1 document as a tool source: one tool per operation, called over HTTP.

Each operation becomes `tools.<source>.<operationId>` (or `<method>_<path>` without one), its
keyword arguments the operation's path, query and header parameters plus `body` for its
request body (JSON, a form or multipart, as declared: `machine/tools/form_bodies.py`).
Reads (GET, HEAD, OPTIONS) are idempotent and approved by default; every other method needs
a person's approval by default. A call goes to the server the document names
(or the source's `base_url`) with httpx, bounded in time, redirects and response size; an
HTTP error reaches the code as a `RuntimeError` naming the status with an excerpt of the body.

`$ref`s are resolved by `jsonschema`'s own `referencing` library: each tool's schema carries
the document's `components`, so `#/components/...` pointers resolve where they are written.
OpenAPI 3.0's schema dialect is turned into JSON Schema 2020-12 first (`nullable`, boolean
`exclusiveMinimum`/`exclusiveMaximum`); 3.1's already is.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urljoin

from pydantic import JsonValue, ValidationError
from referencing import Registry
from referencing.exceptions import Unresolvable
from referencing.jsonschema import DRAFT202012

from lockgate.machine.policy import PolicyDecision
from lockgate.machine.tools.errors import InvalidToolSource
from lockgate.machine.tools.form_bodies import (
    FORM,
    MULTIPART,
    BodyEncoding,
    chosen_media,
    encoding_of,
    form_fields,
    multipart_parts,
)
from lockgate.machine.tools.http_calls import Auth, HttpLimits, send
from lockgate.machine.tools.openapi_catalogue import Catalogue, CataloguedOperation
from lockgate.machine.tools.spec import ToolContext, ToolSpec, identifier

METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
READS = frozenset({"get", "head", "options"})
#: `$ref`s followed in a row before a chain is taken for a cycle.
MAX_REF_HOPS = 32


def to_json_schema(schema: Any) -> Any:
    """An OpenAPI 3.0 schema object as JSON Schema 2020-12 (a copy; the input is kept)."""
    if isinstance(schema, list):
        return [to_json_schema(item) for item in schema]
    if not isinstance(schema, Mapping):
        return schema
    out = {key: to_json_schema(value) for key, value in schema.items() if key != "nullable"}
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


@dataclass(frozen=True)
class Parameter:
    argument: str  # the keyword agent code passes
    name: str  # the name the API knows
    location: str  # path | query | header


#: How much of an operation's description (and tags) is kept for finding it.
ABOUT_CHARS = 600

#: Sent with every write: the call's idempotency key.
IDEMPOTENCY_HEADER = "Idempotency-Key"


class OpenApiOperation:
    def __init__(
        self,
        source: OpenApiSource,
        spec: ToolSpec,
        method: str,
        path: str,
        parameters: Sequence[Parameter],
        body: str | None,
        encoding: BodyEncoding | None = None,
    ) -> None:
        self._source, self._spec = source, spec
        self.method, self.path = method, path
        self._parameters, self._body = parameters, body
        #: How the body is sent (JSON, a form, multipart), as the operation declares.
        self.encoding = encoding or BodyEncoding()

    @property
    def spec(self) -> ToolSpec:
        return self._spec

    @property
    def api_parameters(self) -> Sequence[Parameter]:
        return self._parameters

    @property
    def body_argument(self) -> str | None:
        return self._body

    def call(self, arguments: dict[str, JsonValue], context: ToolContext) -> JsonValue:
        path = self.path
        query: dict[str, Any] = {}
        headers: dict[str, str] = {}
        for p in self._parameters:
            if p.argument not in arguments:
                continue
            value = arguments[p.argument]
            if p.location == "path":
                path = path.replace(f"{{{p.name}}}", _segment(_text(value)))
            elif p.location == "query":
                if isinstance(value, list):
                    query[p.name] = [_text(v) for v in value]
                else:
                    query[p.name] = _text(value)
            else:
                headers[p.name] = _text(value)
        if self.method not in READS:
            # The call's journal id, the same on every attempt: an API that honours the
            # header (Stripe's convention, an IETF draft) makes a write sent again after a
            # crash in doubt at most once on its side too.
            headers.setdefault(IDEMPOTENCY_HEADER, context.idempotency_key)
        body = arguments.get(self._body) if self._body is not None else None
        sent = self._body is not None and self._body in arguments
        media, method = self.encoding.media, self.method.upper()
        form = form_fields(body, self.encoding) if sent and media == FORM else None
        parts = multipart_parts(body, self.encoding) if sent and media == MULTIPART else None
        return send(
            method, self._source.base_url.rstrip("/") + path, f"{method} {path}",
            self._source.limits, query=query, headers=headers, body=body,
            sent=sent and form is None and parts is None, form=form, parts=parts,
            auth=self._source.auth, secrets=context.secrets,
        )  # fmt: skip


def _first_problem(exc: Exception) -> str:
    if isinstance(exc, ValidationError):  # the ToolSpec refused the operation's schema
        return str(exc.errors()[0]["msg"]).removeprefix("Value error, ")
    return f"{type(exc).__name__}: {str(exc).splitlines()[0]}"


def _segment(text: str) -> str:
    """`text` as one path segment: every `/` encoded, and `.` or `..` too, which URL
    normalisation would otherwise resolve (`/items/..` is `/`): a path parameter never
    reaches another path than its operation's."""
    segment = quote(text, safe="")
    return segment.replace(".", "%2E") if segment in (".", "..") else segment


def _text(value: JsonValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"))


class OpenApiSource:
    """The operations of one OpenAPI document (a mapping, already parsed)."""

    #: Its kind of table (`machine.tools.kinds`), as `list_sources` shows it.
    kind = "openapi"
    #: The document's operations it cannot serve, each named with why.
    left_out: tuple[str, ...] = ()

    def __init__(
        self,
        name: str,
        document: Mapping[str, Any],
        *,
        base_url: str | None = None,
        document_url: str | None = None,
        limits: HttpLimits | None = None,
        auth: Auth | None = None,
    ) -> None:
        self.name = name
        self.auth = auth
        version = str(document.get("openapi", ""))
        if not version.startswith(("3.0.", "3.1.")):
            raise InvalidToolSource(
                f"source {name!r}: not an OpenAPI 3.0 or 3.1 document (openapi: {version!r})",
                hint="Give the document's JSON or YAML (Swagger 2.0 must be converted first).",
            )
        self._legacy = version.startswith("3.0.")
        #: The document's first server URL, as written.
        self.server_url = self._first_server(document)
        self._serve_at(base_url, document_url, limits)
        components = document.get("components", {})
        if not isinstance(components, Mapping):
            raise InvalidToolSource(
                f"source {name!r}: its document's 'components' is not an object"
            )
        self._components = to_json_schema(components) if self._legacy else components
        self._resolver = Registry().resolver_with_root(
            DRAFT202012.create_resource({"components": self._components})
        )
        self._tools = self._operations(document)

    def _serve_at(
        self, base_url: str | None, document_url: str | None, limits: HttpLimits | None
    ) -> None:
        url = self.server_url
        # A relative server URL is relative to where the document was read from.
        found = base_url or (
            None
            if url is None
            else urljoin(document_url, url)
            if document_url
            else url
            if "://" in url
            else None
        )
        if not found:
            raise InvalidToolSource(
                f"source {self.name!r}: the document names no server URL",
                hint="Set base_url for this source (for example http://127.0.0.1:8080).",
            )
        self.base_url: str = found
        self.limits = limits or HttpLimits()

    def tools(self) -> Sequence[OpenApiOperation]:
        return self._tools

    @staticmethod
    def _first_server(document: Mapping[str, Any]) -> str | None:
        servers = document.get("servers")
        first = servers[0] if isinstance(servers, list) and servers else None
        url = first.get("url") if isinstance(first, Mapping) else None
        return url if isinstance(url, str) else None

    def catalogue(self) -> Catalogue:
        """What was built from the document, to serve again without it (`openapi_catalogue`)."""
        return Catalogue(
            operations=tuple(
                CataloguedOperation(
                    spec=tool.spec.model_dump(mode="json", exclude={"source", "secrets", "owner"}),
                    method=tool.method,
                    path=tool.path,
                    parameters=tuple((p.argument, p.name, p.location) for p in tool.api_parameters),
                    body=tool.body_argument,
                    encoding=tool.encoding,
                )
                for tool in self._tools
            ),
            server_url=self.server_url,
            left_out=self.left_out,
        )

    @classmethod
    def from_catalogue(
        cls,
        name: str,
        catalogue: Catalogue,
        *,
        base_url: str | None = None,
        document_url: str | None = None,
        limits: HttpLimits | None = None,
        auth: Auth | None = None,
    ) -> OpenApiSource:
        """The source a catalogue built before describes: its specs were checked when it
        was built, so they are made again without being checked (the costly part)."""
        source = cls.__new__(cls)
        source.name, source.auth, source.server_url = name, auth, catalogue.server_url
        source._serve_at(base_url, document_url, limits)
        source.left_out = catalogue.left_out
        secrets = (auth.secret,) if auth is not None else ()
        source._tools = [
            OpenApiOperation(
                source,
                ToolSpec.model_construct(
                    **{**op.spec, "default_policy": PolicyDecision(str(op.spec["default_policy"]))},
                    source=name,
                    secrets=secrets,
                ),
                op.method,
                op.path,
                [Parameter(*p) for p in op.parameters],
                op.body,
                op.encoding,
            )
            for op in catalogue.operations
        ]
        return source

    def _resolve(self, item: Any) -> Any:
        """A `$ref` to the document's components, followed (a parameter, a request body)."""
        for _ in range(MAX_REF_HOPS):
            if not (isinstance(item, Mapping) and isinstance(item.get("$ref"), str)):
                return item
            item = self._resolver.lookup(item["$ref"]).contents
        raise ValueError(f"more than {MAX_REF_HOPS} $refs in a row (a cycle?)")

    def _schema(self, schema: Any) -> dict[str, Any]:
        converted = to_json_schema(schema) if self._legacy else schema
        if not isinstance(converted, Mapping):
            return {}
        out = dict(converted)
        target = self._resolve(out)
        if target is not out and isinstance(target, Mapping) and "type" in target:
            out["type"] = target["type"]  # shown in the signature; the $ref still applies
        return out

    def _used_components(self, schema: Any) -> dict[str, Any]:
        """The components `schema` refers to, directly or through one another: each tool
        carries only those (its listing stays its own size, not the whole document's)."""
        used: dict[str, dict[str, Any]] = {}
        todo = [schema]
        while todo:
            node = todo.pop()
            if isinstance(node, list):
                todo.extend(node)
                continue
            if not isinstance(node, Mapping):
                continue
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/components/") and ref.count("/") == 3:
                _, _, kind, escaped = ref.split("/")
                name = escaped.replace("~1", "/").replace("~0", "~")
                if name not in used.setdefault(kind, {}):
                    target = self._resolver.lookup(ref).contents
                    used[kind][name] = target
                    todo.append(target)
            todo.extend(node.values())
        return {kind: found for kind, found in used.items() if found}

    def _operations(self, document: Mapping[str, Any]) -> list[OpenApiOperation]:
        made: list[OpenApiOperation] = []
        taken: set[str] = set()
        paths = document.get("paths") or {}
        if not isinstance(paths, Mapping):
            raise InvalidToolSource(
                f"source {self.name!r}: its document's 'paths' is a {type(paths).__name__}, "
                "not an object of paths",
                hint="An OpenAPI document's paths map each path to its operations.",
            )
        for path, item in paths.items():
            if not isinstance(item, Mapping):
                continue
            shared = item.get("parameters", [])
            for method in METHODS:
                operation = item.get(method)
                if isinstance(operation, Mapping):
                    try:
                        made.append(self._operation(str(path), method, operation, shared, taken))
                    except (Unresolvable, ValueError) as exc:  # a bad $ref, an invalid schema
                        raise InvalidToolSource(
                            f"source {self.name!r}: {method.upper()} {path} cannot be served "
                            f"({_first_problem(exc)})",
                            hint="Fix the operation in the document, or remove it.",
                        ) from None
        return made

    def _operation(
        self,
        path: str,
        method: str,
        operation: Mapping[str, Any],
        shared: Sequence[Any],
        taken: set[str],
    ) -> OpenApiOperation:
        name = identifier(str(operation.get("operationId") or f"{method}_{path}"))
        while name in taken:
            name = f"{name}_"
        taken.add(name)
        # Operation-level parameters replace path-level ones of the same name and place.
        by_key: dict[tuple[str, str], Mapping[str, Any]] = {}
        own = operation.get("parameters") or []
        for raw in [*(shared if isinstance(shared, list) else []), *own]:
            p = self._resolve(raw)
            if (
                isinstance(p, Mapping)
                and p.get("in") in ("path", "query", "header")
                and isinstance(p.get("name"), str)
            ):
                by_key[(str(p["in"]), p["name"])] = p
        properties: dict[str, Any] = {}
        required: list[JsonValue] = []
        parameters: list[Parameter] = []
        for (location, api_name), p in by_key.items():
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
        request = self._resolve(operation.get("requestBody"))
        content = request.get("content") if isinstance(request, Mapping) else None
        offered = chosen_media(content) if isinstance(content, Mapping) else None
        if isinstance(request, Mapping) and offered is not None:
            media, media_object = offered
            body_argument = "body" if "body" not in properties else "body_"
            raw_schema = self._resolve(media_object.get("schema", {}))
            properties[body_argument] = self._schema(media_object.get("schema", {}))
            encoding = encoding_of(media, media_object, raw_schema)
            if request.get("required"):
                required.append(body_argument)
        parameters_schema: dict[str, JsonValue] = {
            "type": "object",
            "properties": properties,
            "required": required,
            "additionalProperties": False,
        }
        used = self._used_components(properties)
        if used:
            parameters_schema["components"] = used  # where `#/components/...` resolves
        summary = str(operation.get("summary") or operation.get("description") or "").strip()
        tags = operation.get("tags")
        words = [str(operation.get("description") or ""), *(tags if isinstance(tags, list) else [])]
        read = method in READS
        spec = ToolSpec(
            source=self.name,
            name=name,
            description=f"{summary.splitlines()[0] if summary else name} ({method.upper()} {path})",
            parameters=parameters_schema,
            returns="Any",
            idempotent=read,
            default_policy=PolicyDecision.APPROVE if read else PolicyDecision.REQUIRE_APPROVAL,
            secrets=(self.auth.secret,) if self.auth is not None else (),
            operation=method.upper(),
            about=" ".join(map(str, words))[:ABOUT_CHARS],
        )
        return OpenApiOperation(self, spec, method, path, parameters, body_argument, encoding)
