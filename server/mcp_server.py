"""The MCP surface: `execute`, `resume` and `describe_tools`, on the official SDK's server,
and the source tools (`add_openapi_source`...), each of which runs as an execution of
`tools.lockgate.<tool>(...)`: gated like any call, resumable the same way.

Arguments are validated here (the low-level server passes them through unchecked), every
engine error becomes a tool error with a stable status, and nothing unexpected leaks: an
unknown failure answers a generic internal error and is logged.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

import anyio
import mcp_types as types
from anyio import to_thread
from mcp.server import Server, ServerRequestContext
from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError

from lockgate.machine.approval_modes import (
    QUERY_PARAMETER,
    ApprovalMode,
    ApprovalModes,
    InvalidApprovalMode,
    accept_refused,
)
from lockgate.machine.engine import Action
from lockgate.machine.errors import LockgateError
from lockgate.machine.execution_errors import IdempotencyKeyReused
from lockgate.machine.lost_report import request_key
from lockgate.machine.policy import DECISION_WORDS, Policy, PolicyDecision
from lockgate.machine.source_book import SourceBook
from lockgate.machine.tools.admin_source import ADD_GRAPHQL, ADD_MCP, ADD_OPENAPI, LIST, REMOVE
from lockgate.machine.tools.registry import ToolRegistry, ToolSpec
from lockgate.machine.views import ExecutionView
from lockgate.server import shapes
from lockgate.server.auth import current_principal
from lockgate.server.deciders import by_resume
from lockgate.server.native_approval import NativeDoor
from lockgate.server.operations import log_execution_id, log_session_id
from lockgate.server.owed_response import stream_ready
from lockgate.server.runner import ExecutionRunner

log = logging.getLogger("lockgate.mcp")


#: What `execute`'s schema tells a client about the key.
IDEMPOTENCY_KEY_HELP = (
    "Optional. A fresh value (a UUID) per program you mean to run once. If the answer to "
    "this call is lost (a restart, a broken connection), send the same call with the same "
    "key: it is attached to the execution the first one started (its result, or its "
    "current state) instead of starting a second. A key already used with other code is "
    "refused with idempotency_key_reused."
)


class ExecuteArguments(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    code: str = Field(min_length=1)
    idempotency_key: str | None = Field(
        default=None, alias="idempotencyKey", min_length=1, max_length=128
    )


class ResumeArguments(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    execution_id: str = Field(alias="executionId", min_length=1, max_length=64)
    action: Literal["accept", "decline", "cancel"] | None = None
    content: JsonValue = None


class DescribeArguments(BaseModel):
    model_config = ConfigDict(extra="forbid")
    query: str = Field(default="", max_length=200)


def _problems(exc: ValidationError) -> str:
    """A validation failure in words, without echoing the values (they may be large)."""
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "arguments"
        parts.append(f"{where}: {err['msg']}")
    return "Invalid arguments: " + "; ".join(parts)


def listed_signature(spec: ToolSpec, decision: PolicyDecision) -> str:
    """`tools.notes.write(key: str, text: str) -> dict  # auto-approved`: the signature with
    what this server's policy does with a call.

    The registry leaves a call that runs at once unannotated; a listing says so in words, so
    an agent never has to infer the policy from a missing note.
    """
    bare, _, notes = spec.signature(decision).partition("  # ")
    words = DECISION_WORDS[decision]
    if decision is PolicyDecision.APPROVE:
        notes = f"{words}; {notes}" if notes else words
    return f"{bare}  # {notes}"


def listing(
    registry: ToolRegistry, policy: Policy, query: str = ""
) -> list[tuple[ToolSpec, PolicyDecision]]:
    """The tools matching `query`, each with the decision the engine will make for its calls
    under the server's configured policy (never the tool's default alone)."""
    return [(spec, policy.decide(spec)) for spec in registry.describe(query)]


#: Up to this many tools, the execute tool's description lists each signature; past it (a
#: large API: hundreds of operations), each source with its count and how to search.
LISTED_TOOLS = 40
#: The most tools one `describe_tools` answer lists; a query narrows a larger match.
DESCRIBED_TOOLS = 50


def execute_description(registry: ToolRegistry, policy: Policy, model_accepts: bool = True) -> str:
    then = (
        "call `resume` with the executionId (and action accept/decline/cancel when the user "
        "decided in chat)."
        if model_accepts
        else "a person approves at the approvalUrl (you cannot accept); then call `resume` "
        "with only the executionId for the result."
    )
    lines = [
        "Run Python code in a sandbox. The code calls tools as tools.<source>.<tool>(...) with "
        "keyword arguments; the value of the last expression is the result and print() "
        "output is returned as logs. Some calls need a person's approval: the answer is then "
        f"`waiting_for_interaction` with an executionId and an approvalUrl; {then} "
        "A declined or blocked call raises PermissionError inside the code.",
    ]
    namespace = registry.namespace()
    count = sum(len(names) for names in namespace.values())
    if count <= LISTED_TOOLS:
        lines[0] += " Available tools, with what this server's policy does with their calls:"
        found = listing(registry, policy)  # the policy's decision for each, only when listed
        lines += [f"- {listed_signature(spec, decision)}" for spec, decision in found]
        return "\n".join(lines)
    lines[0] += (
        f" There are {count} tools, too many to list here: call `describe_tools` with a "
        "query (words of a tool's name or description, e.g. 'create invoice') for their "
        "signatures and what this server's policy does with their calls. The sources:"
    )
    lines += [f"- tools.{source}: {len(names)} tools" for source, names in namespace.items()]
    return "\n".join(lines)


#: The source tools, offered as MCP tools too: a client without code adds its sources.
SOURCE_TOOLS = {spec.name: spec for spec in (ADD_OPENAPI, ADD_GRAPHQL, ADD_MCP, LIST, REMOVE)}


def source_tool_code(name: str, arguments: dict[str, Any]) -> str:
    """The code an MCP call of a source tool runs: the same call, from agent code. The
    arguments are JSON values, whose `repr` is a Python literal of the same value."""
    return f"tools.lockgate.{name}(**{arguments!r})"


def _source_tools() -> list[types.Tool]:
    return [
        types.Tool(
            name=name,
            description=f"{spec.description} Runs as an execution of "
            f"tools.lockgate.{name}(...): a call that needs approval answers like `execute` "
            "(waiting_for_interaction, then `resume`).",
            input_schema=spec.parameters,
        )
        for name, spec in SOURCE_TOOLS.items()
    ]


#: What `resume` says it does, by who may accept.
RESUME_HELP = {
    True: "Continue a paused execution with a decision (accept, decline or cancel), or, "
    "without an action, wait for the result of a running or browser-approved execution. "
    "Works from any session, after restarts and on any instance.",
    False: "A person approves calls on this server (at the approvalUrl, or in your client's "
    "prompt); you cannot accept them. Without an action: wait for the result once they "
    "approved (or see the call still waiting, with its approvalUrl). With decline or cancel: "
    "give the call up yourself. Works from any session, after restarts and on any instance.",
}


def tool_list(
    registry: ToolRegistry,
    policy: Policy,
    max_code_chars: int,
    mode: ApprovalMode = ApprovalMode.MODEL,
) -> list[types.Tool]:
    model_accepts = mode is ApprovalMode.MODEL
    actions = ["accept", "decline", "cancel"] if model_accepts else ["decline", "cancel"]
    return [
        types.Tool(
            name="execute",
            description=execute_description(registry, policy, model_accepts),
            input_schema={
                "type": "object",
                "properties": {
                    "code": {"type": "string", "minLength": 1, "maxLength": max_code_chars},
                    "idempotencyKey": {
                        "type": "string",
                        "minLength": 1,
                        "maxLength": 128,
                        "description": IDEMPOTENCY_KEY_HELP,
                    },
                },
                "required": ["code"],
                "additionalProperties": False,
            },
        ),
        types.Tool(
            name="resume",
            description=RESUME_HELP[model_accepts],
            input_schema={
                "type": "object",
                "properties": {
                    "executionId": {"type": "string"},
                    "action": {"type": "string", "enum": actions},
                    "content": {"description": "Optional data sent with the decision."},
                },
                "required": ["executionId"],
                "additionalProperties": False,
            },
        ),
        types.Tool(
            name="describe_tools",
            description="Details of the tools the code can call: arguments, and what this "
            "server's policy does with a call (auto-approved, requires approval, or blocked); "
            "`query` filters by words in their names and descriptions.",
            input_schema={
                "type": "object",
                "properties": {"query": {"type": "string"}},
                "additionalProperties": False,
            },
        ),
        *_source_tools(),
    ]


def source_tool_problems(spec: ToolSpec, arguments: dict[str, Any]) -> str | None:
    """The arguments' problems against the tool's schema, in words, before an execution is
    started for them (the code would fail on them the same way)."""
    from lockgate.machine.tools.arguments import check_arguments
    from lockgate.machine.tools.errors import InvalidArguments

    try:
        check_arguments(spec, dict(arguments), [])
    except InvalidArguments as exc:
        return exc.message
    return None


def _asked_mode(ctx: ServerRequestContext[Any]) -> str | None:
    """The approval mode the connection asked for on the MCP URL, if any."""
    return ctx.request.query_params.get(QUERY_PARAMETER) if ctx.request is not None else None


class LockgateMCP:
    def __init__(
        self,
        runner: ExecutionRunner,
        book: SourceBook,
        approval_url: Any,
        max_code_chars: int,
    ) -> None:
        #: Each principal's tools, for its listings.
        self.runner, self.book = runner, book
        #: The engine's own policy, so a listing shows the decision a call will meet.
        self.policy = runner.runtime.engine.policy
        #: (ExecutionView) -> approval URL for its pending call.
        self.approval_url = approval_url
        self.max_code_chars = max_code_chars
        settings = runner.runtime.settings
        #: Who may accept a gated call, per principal and connection.
        self.modes = ApprovalModes.from_text(settings.approval_mode, settings.approval_modes)
        #: In `native` mode: the client's own prompt to its person (2025 sessions).
        self.native = NativeDoor(runner)
        self.server: Server[Any] = Server(
            "lockgate",
            version="0.1.0",
            on_list_tools=self.list_tools,
            on_call_tool=self.call_tool,
        )

    async def list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        principal = current_principal.get()
        try:
            mode = self.modes.for_connection(principal, _asked_mode(ctx))
        except InvalidApprovalMode:  # told in words on its first tool call
            mode = self.modes.for_principal(principal)
        return types.ListToolsResult(
            tools=tool_list(
                await to_thread.run_sync(self.book.registry_for, principal),
                # Each principal's listing shows the decisions its own calls meet.
                await to_thread.run_sync(self.policy.for_principal, principal),
                self.max_code_chars,
                mode,
            )
        )

    async def _shape(
        self, outcome: ExecutionView | shapes.Running, mode: ApprovalMode
    ) -> types.CallToolResult:
        if isinstance(outcome, shapes.Running):
            return shapes.running(outcome.execution_id)
        # Only a paused execution's answer carries a link (minting one reads and writes the
        # database, so it runs in a worker thread); every other answer has none to ask for.
        url = (
            await to_thread.run_sync(self.approval_url, outcome)
            if outcome.pending is not None
            else None
        )
        return shapes.execution(outcome, url, model_accepts=mode is ApprovalMode.MODEL)

    async def _refuse_accept(self, principal: str, execution_id: str, mode: ApprovalMode) -> None:
        """Raise the refusal of the model's own accept, with the page to send the person
        to; an execution with no call waiting gets resume's own answer instead."""
        view = await to_thread.run_sync(self.runner.runtime.engine.get, execution_id, principal)
        if view.pending is not None:
            url = await to_thread.run_sync(self.approval_url, view)
            raise accept_refused(mode, url)

    async def call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        principal = current_principal.get()
        ready = stream_ready.get()
        if ready is not None:
            # Before any durable work: the client must be able to resume this stream (and
            # collect a -32010) if the process dies from here on.
            with anyio.move_on_after(2):
                await ready.wait()
        arguments = params.arguments or {}
        session_id = ctx.request.headers.get("mcp-session-id") if ctx.request else None
        log_session_id.set(session_id)
        execution_id: str | None = None
        try:
            mode = self.modes.for_connection(principal, _asked_mode(ctx))
            if params.name == "execute":
                args = ExecuteArguments.model_validate(arguments)
                if len(args.code) > self.max_code_chars:
                    return shapes.invalid(
                        f"The code is {len(args.code)} characters long; the limit is "
                        f"{self.max_code_chars}."
                    )
                origin = (
                    request_key(session_id, ctx.request_id)
                    if session_id and ctx.request_id is not None
                    else None
                )
                outcome = await self.runner.execute(
                    principal, args.code, session_id, origin, args.idempotency_key
                )
                if mode is ApprovalMode.NATIVE:
                    outcome = await self.native.settle(ctx, principal, outcome)
                return await self._shape(outcome, mode)
            if params.name == "resume":
                resume = ResumeArguments.model_validate(arguments)
                execution_id = resume.execution_id
                log_execution_id.set(execution_id)
                if resume.action is None:
                    outcome = await self.runner.wait(principal, resume.execution_id)
                    if mode is ApprovalMode.NATIVE:
                        outcome = await self.native.settle(ctx, principal, outcome)
                else:
                    if resume.action == "accept" and mode is not ApprovalMode.MODEL:
                        await self._refuse_accept(principal, resume.execution_id, mode)
                    outcome = await self.runner.resume(
                        principal,
                        resume.execution_id,
                        Action(resume.action),
                        resume.content,
                        decided_by=by_resume(ctx, principal),
                    )
                return await self._shape(outcome, mode)
            if params.name == "describe_tools":
                query = DescribeArguments.model_validate(arguments).query
                policy = await to_thread.run_sync(self.policy.for_principal, principal)
                registry = await to_thread.run_sync(self.book.registry_for, principal)
                matched = listing(registry, policy, query)
                found, more = matched[:DESCRIBED_TOOLS], len(matched) - DESCRIBED_TOOLS
                text = "\n".join(listed_signature(s, d) for s, d in found) or "No tool matches."
                if more > 0:
                    text += (
                        f"\n… and {more} more tools match: add words to the query to narrow "
                        "it (they match a tool's name or description)."
                    )
                return types.CallToolResult(
                    content=[types.TextContent(type="text", text=text)],
                    structured_content={
                        "more": max(more, 0),
                        "tools": [
                            {
                                "name": s.call_name,
                                "signature": listed_signature(s, decision),
                                "description": s.description,
                                "parameters": s.parameters,
                                "idempotent": s.idempotent,
                                "policy": decision.value,
                                "default_policy": s.default_policy.value,
                            }
                            for s, decision in found
                        ],
                    },
                )
            if params.name in SOURCE_TOOLS:
                problems = source_tool_problems(SOURCE_TOOLS[params.name], arguments)
                if problems:
                    return shapes.invalid(problems)
                outcome = await self.runner.execute(
                    principal,
                    source_tool_code(params.name, dict(arguments)),
                    session_id,
                    request_key(session_id, ctx.request_id)
                    if session_id and ctx.request_id is not None
                    else None,
                    None,
                )
                if mode is ApprovalMode.NATIVE:
                    outcome = await self.native.settle(ctx, principal, outcome)
                return await self._shape(outcome, mode)
            return shapes.invalid(
                f"Unknown tool {params.name!r}: this server offers execute, resume, "
                f"describe_tools and {', '.join(SOURCE_TOOLS)}."
            )
        except ValidationError as exc:
            return shapes.invalid(_problems(exc))
        except IdempotencyKeyReused as exc:
            return shapes.error(exc, exc.execution_id)
        except LockgateError as exc:
            return shapes.error(exc, execution_id)
        except Exception:
            log.exception("tool %s failed", params.name)
            return shapes.internal_error()
