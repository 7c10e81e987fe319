"""The MCP surface: `execute`, `resume` and `describe_tools`, on the official SDK's server,
and the source tools (`add_openapi_source`...), each of which runs as an execution of
`tools.lockgate.<tool>(...)`: gated like any call, resumable the same way.

Arguments are validated here (the low-level server passes them through unchecked), every
engine error becomes a tool error with a stable status, and nothing unexpected leaks: an
unknown failure answers a generic internal error and is logged.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import anyio
import mcp_types as types
from anyio import to_thread
from mcp.server import Server, ServerRequestContext
from mcp.server.context import CallNext, HandlerResult
from mcp.server.request_state import RequestStateBoundary, RequestStateSecurity
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from lockgate.machine.approval_audit import Door
from lockgate.machine.approval_modes import (
    QUERY_PARAMETER,
    ApprovalMode,
    ApprovalModes,
    InvalidApprovalMode,
)
from lockgate.machine.engine import Action
from lockgate.machine.errors import LockgateError
from lockgate.machine.execution_errors import IdempotencyKeyReused
from lockgate.machine.lost_report import request_key
from lockgate.machine.sessions import SessionBusy
from lockgate.machine.source_book import SourceBook
from lockgate.machine.tools.spec import TaskSupport
from lockgate.machine.views import ExecutionView
from lockgate.server import shapes
from lockgate.server.auth import current_principal
from lockgate.server.call_relay import relayed
from lockgate.server.deciders import client_of
from lockgate.server.decisions import Agent, Answers, Decision
from lockgate.server.direct_calls import DirectCalls
from lockgate.server.direct_tools import DirectTools
from lockgate.server.direct_tools import answer as direct_answer
from lockgate.server.experimental_tasks import (
    ExperimentalTasks,
    TasksServer,
    asks_for_task,
    legacy,
    task_refused,
)
from lockgate.server.input_required import InputRequiredDoor, dismissed
from lockgate.server.native_approval import NativeDoor
from lockgate.server.operations import log_execution_id, log_session_id
from lockgate.server.owed_response import stream_ready
from lockgate.server.runner import ExecutionRunner
from lockgate.server.tasks import Tasks, answers_with_task
from lockgate.server.tool_arguments import (
    DescribeArguments,
    ExecuteArguments,
    ResumeArguments,
)
from lockgate.server.tool_arguments import (
    problems as argument_problems,
)
from lockgate.server.tool_listing import (
    SOURCE_TOOLS,
    described,
    source_tool_code,
    source_tool_problems,
    tool_list,
)

if TYPE_CHECKING:
    from lockgate.server.approval_page import ApprovalSurface

log = logging.getLogger("lockgate.mcp")


def _asked_mode(ctx: ServerRequestContext[Any]) -> str | None:
    """The approval mode the connection asked for on the MCP URL, if any."""
    return ctx.request.query_params.get(QUERY_PARAMETER) if ctx.request is not None else None


def _asking(outcome: ExecutionView | shapes.Running) -> bool:
    """Whether `outcome` waits for answers to what its call's tool asked its user."""
    return (
        isinstance(outcome, ExecutionView)
        and outcome.pending is not None
        and outcome.pending.questions is not None
    )


class LockgateMCP:
    def __init__(
        self,
        runner: ExecutionRunner,
        book: SourceBook,
        approvals: ApprovalSurface,
        max_code_chars: int,
        request_state_keys: Sequence[bytes],
    ) -> None:
        #: Each principal's tools, for its listings.
        self.runner, self.book = runner, book
        #: The engine's own policy, so a listing shows the decision a call will meet.
        self.policy = runner.runtime.engine.policy
        #: (ExecutionView) -> approval URL for its pending call.
        self.approval_url = approvals.approval_url
        #: The one decision entry, for every door here.
        self.decisions = approvals.decisions
        self.max_code_chars = max_code_chars
        #: The tools of sources exposed directly (`expose = "direct"`), by their own names.
        self.direct = DirectTools(
            book.base, runner.runtime.direct, ("execute", "resume", "describe_tools", *SOURCE_TOOLS)
        )
        settings = runner.runtime.settings
        #: Who may accept a gated call, per principal and connection.
        self.modes = ApprovalModes.from_text(settings.approval_mode, settings.approval_modes)
        #: In `native` mode: the client's own prompt to its person (2025 sessions).
        self.native = NativeDoor(runner, self.decisions)
        #: In `native` mode on 2026-07-28: the person's answer comes with the client's retry.
        self.input_required = InputRequiredDoor(self.decisions, self.approval_url)
        self.server: Server[Any] = TasksServer(
            "lockgate", version="0.1.0", on_list_tools=self.list_tools
        )
        # Registered by method rather than `on_call_tool`: an answer may be a task, a
        # result shape of the tasks extension the SDK's typed callback does not name.
        self.server.add_request_handler("tools/call", types.CallToolRequestParams, self.call_tool)
        # Declares `logging` (a 2025 session's requests open with warnings, the
        # `session_notices`), and keeps each session's level for every instance. Registered
        # by method: the SDK's `on_set_logging_level` warns that 2026-07-28 drops it, which
        # 2025 sessions still speak.
        self.server.add_request_handler(
            "logging/setLevel", types.SetLevelRequestParams, self.set_log_level
        )
        #: The tasks extension: `execute` as a durable task, polled with tasks/get.
        #: 2025-11-25's tasks, on 2025 sessions (tools/call with `task`, tasks/result...).
        self.legacy_tasks = ExperimentalTasks(
            runner, self.modes, self.approval_url, self.native, self.decisions
        )
        self.legacy_tasks.install(self.server)
        self.tasks = Tasks(runner, self.modes, self.approval_url, self.decisions, self.legacy_tasks)
        self.tasks.install(self.server)
        #: A direct tool's calls (`expose = "direct"`): as the tool, or as a task.
        self.direct_calls = DirectCalls(
            runner,
            self.direct,
            (self.tasks, self.legacy_tasks),
            self.input_required,
            self._finish,
            self._level,
        )
        # A 2025 session's call that asks for a task answers 2025-11-25's CreateTaskResult,
        # which the SDK's result check for 2025 (a CallToolResult) would refuse.
        self.server.middleware.append(self._calls_as_2025_tasks)
        # Seals the retry's `requestState` under keys every instance shares, bound to the
        # request and the principal, for as long as an approval can wait.
        self.server.middleware.append(
            RequestStateBoundary(
                RequestStateSecurity(
                    keys=list(request_state_keys),
                    ttl=settings.approval_ttl.total_seconds(),
                    bind_principal=lambda ctx: current_principal.get(None),
                ),
                default_audience="lockgate",
            )
        )

    async def _calls_as_2025_tasks(
        self, ctx: ServerRequestContext[Any], call_next: CallNext
    ) -> HandlerResult:
        """Answers a 2025 session's `tools/call` that asks for a task here, not through the
        SDK's handler chain, whose 2025 result check knows no CreateTaskResult (the SDK
        trusts a middleware's own answer); any other request goes on as it came."""
        raw = ctx.params
        if ctx.method != "tools/call" or not legacy(ctx) or not isinstance(raw, Mapping):
            return await call_next(ctx)
        if raw.get("task") is None:
            return await call_next(ctx)
        try:
            params = types.CallToolRequestParams.model_validate(raw, by_name=False)
        except ValidationError:
            return await call_next(ctx)  # refused by the SDK, in its words
        return await self.call_tool(ctx, params)

    async def set_log_level(
        self, ctx: ServerRequestContext[Any], params: types.SetLevelRequestParams
    ) -> types.EmptyResult:
        session_id = ctx.request.headers.get("mcp-session-id") if ctx.request else None
        if session_id is None:
            raise MCPError(
                code=types.INVALID_REQUEST,
                message="logging/setLevel sets a session's level; this request has no "
                "session (Mcp-Session-Id). On 2026-07-28, ask for a level in each request's "
                "_meta instead.",
            )
        sessions = self.runner.runtime.sessions
        try:
            await to_thread.run_sync(sessions.set_log_level, session_id, params.level)
        except SessionBusy:
            raise MCPError(
                code=types.INTERNAL_ERROR,
                message="The session was busy with other writes; send logging/setLevel again.",
            ) from None
        return types.EmptyResult()

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
            + self.direct.listed()
        )

    async def _shape(
        self, outcome: ExecutionView | shapes.Running, mode: ApprovalMode, direct: bool
    ) -> types.CallToolResult:
        if isinstance(outcome, shapes.Running):
            return shapes.running(outcome.execution_id)
        # Only an execution paused for approval names its call's page.
        approval = outcome.pending is not None and outcome.pending.questions is None
        url = self.approval_url(outcome) if approval else None
        shape = direct_answer if direct else shapes.execution
        return shape(outcome, url, model_accepts=mode is ApprovalMode.MODEL)

    async def _finish(
        self,
        ctx: ServerRequestContext[Any],
        principal: str,
        outcome: ExecutionView | shapes.Running,
        mode: ApprovalMode,
        *,
        ask: bool = True,
        direct: bool = False,
    ) -> types.CallToolResult | types.InputRequiredResult:
        """The answer about `outcome` (as a direct tool's answer when `direct`). What it
        waits on is first put to the client's person, where the client can be asked: a
        tool's questions always, a call's approval in `native` mode; within this request
        (2025), or as `input_required` (2026)."""
        if ask and (mode is ApprovalMode.NATIVE or _asking(outcome)):
            if self.native.can_ask(ctx):
                outcome = await self.native.settle(
                    ctx,
                    principal,
                    outcome,
                    self.approval_url,
                    approvals=mode is ApprovalMode.NATIVE,
                )
            elif (
                self.input_required.applies(ctx)
                and isinstance(outcome, ExecutionView)
                and outcome.pending is not None
            ):
                asked = await self.input_required.ask(outcome)
                if asked is not None:
                    return asked
        return await self._shape(outcome, mode, direct)

    def _level(self, session_id: str | None) -> Callable[[], Awaitable[str | None]]:
        """Reads the log level the session's client set (`logging/setLevel`), if any."""

        def read() -> str | None:
            row = self.runner.runtime.engine.store.sessions.get(session_id) if session_id else None
            return row.log_level if row is not None else None

        return lambda: to_thread.run_sync(read)

    async def call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult | dict[str, Any]:
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
            direct = params.name in self.direct
            if params.request_state is not None and direct:
                # The client's retry with its person's answers: the call goes on.
                return await self.direct_calls.retry(ctx, principal, params, mode)
            if params.request_state is not None and (
                params.name in ("execute", "resume") or params.name in SOURCE_TOOLS
            ):
                # The client's retry with its person's answer: nothing runs again.
                outcome = await self.input_required.answer(ctx, principal, params, mode)
                return await self._finish(ctx, principal, outcome, mode, ask=not dismissed(params))
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
                as_task = answers_with_task(ctx) or asks_for_task(ctx, params)
                async with relayed(ctx, params, self._level(session_id)) as listener:
                    outcome = await self.runner.execute(
                        principal,
                        args.code,
                        session_id,
                        origin,
                        args.idempotency_key,
                        budget=0 if as_task else None,
                        listener=listener,
                    )
                if as_task:  # stored already: the client polls it with tasks/get
                    made = self.legacy_tasks if legacy(ctx) else self.tasks
                    return await to_thread.run_sync(made.created, outcome, mode)
                return await self._finish(ctx, principal, outcome, mode)
            if asks_for_task(ctx, params) and params.name != "execute" and not direct:
                raise task_refused(params.name, TaskSupport.FORBIDDEN)
            if params.name == "resume":
                resume = ResumeArguments.model_validate(arguments)
                execution_id = resume.execution_id
                log_execution_id.set(execution_id)
                if resume.answers is not None:
                    if resume.action is not None:
                        return shapes.invalid(
                            "Send either answers (to what a tool asked) or an action (a "
                            "decision on a call), not both."
                        )
                    outcome = await self.decisions.answer(
                        Agent(principal, Door.RESUME, mode, client_of(ctx)),
                        Answers(resume.execution_id, resume.answers),
                    )
                    return await self._finish(ctx, principal, outcome, mode)
                if resume.action is None:
                    outcome = await self.runner.wait(principal, resume.execution_id)
                    return await self._finish(ctx, principal, outcome, mode)
                outcome = await self.decisions.decide(
                    Agent(principal, Door.RESUME, mode, client_of(ctx)),
                    Decision(resume.execution_id, Action(resume.action), content=resume.content),
                )
                return await self._finish(ctx, principal, outcome, mode)
            if params.name == "describe_tools":
                query = DescribeArguments.model_validate(arguments).query
                policy = await to_thread.run_sync(self.policy.for_principal, principal)
                registry = await to_thread.run_sync(self.book.registry_for, principal)
                text, structured = described(registry, policy, query)
                return types.CallToolResult(
                    content=[types.TextContent(type="text", text=text)],
                    structured_content=structured,
                )
            if direct:
                return await self.direct_calls.call(ctx, principal, params, session_id, mode)
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
                return await self._finish(ctx, principal, outcome, mode)
            offered = ["execute", "resume", "describe_tools", *SOURCE_TOOLS, *self.direct.specs]
            return shapes.invalid(
                f"Unknown tool {params.name!r}: this server offers {', '.join(offered)}."
            )
        except MCPError:
            raise  # a protocol error the request itself caused, answered as one
        except ValidationError as exc:
            return shapes.invalid(argument_problems(exc))
        except IdempotencyKeyReused as exc:
            return shapes.error(exc, exc.execution_id)
        except LockgateError as exc:
            return shapes.error(exc, execution_id)
        except Exception:
            log.exception("tool %s failed", params.name)
            return shapes.internal_error()
