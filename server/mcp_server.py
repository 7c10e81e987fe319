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
)
from lockgate.server.input_required import InputRequiredDoor, dismissed
from lockgate.server.native_approval import NativeDoor
from lockgate.server.operations import log_execution_id, log_session_id
from lockgate.server.owed_response import stream_ready
from lockgate.server.runner import ExecutionRunner
from lockgate.server.surface_tools import (
    Answer,
    ArgumentsRefused,
    Call,
    Listing,
    SurfaceTools,
    modelled,
)
from lockgate.server.tasks import Tasks, answers_with_task
from lockgate.server.tool_arguments import (
    DescribeArguments,
    ExecuteArguments,
    PersonApprovesResume,
    ResumeArguments,
    execute_arguments,
)
from lockgate.server.tool_arguments import (
    problems as argument_problems,
)
from lockgate.server.tool_listing import (
    DESCRIBE_HELP,
    RESUME_HELP,
    SOURCE_TOOLS,
    described,
    execute_description,
    source_tool,
    source_tool_code,
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
        #: The surface's own tools: each an argument model, a description and a handler.
        self.surface = SurfaceTools(
            [
                modelled(
                    "execute",
                    execute_arguments(max_code_chars),
                    lambda listed: execute_description(
                        listed.registry, listed.policy, listed.mode is ApprovalMode.MODEL
                    ),
                    self._execute,
                    # A 2025-11-25 client may ask for a task (the 2026 extension needs no hint).
                    task_support=TaskSupport.OPTIONAL,
                ),
                modelled(
                    "resume",
                    ResumeArguments,
                    lambda listed: RESUME_HELP[listed.mode is ApprovalMode.MODEL],
                    self._resume,
                    # A listing never offers what its caller cannot do.
                    listed_as=lambda mode: (
                        ResumeArguments if mode is ApprovalMode.MODEL else PersonApprovesResume
                    ),
                ),
                modelled(
                    "describe_tools", DescribeArguments, lambda _: DESCRIBE_HELP, self._describe
                ),
                *(source_tool(spec, self._source_call) for spec in SOURCE_TOOLS.values()),
            ]
        )
        #: The tools of sources exposed directly (`expose = "direct"`), by their own names.
        self.direct = DirectTools(book.base, runner.runtime.direct, tuple(self.surface))
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
        listing = Listing(
            await to_thread.run_sync(self.book.registry_for, principal),
            # Each principal's listing shows the decisions its own calls meet.
            await to_thread.run_sync(self.policy.for_principal, principal),
            mode,
        )
        return types.ListToolsResult(tools=self.surface.listed(listing) + self.direct.listed())

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
    ) -> Answer:
        """Look up, check, handle, answer: every failure is answered here, in one mapping."""
        call: Call | None = None
        try:
            call = await self._call(ctx, params)
            return await self._route(call)
        except MCPError:
            raise  # a protocol error the request itself caused, answered as one
        except ValidationError as exc:
            return shapes.invalid(argument_problems(exc))
        except ArgumentsRefused as exc:
            return shapes.invalid(exc.message)
        except IdempotencyKeyReused as exc:
            return shapes.error(exc, exc.execution_id)
        except LockgateError as exc:
            return shapes.error(exc, call.execution_id if call is not None else None)
        except Exception:
            log.exception("tool %s failed", params.name)
            return shapes.internal_error()

    async def _call(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> Call:
        ready = stream_ready.get()
        if ready is not None:
            # Before any durable work: the client must be able to resume this stream (and
            # collect a -32010) if the process dies from here on.
            with anyio.move_on_after(2):
                await ready.wait()
        session_id = ctx.request.headers.get("mcp-session-id") if ctx.request else None
        log_session_id.set(session_id)
        principal = current_principal.get()
        mode = self.modes.for_connection(principal, _asked_mode(ctx))
        return Call(ctx, params, principal, session_id, mode)

    async def _route(self, call: Call) -> Answer:
        name, retried = call.params.name, call.params.request_state is not None
        if name in self.direct:
            if retried:  # the client's retry with its person's answers: the call goes on
                return await self.direct_calls.retry(
                    call.ctx, call.principal, call.params, call.mode
                )
            return await self.direct_calls.call(
                call.ctx, call.principal, call.params, call.session_id, call.mode
            )
        tool = self.surface.get(name)
        if tool is None:
            offered = ", ".join([*self.surface, *self.direct.specs])
            return shapes.invalid(f"Unknown tool {name!r}: this server offers {offered}.")
        if retried and name != "describe_tools":
            # The client's retry with its person's answer: nothing runs again.
            outcome = await self.input_required.answer(
                call.ctx, call.principal, call.params, call.mode
            )
            return await self._finish(
                call.ctx, call.principal, outcome, call.mode, ask=not dismissed(call.params)
            )
        return await tool.run(call)

    async def _execute(self, call: Call, args: ExecuteArguments) -> Answer:
        ctx, params = call.ctx, call.params
        as_task = answers_with_task(ctx) or asks_for_task(ctx, params)
        async with relayed(ctx, params, self._level(call.session_id)) as listener:
            outcome = await self.runner.execute(
                call.principal,
                args.code,
                call.session_id,
                call.origin,
                args.idempotency_key,
                budget=0 if as_task else None,
                listener=listener,
            )
        if as_task:  # stored already: the client polls it with tasks/get
            made = self.legacy_tasks if legacy(ctx) else self.tasks
            return await to_thread.run_sync(made.created, outcome, call.mode)
        return await self._finish(ctx, call.principal, outcome, call.mode)

    async def _resume(self, call: Call, args: ResumeArguments) -> Answer:
        call.execution_id = args.execution_id
        log_execution_id.set(args.execution_id)
        agent = Agent(call.principal, Door.RESUME, call.mode, client_of(call.ctx))
        if args.answers is not None:
            if args.action is not None:
                return shapes.invalid(
                    "Send either answers (to what a tool asked) or an action (a decision on "
                    "a call), not both."
                )
            outcome = await self.decisions.answer(
                agent, Answers(args.execution_id, args.answered())
            )
        elif args.action is None:
            outcome = await self.runner.wait(call.principal, args.execution_id)
        else:
            decision = Decision(args.execution_id, Action(args.action), content=args.content)
            outcome = await self.decisions.decide(agent, decision)
        return await self._finish(call.ctx, call.principal, outcome, call.mode)

    async def _describe(self, call: Call, args: DescribeArguments) -> Answer:
        policy = await to_thread.run_sync(self.policy.for_principal, call.principal)
        registry = await to_thread.run_sync(self.book.registry_for, call.principal)
        text, structured = described(registry, policy, args.query)
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=text)], structured_content=structured
        )

    async def _source_call(self, call: Call, arguments: dict[str, Any]) -> Answer:
        """A source tool's call, run as an execution of the same call from agent code."""
        code = source_tool_code(call.params.name, arguments)
        outcome = await self.runner.execute(
            call.principal, code, call.session_id, call.origin, None
        )
        return await self._finish(call.ctx, call.principal, outcome, call.mode)
