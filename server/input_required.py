"""The native door on the 2026-07-28 protocol: `InputRequiredResult`.

A stateless request has no channel for the server to ask the client anything, so a request
that meets a paused call (in approval mode `native`, from a client that declared
elicitation) answers `input_required` with one elicitation for the person, and a
`requestState` naming the execution and the call. The client asks its person and sends the
same request again with the answer (`inputResponses`) and the state.

The state refers to the durable execution, not to anything in this process: the retry works
on any instance, after any restart. It is sealed by the SDK's `RequestStateBoundary`
(AES-GCM under the approval-link signing keys, which every instance shares and which rotate
with them), bound to the request (method, tool, arguments) and to the principal, and expires
with the approval: a tampered, foreign or expired state is refused by the SDK with -32602. The
decision applies to the call the state names and to no later one, once: a replayed retry
decides nothing again and gets where the execution got to.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import mcp_types as types
from anyio import to_thread
from mcp.server import ServerRequestContext

from lockgate.machine.approval_audit import Door
from lockgate.machine.approval_modes import ApprovalMode
from lockgate.machine.engine import Action
from lockgate.machine.execution_errors import ExecutionAlreadySettled
from lockgate.machine.views import ExecutionView
from lockgate.server.deciders import client_of
from lockgate.server.decisions import ClientPrompt, Decision, Decisions
from lockgate.server.native_approval import DECISION_FORM, granted, prompt
from lockgate.server.shapes import Running

#: The key of the one input request: the approval of the call the execution waits on.
APPROVAL = "approval"
#: The protocol whose requests carry `inputResponses` instead of a session to ask on.
STATELESS = "2026-07-28"


class InputRequiredDoor:
    def __init__(self, decisions: Decisions, page: Callable[[ExecutionView], str | None]) -> None:
        self.decisions, self.page = decisions, page

    @staticmethod
    def applies(ctx: ServerRequestContext[Any]) -> bool:
        """A 2026-07-28 request from a client that declared elicitation."""
        declared = ctx.session.client_capabilities
        return (
            ctx.protocol_version >= STATELESS
            and declared is not None
            and declared.elicitation is not None
        )

    async def ask(self, view: ExecutionView) -> types.InputRequiredResult | None:
        """The `input_required` answer for the call `view` waits on (None: none waits)."""
        if view.pending is None:
            return None
        request = types.ElicitRequest(
            params=types.ElicitRequestFormParams(
                message=prompt(view, self.page(view)), requested_schema=DECISION_FORM
            )
        )
        state = {"executionId": view.id, "call": view.pending.seq}
        return types.InputRequiredResult(
            input_requests={APPROVAL: request}, request_state=json.dumps(state)
        )

    async def answer(
        self,
        ctx: ServerRequestContext[Any],
        principal: str,
        params: types.CallToolRequestParams,
        mode: ApprovalMode,
    ) -> ExecutionView | Running:
        """A retry carrying the person's answer: decide the call (once), and return where the
        execution got to. A dismissed prompt decides nothing; an accept is the client's
        person's only while the connection's mode is `native` (the decision entry refuses
        it otherwise: a state sealed before the operator made the mode stricter)."""
        assert params.request_state is not None  # unsealed by the SDK's boundary
        state = json.loads(params.request_state)
        execution_id = str(state["executionId"])
        response = (params.input_responses or {}).get(APPROVAL)
        if isinstance(response, types.ElicitResult) and response.action in ("accept", "decline"):
            action = Action.ACCEPT if response.action == "accept" else Action.DECLINE
            try:
                return await self.decisions.decide(
                    ClientPrompt(
                        principal, Door.CLIENT_PROMPT, ApprovalMode.NATIVE, client_of(ctx)
                    ),
                    Decision(
                        execution_id,
                        action,
                        call=int(state["call"]),
                        content=granted(response) if action is Action.ACCEPT else None,
                    ),
                )
            except ExecutionAlreadySettled:
                pass  # decided before (this very retry, replayed): nothing is decided again
        engine = self.decisions.runner.runtime.engine
        return await to_thread.run_sync(engine.get, execution_id, principal)
