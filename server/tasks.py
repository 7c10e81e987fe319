"""The tasks extension (`io.modelcontextprotocol/tasks`, modelcontextprotocol/ext-tasks),
which the SDK does not implement, on the SDK's own request-handler API.

A task is its execution: the task id is the execution id (128 random bits; every task
request is checked against the caller's principal, and another principal's task is as
unknown as a made-up one). So a task is durable before `execute` answers with it (the row
commits first), and any instance serves it after any restart. `spec/task_status.py` maps
execution states to task statuses.

- `execute` from a 2026-07-28 request that declares the extension answers a
  `CreateTaskResult` (`resultType: "task"`) at once; the code runs on.
- `tasks/get` answers the detailed task: `inputRequests` with one elicitation per call
  waiting for approval (keyed `approval-<call>`, so a key names one call for the task's
  whole life), `result` with what `execute` would have answered.
- `tasks/update` takes the person's answer for an outstanding key (others are ignored, as
  the extension says) and decides exactly that call; `tasks/cancel` cancels a task that
  waits for approval (cancellation of running code is not honoured: cooperative, as the
  extension allows).
- A request that does not declare the extension gets -32021; an unknown, foreign or expired
  task -32602.
"""

from __future__ import annotations

import contextlib
from datetime import datetime, timedelta
from typing import Any

import mcp_types as types
from anyio import to_thread
from mcp.server import Server, ServerRequestContext
from mcp.shared.exceptions import MCPError
from pydantic import ConfigDict, Field

from lockgate.machine.approval_audit import Door
from lockgate.machine.approval_modes import ApprovalMode, ApprovalModes
from lockgate.machine.engine import Action
from lockgate.machine.errors import LockgateError
from lockgate.machine.execution_errors import InvalidExecutionInput
from lockgate.machine.views import ExecutionView
from lockgate.server import shapes
from lockgate.server.auth import current_principal
from lockgate.server.deciders import client_of
from lockgate.server.decisions import Answers, ClientPrompt, Decision, Decisions
from lockgate.server.direct_tools import answer as direct_answer
from lockgate.server.direct_tools import internal_error
from lockgate.server.experimental_tasks import ExperimentalTasks, legacy
from lockgate.server.input_required import STATELESS
from lockgate.server.native_approval import DECISION_FORM, granted, prompt
from lockgate.server.runner import ExecutionRunner
from lockgate.spec import ExecutionStatus as E
from lockgate.spec.task_status import TASK_STATUS, TaskStatus

TASKS = "io.modelcontextprotocol/tasks"
#: How often a client is asked to poll a task that is working.
POLL_MS = 1000


class TaskParams(types.RequestParams):
    model_config = ConfigDict(extra="allow", populate_by_name=True)
    task_id: str = Field(alias="taskId", min_length=1, max_length=64)


class TaskUpdateParams(TaskParams):
    input_responses: dict[str, Any] = Field(alias="inputResponses")


def declared(ctx: ServerRequestContext[Any]) -> bool:
    """Whether this request's client declared the extension (per request, on 2026-07-28)."""
    capabilities = ctx.session.client_capabilities
    return bool(capabilities and capabilities.extensions and TASKS in capabilities.extensions)


def answers_with_task(ctx: ServerRequestContext[Any]) -> bool:
    """Whether `execute` answers this request with a task: a 2026-07-28 request that declared
    the extension. A 2025 session whose client declared it at initialize (the MCP Inspector
    does) gets the tool result: on that protocol a `tools/call` answers a `CallToolResult`,
    which a task is not."""
    return ctx.protocol_version >= STATELESS and declared(ctx)


def missing_extension() -> MCPError:
    """-32021, naming the extension the request needs and did not declare."""
    return MCPError(
        code=types.MISSING_REQUIRED_CLIENT_CAPABILITY,
        message="Missing required client capability",
        data={"requiredCapabilities": {"extensions": {TASKS: {}}}},
    )


def _require(ctx: ServerRequestContext[Any]) -> None:
    if not declared(ctx):
        raise missing_extension()


def _key(view: ExecutionView) -> str:
    assert view.pending is not None
    return f"approval-{view.pending.seq}"


class Tasks:
    def __init__(
        self,
        runner: ExecutionRunner,
        modes: ApprovalModes,
        approval_url: Any,
        decisions: Decisions,
        legacy_tasks: ExperimentalTasks,
    ) -> None:
        self.runner, self.modes, self.approval_url = runner, modes, approval_url
        self.decisions = decisions
        #: A 2025 session's tasks/get and tasks/cancel speak 2025-11-25's tasks.
        self.legacy_tasks = legacy_tasks
        self.ttl: timedelta = runner.runtime.settings.task_ttl

    def install(self, server: Server[Any]) -> None:
        """Advertise the extension and serve its methods on `server`."""
        server.extensions[TASKS] = {}
        server.add_request_handler("tasks/get", TaskParams, self.get)
        server.add_request_handler("tasks/update", TaskUpdateParams, self.update)
        server.add_request_handler("tasks/cancel", TaskParams, self.cancel)

    # -- the task's shape ----------------------------------------------------------------

    def _status(self, view: ExecutionView, mode: ApprovalMode) -> TaskStatus:
        if internal_error(view) is not None:
            return TaskStatus.FAILED  # a JSON-RPC error, which the extension calls failed
        status = TASK_STATUS[view.status].status
        asking = view.pending is not None and view.pending.questions is not None
        if status is TaskStatus.INPUT_REQUIRED and mode is ApprovalMode.BROWSER and not asking:
            return TaskStatus.WORKING  # only the page decides: nothing to ask the client
        return status

    def _task(self, view: ExecutionView, mode: ApprovalMode) -> dict[str, Any]:
        status = self._status(view, mode)
        task: dict[str, Any] = {
            "taskId": view.id,
            "status": status.value,
            "createdAt": view.created_at.isoformat(),
            "lastUpdatedAt": view.updated_at.isoformat(),
            "ttlMs": int(self.ttl.total_seconds() * 1000),
        }
        if status in (TaskStatus.WORKING, TaskStatus.INPUT_REQUIRED):
            task["pollIntervalMs"] = POLL_MS
        if view.pending is not None and status is TaskStatus.WORKING:
            task["statusMessage"] = (
                f"Waiting for a person to approve tools.{view.pending.tool} on the approval page."
            )
        return task

    def created(self, outcome: ExecutionView | shapes.Running, mode: ApprovalMode) -> Any:
        """The `CreateTaskResult` for a new execution (its row is already committed)."""
        if isinstance(outcome, shapes.Running):
            view = self.runner.runtime.engine.view(outcome.execution_id)
        else:
            view = outcome
        return {"resultType": "task", **self._task(view, mode)}

    # -- the methods ---------------------------------------------------------------------

    def _view(self, task_id: str, principal: str, now: datetime) -> ExecutionView:
        try:
            view = self.runner.runtime.engine.get(task_id, principal)
        except LockgateError:
            raise MCPError(
                code=types.INVALID_PARAMS, message="Failed to retrieve task: Task not found"
            ) from None
        if view.created_at + self.ttl <= now:
            raise MCPError(
                code=types.INVALID_PARAMS, message="Failed to retrieve task: Task has expired"
            )
        return view

    async def _read(self, ctx: ServerRequestContext[Any], task_id: str) -> ExecutionView:
        _require(ctx)
        named = ctx.request.headers.get("mcp-name") if ctx.request is not None else None
        if named is not None and named != task_id:
            # A balancer routes a task's requests by this header: one that names another
            # task than the body would be served where the body's task is not.
            raise MCPError(
                code=types.HEADER_MISMATCH,
                message="The Mcp-Name header names another task than params.taskId: send "
                "the request's taskId as its Mcp-Name header.",
            )
        principal = current_principal.get()
        now = self.runner.runtime.engine.clock()
        return await to_thread.run_sync(self._view, task_id, principal, now)

    async def get(self, ctx: ServerRequestContext[Any], params: TaskParams) -> dict[str, Any]:
        if legacy(ctx):
            return await self.legacy_tasks.get(ctx, params)
        view = await self._read(ctx, params.task_id)
        mode = self.modes.for_principal(view.principal_id)
        task = self._task(view, mode)
        status = TaskStatus(task["status"])
        if status is TaskStatus.INPUT_REQUIRED and view.pending and view.pending.questions:
            # The tool's own questions still open, keyed as it keyed them (an answered one
            # is gone from the map: a client may answer them one at a time).
            task["inputRequests"] = dict(view.pending.questions)
        elif status is TaskStatus.INPUT_REQUIRED:
            request = types.ElicitRequest(
                params=types.ElicitRequestFormParams(
                    message=prompt(view, self.approval_url(view)), requested_schema=DECISION_FORM
                )
            )
            task["inputRequests"] = {
                _key(view): request.model_dump(by_alias=True, mode="json", exclude_none=True)
            }
        elif status is TaskStatus.COMPLETED:
            url = self.approval_url(view) if view.pending else None
            # A direct tool's call answers as that tool; code as `execute`.
            shape = direct_answer if view.direct_tool else shapes.execution
            answer = shape(view, url, model_accepts=mode is ApprovalMode.MODEL)
            task["result"] = answer.model_dump(by_alias=True, mode="json", exclude_none=True)
        elif status is TaskStatus.FAILED:
            error = internal_error(view)
            task["error"] = error
            task["statusMessage"] = error["message"] if error else "The call failed."
        return {"resultType": "complete", **task}

    async def update(
        self, ctx: ServerRequestContext[Any], params: TaskUpdateParams
    ) -> dict[str, Any]:
        if legacy(ctx):
            raise MCPError(
                code=types.METHOD_NOT_FOUND,
                message="tasks/update is the 2026-07-28 extension's: on a 2025 session, "
                "call tasks/result to be asked for the task's input.",
            )
        view = await self._read(ctx, params.task_id)
        mode = self.modes.for_principal(view.principal_id)
        if view.pending is None or self._status(view, mode) is not TaskStatus.INPUT_REQUIRED:
            return {"resultType": "complete"}  # nothing outstanding: ignored
        if view.pending.questions is not None:
            who = ClientPrompt(view.principal_id, Door.TASK, mode, client_of(ctx))
            answers = Answers(view.id, dict(params.input_responses), call=view.pending.seq)
            try:  # the task goes on in the background; tasks/get tells what came of it
                await self.decisions.answer(who, answers, budget=0)
            except InvalidExecutionInput as exc:
                raise MCPError(code=types.INVALID_PARAMS, message=exc.message) from None
            except LockgateError:
                pass  # answered meanwhile through another door: the task shows what happened
            return {"resultType": "complete"}
        answer = params.input_responses.get(_key(view))
        action = answer.get("action") if isinstance(answer, dict) else None
        if isinstance(answer, dict) and action in ("accept", "decline"):
            who = ClientPrompt(view.principal_id, Door.TASK, mode, client_of(ctx))
            # Decided meanwhile through another door: the task shows what happened.
            with contextlib.suppress(LockgateError):
                await self.decisions.decide(
                    who,
                    Decision(
                        view.id,
                        Action.ACCEPT if action == "accept" else Action.DECLINE,
                        call=view.pending.seq,
                        content=granted(answer) if action == "accept" else None,
                    ),
                )
        return {"resultType": "complete"}

    async def cancel(self, ctx: ServerRequestContext[Any], params: TaskParams) -> dict[str, Any]:
        if legacy(ctx):
            return await self.legacy_tasks.cancel(ctx, params)
        view = await self._read(ctx, params.task_id)
        if view.status == E.WAITING_FOR_INTERACTION:
            # Decided meanwhile: cancellation is cooperative.
            mode = self.modes.for_principal(view.principal_id)
            with contextlib.suppress(LockgateError):
                await self.decisions.decide(
                    ClientPrompt(view.principal_id, Door.TASK, mode, client_of(ctx)),
                    Decision(view.id, Action.CANCEL),
                )
        return {"resultType": "complete"}
