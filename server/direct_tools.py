"""Direct tools: the tools of a source the operator exposed with `expose = "direct"`, listed
as MCP tools of their own beside `execute`, for clients that call tools rather than write
code (a gateway in front of an API or an MCP server that must be gated).

A call is a one-call execution, `tools.<source>.<tool>(**arguments)`, so it goes through the
same journal, policy, approvals, doors and recovery as code does: a call that needs a
person's approval pauses durably and answers like `execute` (waiting_for_interaction, the
approval page, `resume`, or the client's own prompt), and survives a restart.

What a finished call answers is the tool's own answer, in MCP's terms: text as text, the
typed parts agent code gets of an upstream MCP tool (`machine.tools.mcp_content`: image,
audio, resource, resource_link) as those MCP contents, any other value as its JSON (an
object also as structuredContent). A failed call answers `isError` with what went wrong.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

import mcp_types as types
from pydantic import JsonValue, ValidationError

from lockgate.machine.tool_invocation import UNEXPECTED
from lockgate.machine.tools.errors import InvalidToolSource
from lockgate.machine.tools.registry import ToolRegistry, ToolSpec
from lockgate.machine.views import ExecutionView
from lockgate.server import shapes
from lockgate.spec import ExecutionStatus as E


class DirectTools:
    """The directly exposed tools, by the name a client calls them with (the tool's own)."""

    def __init__(
        self, registry: ToolRegistry, direct: frozenset[str], reserved: Iterable[str]
    ) -> None:
        taken = set(reserved)
        self.specs: dict[str, ToolSpec] = {}
        for spec in registry.specs():
            if spec.source not in direct:
                continue
            clash = spec.name in taken or spec.name in self.specs
            if clash:
                other = self.specs.get(spec.name)
                owner = f"tools.{other.full_name}" if other else "a tool of Lockgate itself"
                raise InvalidToolSource(
                    f"source {spec.source!r} is exposed directly, but its tool "
                    f"{spec.name!r} has the name of {owner}",
                    hint='Expose only one of them directly (expose = "direct"); the other '
                    "stays callable from code.",
                )
            self.specs[spec.name] = spec

    def __contains__(self, name: str) -> bool:
        return name in self.specs

    def listed(self) -> list[types.Tool]:
        """Each tool as MCP lists it: its schema as published, its description."""
        return [
            types.Tool(
                name=name,
                description=spec.description,
                input_schema=spec.parameters,
                annotations=types.ToolAnnotations(idempotent_hint=spec.idempotent),
                execution=types.ToolExecution(task_support=spec.task_support.value),
            )
            for name, spec in self.specs.items()
        ]

    def code(self, name: str, arguments: Mapping[str, Any]) -> str:
        """The one call a direct call runs. The arguments are JSON values, whose `repr` is a
        Python literal of the same value."""
        return f"tools.{self.specs[name].full_name}(**{dict(arguments)!r})"


def answer(
    view: ExecutionView, approval_url: str | None, *, model_accepts: bool
) -> types.CallToolResult:
    """What a direct call answers: the tool's answer once it finished, its failure as an
    error, anything else (paused, running, interrupted) as `execute` says it."""
    if view.status == E.COMPLETED:
        return result_of(view.result)
    if view.status == E.FAILED:
        error = view.error if isinstance(view.error, dict) else {"message": str(view.error)}
        text = failure_text(str(error.get("message") or "The call failed."))
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=text)], is_error=True
        )
    return shapes.execution(view, approval_url, model_accepts=model_accepts)


#: How code sees a tool's failure (`machine.dispatcher`): the tool's words inside.
_TOOL_FAILED = re.compile(r"RuntimeError: tools\.[\w.]+ failed: (?P<words>.*)", re.DOTALL)
#: Where in the code it happened: a direct call is one line of code nobody wrote.
_LINE = " (line 1)"


def failure_text(message: str) -> str:
    """A failed direct call in the tool's own words: not as code sees it (a RuntimeError
    naming the call, at line 1 of code the client never wrote)."""
    message = message.removesuffix(_LINE)
    failed = _TOOL_FAILED.fullmatch(message)
    return failed["words"] if failed else message


def internal_error(view: ExecutionView) -> dict[str, JsonValue] | None:
    """The JSON-RPC error a direct call ended in, if it did: its tool failed unexpectedly
    (raised something other than an answer), a fault of the server's side. None for a call
    that answered, its answer an error or not."""
    if view.direct_tool is None or view.status != E.FAILED or not isinstance(view.error, dict):
        return None
    text = failure_text(str(view.error.get("message") or ""))
    if not text.startswith(UNEXPECTED):
        return None
    return {"code": types.INTERNAL_ERROR, "message": f"Internal error: {text}"}


def result_of(value: JsonValue) -> types.CallToolResult:
    """A tool's answer as MCP content."""
    if isinstance(value, str):
        return types.CallToolResult(content=[types.TextContent(type="text", text=value)])
    parts = _parts(value)
    if parts is not None:
        return types.CallToolResult(content=parts)
    text = json.dumps(value, ensure_ascii=False)
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)],
        structured_content=value if isinstance(value, dict) else None,
    )


#: The MCP content of each typed part, by its `type` (field names as MCP spells them).
_CONTENT: dict[str, Any] = {
    "text": types.TextContent,
    "image": types.ImageContent,
    "audio": types.AudioContent,
    "resource": types.EmbeddedResource,
    "resource_link": types.ResourceLink,
}


def _parts(value: JsonValue) -> list[types.ContentBlock] | None:
    """`value` as MCP contents when it is a non-empty list of typed parts, else None (the
    value is then answered as JSON)."""
    if not isinstance(value, list) or not value:
        return None
    blocks: list[types.ContentBlock] = []
    for part in value:
        if not isinstance(part, dict) or part.get("type") not in _CONTENT:
            return None
        fields: dict[str, Any] = {k: v for k, v in part.items() if v is not None}
        if "mime_type" in fields:
            fields["mimeType"] = fields.pop("mime_type")
        if part["type"] == "resource":
            held = {k: fields.pop(k) for k in ("uri", "mimeType", "text", "blob") if k in fields}
            fields["resource"] = held
        try:
            blocks.append(_CONTENT[str(part["type"])].model_validate(fields))
        except ValidationError:
            return None
    return blocks
