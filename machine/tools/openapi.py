"""An OpenAPI 3.0 or 3.1 document as a tool source: one tool per operation, called over HTTP.

Each operation becomes `tools.<source>.<operationId>` (or `<method>_<path>` without one), its
keyword arguments the operation's path, query and header parameters plus `body` for its
request body (JSON, a form or multipart, as declared: `machine/tools/form_bodies.py`).
Reads (GET, HEAD, OPTIONS) are idempotent and approved by default; every other method needs
a person's approval by default. A call goes to the server the document names
(or the source's `base_url`) with httpx, bounded in time, redirects and response size; an
HTTP error reaches the code as a `RuntimeError` naming the status with an excerpt of the body.

A `$ref` may point anywhere in the document (`machine.tools.openapi_refs`); each tool's schema
carries what it refers to, so its pointers resolve where they are written
(`machine.tools.openapi_operations` builds each tool's arguments).

An operation that cannot be served (a schema that is not valid JSON Schema, a `pattern` no
ECMA-262 engine compiles, a `$ref` to nothing, a method no tool may have) is left out, and
the rest served: each one left out is named, with why, in `OpenApiSource.left_out` and logged
once as the source is built. A document none of whose operations can be served, or that is
not OpenAPI 3.0 or 3.1, is refused whole, in words.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote, urljoin

from pydantic import JsonValue, ValidationError

from lockgate.machine.policy import PolicyDecision
from lockgate.machine.tools.errors import InvalidToolSource
from lockgate.machine.tools.form_bodies import (
    FORM,
    MULTIPART,
    BodyEncoding,
    form_fields,
    multipart_parts,
)
from lockgate.machine.tools.http_calls import Auth, HttpLimits, send
from lockgate.machine.tools.openapi_catalogue import Catalogue, CataloguedOperation
from lockgate.machine.tools.openapi_operations import (
    LeftOut,
    OperationShapes,
    Parameter,
    to_json_schema,
)
from lockgate.machine.tools.spec import TaskSupport, ToolContext, ToolSpec, identifier

METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
READS = frozenset({"get", "head", "options"})
__all__ = ["OpenApiOperation", "OpenApiSource", "to_json_schema"]
log = logging.getLogger("lockgate.sources")


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
    _left_out: tuple[LeftOut, ...] = ()

    @property
    def left_out(self) -> tuple[str, ...]:
        """The document's operations it cannot serve, each named (method, path, tool) with
        why, in words."""
        return tuple(each.shown(self.name) for each in self._left_out)

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
        #: The document's first server URL, as written.
        self.server_url = self._first_server(document)
        self._serve_at(base_url, document_url, limits)
        components = document.get("components", {})
        if not isinstance(components, Mapping):
            raise InvalidToolSource(
                f"source {name!r}: its document's 'components' is not an object"
            )
        self._shapes = OperationShapes(document, legacy=version.startswith("3.0."))
        self._left_out: tuple[LeftOut, ...] = ()
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
            left_out=self._left_out,
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
        source._left_out = catalogue.left_out
        secrets = (auth.secret,) if auth is not None else ()
        source._tools = [
            OpenApiOperation(
                source,
                ToolSpec.model_construct(
                    **{
                        **op.spec,
                        # Enums come back from JSON as their values (an older catalogue has
                        # no task support: the default then).
                        "default_policy": PolicyDecision(str(op.spec["default_policy"])),
                        "task_support": TaskSupport(str(op.spec.get("task_support", "optional"))),
                    },
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

    def _operations(self, document: Mapping[str, Any]) -> list[OpenApiOperation]:
        made: list[OpenApiOperation] = []
        left_out: list[LeftOut] = []
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
                if not isinstance(operation, Mapping):
                    continue
                name = identifier(str(operation.get("operationId") or f"{method}_{path}"))
                while name in taken:
                    name = f"{name}_"
                try:
                    made.append(self._operation(str(path), method, operation, shared, name))
                except _UNSERVABLE as exc:
                    left_out.append(LeftOut(method, str(path), name, _in_words(exc)))
                    log.warning("source %r: %s", self.name, left_out[-1].shown(self.name))
                    continue
                taken.add(name)
        if left_out and not made:
            raise InvalidToolSource(
                f"source {self.name!r}: none of its {len(left_out)} operations can be served; "
                f"the first: {left_out[0].shown(self.name)}",
                hint="Fix the operations in the document, or remove them.",
            )
        self._left_out = tuple(left_out)
        return made

    def _operation(
        self,
        path: str,
        method: str,
        operation: Mapping[str, Any],
        shared: Sequence[Any],
        name: str,
    ) -> OpenApiOperation:
        shape = self._shapes.shape(operation, shared)
        summary = str(operation.get("summary") or operation.get("description") or "").strip()
        tags = operation.get("tags")
        words = [str(operation.get("description") or ""), *(tags if isinstance(tags, list) else [])]
        read = method in READS
        spec = ToolSpec(
            source=self.name,
            name=name,
            description=f"{summary.splitlines()[0] if summary else name} ({method.upper()} {path})",
            parameters=shape.parameters_schema,
            returns="Any",
            idempotent=read,
            default_policy=PolicyDecision.APPROVE if read else PolicyDecision.REQUIRE_APPROVAL,
            secrets=(self.auth.secret,) if self.auth is not None else (),
            operation=method.upper(),
            about=" ".join(map(str, words))[:ABOUT_CHARS],
        )
        return OpenApiOperation(
            self, spec, method, path, shape.parameters, shape.body, shape.encoding
        )


#: What keeps one operation from being served, and leaves only it out: a schema or a
#: `$ref` that cannot be used (ValueError, pydantic's ValidationError among them), or a
#: shape of the document no check foresaw.
_UNSERVABLE = (ValueError, TypeError, KeyError, IndexError, AttributeError, RecursionError)


def _in_words(exc: BaseException) -> str:
    if isinstance(exc, ValidationError):  # the ToolSpec refused the operation's schema
        text = str(exc.errors()[0]["msg"]).removeprefix("Value error, ")
    elif type(exc) is ValueError or exc.__class__.__module__.startswith("lockgate."):
        text = str(exc)  # already in words
    else:
        text = f"{type(exc).__name__}: {exc}"
    first = text.splitlines()[0] if text else type(exc).__name__
    return first if len(first) <= 400 else f"{first[:400]}…"
