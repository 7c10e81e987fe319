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
from lockgate.machine.tools.openapi_operations import (
    OperationShapes,
    Parameter,
    to_json_schema,
)
from lockgate.machine.tools.spec import ToolContext, ToolSpec, identifier

METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
READS = frozenset({"get", "head", "options"})
__all__ = ["OpenApiOperation", "OpenApiSource", "to_json_schema"]
log = logging.getLogger("lockgate.sources")


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
        found = base_url or self._server_url(document, document_url)
        if not found:
            raise InvalidToolSource(
                f"source {name!r}: the document names no server URL",
                hint="Set base_url for this source (for example http://127.0.0.1:8080).",
            )
        self.base_url: str = found
        self.limits = limits or HttpLimits()
        components = document.get("components", {})
        if not isinstance(components, Mapping):
            raise InvalidToolSource(
                f"source {name!r}: its document's 'components' is not an object"
            )
        self._shapes = OperationShapes(document, legacy=version.startswith("3.0."))
        #: Each operation left out, named (method, path, tool), with why: in words.
        self.left_out: tuple[str, ...] = ()
        self._tools = self._operations(document)

    def tools(self) -> Sequence[OpenApiOperation]:
        return self._tools

    @staticmethod
    def _server_url(document: Mapping[str, Any], document_url: str | None) -> str | None:
        servers = document.get("servers")
        first = servers[0] if isinstance(servers, list) and servers else None
        url = first.get("url") if isinstance(first, Mapping) else None
        if not isinstance(url, str):
            return None
        # A relative server URL is relative to where the document was read from.
        return urljoin(document_url, url) if document_url else url if "://" in url else None

    def _operations(self, document: Mapping[str, Any]) -> list[OpenApiOperation]:
        made: list[OpenApiOperation] = []
        left_out: list[str] = []
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
                    left_out.append(
                        f"{method.upper()} {path} (tool {self.name}.{name}) is left out: "
                        f"{_in_words(exc)}"
                    )
                    log.warning("source %r: %s", self.name, left_out[-1])
                    continue
                taken.add(name)
        if left_out and not made:
            raise InvalidToolSource(
                f"source {self.name!r}: none of its {len(left_out)} operations can be served; "
                f"the first: {left_out[0]}",
                hint="Fix the operations in the document, or remove them.",
            )
        self.left_out = tuple(left_out)
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
