"""The tasks of MCP 2025-11-25 (its experimental `tasks` capability), for 2025 sessions, beside
the `io.modelcontextprotocol/tasks` extension of 2026-07-28 (`server/tasks.py`). The two are
not wire-compatible, so each request is answered in its own era's shapes; the task is its
execution either way (the task id is the execution id, stored before the answer, served by
any instance after any restart), and only its principal reaches it.

- `tools/call` with `task` for a tool that allows one (`execute`; a direct tool whose
  task_support is optional or required) answers `{task: Task}` at once. A task sent to a tool
  that forbids one, or a tool that requires one called without: -32601, as the spec says.
- `tasks/get` answers the Task; `tasks/list` the principal's tasks, newest first, a page at a
  time (`nextCursor`).
- `tasks/result` waits until the task ends and answers what the call would have answered,
  with the related task in its `_meta`. While the call waits for a person, the person is
  asked on that request (an elicitation naming the related task), as the spec's
  `input_required` flow has it; in approval mode `browser` only the page decides.
- `tasks/cancel` cancels a task waiting for approval and answers it `cancelled`; a task that
  ended, or whose code is running (it is not stopped), is refused with -32602 in words.
- Statuses are the extension's, but for one difference the 2025-11-25 text makes: a call
  whose answer is an error (`isError`) is `failed`.
"""

from __future__ import annotations

import contextlib
from datetime import timedelta
from typing import Any

import anyio
import mcp_types as types
from anyio import to_thread
from mcp.server import Server, ServerRequestContext
from mcp.shared.exceptions import MCPError
from pydantic import ConfigDict, Field

from lockgate.machine.approval_audit import Door
from lockgate.machine.approval_modes import ApprovalMode, ApprovalModes
from lockgate.machine.db.execution_queries import TaskLine
from lockgate.machine.engine import Action
from lockgate.machine.errors import LockgateError
from lockgate.machine.tools.spec import TaskSupport
from lockgate.machine.views import ExecutionView
from lockgate.server import shapes
from lockgate.server.auth import current_principal
from lockgate.server.deciders import client_of
from lockgate.server.decisions import ClientPrompt, Decision, Decisions
from lockgate.server.direct_tools import answer as direct_answer
from lockgate.server.direct_tools import internal_error
from lockgate.server.input_required import STATELESS
from lockgate.server.native_approval import RELATED_TASK, NativeDoor
from lockgate.server.runner import ExecutionRunner
from lockgate.spec import ExecutionStatus as E

#: What a 2025 session's server declares: tasks/list, tasks/cancel, task-augmented tools/call.
CAPABILITY = types.ServerTasksCapability.model_validate(
    {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}
)
#: How often a client is asked to poll a task, and the most tasks a listing's page holds.
POLL_MS = 1000
PAGE = 50


class TaskParams(types.RequestParams):
    model_config = ConfigDict(extra="allow", populate_by_name=True)
    task_id: str = Field(alias="taskId", min_length=1, max_length=64)


class TasksServer(Server[Any]):
    """The SDK's server, declaring the `tasks` capability on 2025 sessions (the SDK knows
    its shape but derives no capability for it; 2026-07-28 must not declare it: its tasks
    are the extension)."""

    def get_capabilities(self, *args: Any, **kwargs: Any) -> types.ServerCapabilities:
        capabilities = super().get_capabilities(*args, **kwargs)
        version = kwargs.get("protocol_version")
        if version is None or version < STATELESS:
            capabilities.tasks = CAPABILITY
        return capabilities


def legacy(ctx: ServerRequestContext[Any]) -> bool:
    """Whether this request speaks the 2025-11-25 tasks (a 2025 session's)."""
    return ctx.protocol_version < STATELESS


def asks_for_task(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> bool:
    """Whether a 2025 session's `tools/call` asks for a task (2026-07-28 ignores the field)."""
    return legacy(ctx) and params.task is not None


def task_refused(tool: str, support: TaskSupport) -> MCPError:
    """-32601 for a call that does not match its tool's task support, as 2025-11-25 says."""
    if support is TaskSupport.REQUIRED:
        words = (
            f"The tool {tool!r} runs only as a task: call it with `task` (taskSupport required)."
        )
    else:
        words = f"The tool {tool!r} does not run as a task: call it without `task`."
    return MCPError(code=types.METHOD_NOT_FOUND, message=words)


def _not_found() -> MCPError:
    return MCPError(code=types.INVALID_PARAMS, message="Failed to retrieve task: Task not found")


class ExperimentalTasks:
    def __init__(
        self,
        runner: ExecutionRunner,
        modes: ApprovalModes,
        approval_url: Any,
        native: NativeDoor,
        decisions: Decisions,
    ) -> None:
        self.runner, self.modes, self.approval_url, self.native = (
            runner,
            modes,
            approval_url,
            native,
        )
        self.decisions = decisions
        self.ttl: timedelta = runner.runtime.settings.task_ttl

    def install(self, server: Server[Any]) -> None:
        """The methods only 2025-11-25 has (tasks/get and tasks/cancel are shared with the
        extension, which hands a 2025 session's to `get` and `cancel` here)."""
        server.add_request_handler("tasks/result", TaskParams, self.result)
        server.add_request_handler("tasks/list", types.PaginatedRequestParams, self.listed)

    # -- the task's shape ----------------------------------------------------------------

    def _status(self, status: E, mode: ApprovalMode) -> str:
        if status in (E.PENDING, E.RUNNING):
            return "working"
        if status == E.WAITING_FOR_INTERACTION:
            # Only the page decides in `browser` mode: nothing to ask the client (a tool's
            # own questions aside: `task` shows those as input_required whatever the mode).
            return "working" if mode is ApprovalMode.BROWSER else "input_required"
        if status == E.COMPLETED:
            return "completed"
        if status == E.CANCELLED:
            return "cancelled"
        return "failed"  # an error answer (the code failed, expired or was interrupted)

    def task(self, view: ExecutionView | TaskLine, mode: ApprovalMode) -> dict[str, Any]:
        """The Task of an execution (a view, or a listing's line)."""
        status = self._status(E(view.status), mode)
        if isinstance(view, ExecutionView) and view.pending and view.pending.questions:
            status = "input_required"  # the tool's own questions, whatever the mode
        task: dict[str, Any] = {
            "taskId": view.id,
            "status": status,
            "createdAt": view.created_at.isoformat(),
            "lastUpdatedAt": view.updated_at.isoformat(),
            "ttl": int(self.ttl.total_seconds() * 1000),
        }
        if status in ("working", "input_required"):
            task["pollInterval"] = POLL_MS
        if status == "input_required":
            task["statusMessage"] = "A call waits for approval: call tasks/result to be asked."
        elif E(view.status) == E.WAITING_FOR_INTERACTION:
            task["statusMessage"] = "Waiting for a person to approve a call on its page."
        return task

    def created(self, outcome: ExecutionView | shapes.Running, mode: ApprovalMode) -> Any:
        """The `CreateTaskResult` of 2025-11-25 for a new execution (already stored)."""
        view = (
            self.runner.runtime.engine.view(outcome.execution_id)
            if isinstance(outcome, shapes.Running)
            else outcome
        )
        return {"task": self.task(view, mode)}

    # -- the methods ---------------------------------------------------------------------

    async def _view(self, task_id: str) -> tuple[str, ExecutionView]:
        principal = current_principal.get()
        engine = self.runner.runtime.engine
        try:
            view = await to_thread.run_sync(engine.get, task_id, principal)
        except LockgateError:
            raise _not_found() from None
        if view.created_at + self.ttl <= engine.clock():
            raise MCPError(
                code=types.INVALID_PARAMS, message="Failed to retrieve task: Task has expired"
            )
        return principal, view

    async def get(self, ctx: ServerRequestContext[Any], params: Any) -> dict[str, Any]:
        principal, view = await self._view(params.task_id)
        return self.task(view, self.modes.for_principal(principal))

    async def listed(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> dict[str, Any]:
        if not legacy(ctx):
            raise MCPError(
                code=types.METHOD_NOT_FOUND,
                message="tasks/list is not part of 2026-07-28's tasks extension.",
            )
        principal = current_principal.get()
        mode = self.modes.for_principal(principal)
        cursor = params.cursor if params is not None else None
        reads = self.runner.runtime.engine.reads
        try:
            lines, after = await to_thread.run_sync(reads.page, principal, PAGE, cursor)
        except LockgateError:
            raise MCPError(
                code=types.INVALID_PARAMS,
                message="Invalid cursor: send the nextCursor of the listing before, or none.",
            ) from None
        listing: dict[str, Any] = {"tasks": [self.task(line, mode) for line in lines]}
        if after is not None:
            listing["nextCursor"] = after
        return listing

    async def cancel(self, ctx: ServerRequestContext[Any], params: Any) -> dict[str, Any]:
        principal, view = await self._view(params.task_id)
        mode = self.modes.for_principal(principal)
        if view.terminal:
            raise MCPError(
                code=types.INVALID_PARAMS,
                message=f"The task is {self._status(view.status, mode)} already: it cannot be "
                "cancelled.",
            )
        if view.status != E.WAITING_FOR_INTERACTION:
            raise MCPError(
                code=types.INVALID_PARAMS,
                message="The task's code is running and is not stopped: a task can be "
                "cancelled while it waits for approval. Poll tasks/get for its result.",
            )
        # Decided meanwhile through another door: the task shows what happened.
        with contextlib.suppress(LockgateError):
            await self.decisions.decide(
                ClientPrompt(principal, Door.TASK, mode, client_of(ctx)),
                Decision(view.id, Action.CANCEL),
            )
        principal, view = await self._view(params.task_id)
        return self.task(view, mode)

    async def result(self, ctx: ServerRequestContext[Any], params: TaskParams) -> dict[str, Any]:
        if not legacy(ctx):
            raise MCPError(
                code=types.METHOD_NOT_FOUND,
                message="tasks/result is not part of 2026-07-28's tasks extension: a finished "
                "task's result comes with tasks/get.",
            )
        principal, view = await self._view(params.task_id)
        mode = self.modes.for_principal(principal)
        asked: set[tuple[int, tuple[str, ...]]] = set()
        while not view.terminal:
            pending = view.pending
            # What is asked: the call, and its tool's open questions (each round's own).
            round_ = (pending.seq, tuple(pending.questions or ())) if pending else None
            if (
                pending is not None
                and round_ is not None
                and (mode is not ApprovalMode.BROWSER or pending.questions is not None)
                and round_ not in asked
            ):
                # The person is asked here, on this request, about the call it waits on
                # (once: a dismissed question is not asked again, the page still decides).
                asked.add(round_)
                await self.native.settle(
                    ctx,
                    principal,
                    view,
                    self.approval_url,
                    related_task=view.id,
                    approvals=mode is not ApprovalMode.BROWSER,
                )
            else:
                outcome = await self.runner.wait(principal, view.id)  # up to the budget
                if isinstance(outcome, ExecutionView) and outcome.pending is not None:
                    await anyio.sleep(POLL_MS / 1000)  # decided elsewhere, or not at all
            principal, view = await self._view(params.task_id)
        fault = internal_error(view)
        if fault is not None:
            raise MCPError(code=types.INTERNAL_ERROR, message=str(fault["message"]))
        url = self.approval_url(view) if view.pending else None
        shape = direct_answer if view.direct_tool else shapes.execution
        answer = shape(view, url, model_accepts=mode is ApprovalMode.MODEL)
        result = answer.model_dump(by_alias=True, mode="json", exclude_none=True)
        result["_meta"] = {**result.get("_meta", {}), RELATED_TASK: {"taskId": view.id}}
        return result
