"""A direct tool's calls (`expose = "direct"`): each a one-call execution, answered as the
tool (MCP content), or as a task where the tool and the client allow one (2025-11-25's, asked
for by the client; the 2026-07-28 extension's, decided here: a call that requires one, or
that does not finish at once). A call whose tool asks its user before the call is worth a
task (`ToolContext.ask(..., before_task=True)`) is first an `input_required` round on the
request itself; the client's retry with the answers gets the task.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import mcp_types as types
from anyio import to_thread
from mcp.server import ServerRequestContext

from lockgate.machine.approval_modes import ApprovalMode
from lockgate.machine.lost_report import request_key
from lockgate.machine.tools.spec import TaskSupport
from lockgate.machine.views import ExecutionView
from lockgate.server import shapes
from lockgate.server.call_relay import relayed
from lockgate.server.direct_tools import DirectTools
from lockgate.server.experimental_tasks import (
    ExperimentalTasks,
    asks_for_task,
    legacy,
    task_refused,
)
from lockgate.server.input_required import InputRequiredDoor, dismissed
from lockgate.server.runner import ExecutionRunner
from lockgate.server.tasks import Tasks, answers_with_task, missing_extension

#: How long a direct call that may become a task runs before it does: one that finishes
#: sooner answers its result at once (the extension's immediate-result shortcut), so a
#: quick read never costs the client a poll.
TASK_AFTER_SECS = 1.0

Reply = types.CallToolResult | types.InputRequiredResult | dict[str, Any]


class Finish(Protocol):
    """The MCP surface's answer about an outcome (`LockgateMCP._finish`)."""

    def __call__(
        self,
        ctx: ServerRequestContext[Any],
        principal: str,
        outcome: ExecutionView | shapes.Running,
        mode: ApprovalMode,
        *,
        ask: bool = True,
        direct: bool = False,
    ) -> Awaitable[types.CallToolResult | types.InputRequiredResult]: ...


class DirectCalls:
    def __init__(
        self,
        runner: ExecutionRunner,
        direct: DirectTools,
        tasks: tuple[Tasks, ExperimentalTasks],
        input_required: InputRequiredDoor,
        finish: Finish,
        level: Callable[[str | None], Callable[[], Awaitable[str | None]]],
    ) -> None:
        self.runner, self.direct, self.input_required = runner, direct, input_required
        self.tasks, self.legacy_tasks = tasks
        self.finish, self.level = finish, level

    def as_task(self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> bool:
        """Whether a direct tool's call is answered as a task (an error where the client's
        request does not match the tool's task support)."""
        support = self.direct.specs[params.name].task_support
        if legacy(ctx):  # 2025-11-25: the client asks for a task, as the tool allows
            takes_tasks = asks_for_task(ctx, params)
            if (takes_tasks and support is TaskSupport.FORBIDDEN) or (
                not takes_tasks and support is TaskSupport.REQUIRED
            ):
                raise task_refused(params.name, support)
            return takes_tasks
        # The extension: the server decides, where the client takes tasks at all.
        takes_tasks = answers_with_task(ctx)
        if support is TaskSupport.REQUIRED and not takes_tasks:
            raise missing_extension()
        return takes_tasks and support is not TaskSupport.FORBIDDEN

    async def retry(
        self,
        ctx: ServerRequestContext[Any],
        principal: str,
        params: types.CallToolRequestParams,
        mode: ApprovalMode,
    ) -> Reply:
        """The client's retry with its person's answers (`requestState`): nothing runs
        again; the call goes on, and is a task now where it is one."""
        as_task = self.as_task(ctx, params)
        budget = TASK_AFTER_SECS if as_task and not legacy(ctx) else None
        outcome = await self.input_required.answer(ctx, principal, params, mode, budget)
        return await self._reply(
            ctx, principal, params.name, outcome, mode, as_task, ask=not dismissed(params)
        )

    async def call(
        self,
        ctx: ServerRequestContext[Any],
        principal: str,
        params: types.CallToolRequestParams,
        session_id: str | None,
        mode: ApprovalMode,
    ) -> Reply:
        """A direct tool's call: a one-call execution, answered as the tool, or as a task
        (stored before the answer) where the tool and the client allow one and the call does
        not finish at once."""
        as_task = self.as_task(ctx, params)
        async with relayed(ctx, params, self.level(session_id)) as listener:
            outcome = await self.runner.execute(
                principal,
                self.direct.code(params.name, params.arguments or {}),
                session_id,
                request_key(session_id, ctx.request_id)
                if session_id and ctx.request_id is not None
                else None,
                None,
                # A task asked for (2025): stored, then answered at once.
                budget=(0 if legacy(ctx) else TASK_AFTER_SECS) if as_task else None,
                direct_tool=params.name,
                listener=listener,
            )
        if params.input_responses and not legacy(ctx):
            budget = TASK_AFTER_SECS if as_task else None
            outcome = await self.input_required.answered_at_once(
                ctx, principal, outcome, params, budget
            )
        return await self._reply(ctx, principal, params.name, outcome, mode, as_task)

    async def _reply(
        self,
        ctx: ServerRequestContext[Any],
        principal: str,
        name: str,
        outcome: ExecutionView | shapes.Running,
        mode: ApprovalMode,
        as_task: bool,
        *,
        ask: bool = True,
    ) -> Reply:
        """A direct call's answer: a task where it is one (2025: asked for; the extension: a
        call that needs a task or did not finish at once), else the tool's own answer. A
        call whose tool asks before it is worth a task (`before_task`) asks on this request
        first, where the client speaks `input_required` (the task comes with the answers)."""
        if legacy(ctx) and as_task:  # asked for: a task however quick the call was
            return await to_thread.run_sync(self.legacy_tasks.created, outcome, mode)
        before_task = (
            isinstance(outcome, ExecutionView)
            and outcome.pending is not None
            and outcome.pending.before_task
        )
        if as_task and before_task and ask and self.input_required.applies(ctx):
            assert isinstance(outcome, ExecutionView)
            asked = await self.input_required.ask(outcome)
            if asked is not None:
                return asked
        required = self.direct.specs[name].task_support is TaskSupport.REQUIRED
        unfinished = isinstance(outcome, shapes.Running) or not outcome.terminal
        if as_task and (required or unfinished):
            return await to_thread.run_sync(self.tasks.created, outcome, mode)
        return await self.finish(ctx, principal, outcome, mode, ask=ask, direct=True)
