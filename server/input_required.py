"""The native door on the 2026-07-28 protocol: `InputRequiredResult`.

A stateless request has no channel for the server to ask the client anything, so a request
that meets a paused call (in approval mode `native`, from a client that declared
elicitation) answers `input_required` with one elicitation for the person, and a
`requestState` naming the call's approval link. The client asks its person and sends the
same request again with the answer (`inputResponses`) and the state.

The state refers to the durable execution, not to anything in this process: the retry works
on any instance, after any restart. It is sealed by the SDK's `RequestStateBoundary`
(AES-GCM under the approval-link signing keys, which every instance shares and which rotate
with them), bound to the request (method, tool, arguments) and to the principal, and expires
with the approval: a tampered, foreign or expired state is refused by the SDK with -32602. The
link it names is single-use, as on the page: a replayed retry is refused in words (`used`).
"""

from __future__ import annotations

import json
from typing import Any

import mcp_types as types
from anyio import to_thread
from mcp.server import ServerRequestContext

from lockgate.machine.engine import Action
from lockgate.machine.views import ExecutionView
from lockgate.server.approval_page import ApprovalSurface
from lockgate.server.deciders import by_client_prompt
from lockgate.server.native_approval import DECISION_FORM, granted, prompt
from lockgate.server.shapes import Running

#: The key of the one input request: the approval of the call the execution waits on.
APPROVAL = "approval"
#: The protocol whose requests carry `inputResponses` instead of a session to ask on.
STATELESS = "2026-07-28"


class InputRequiredDoor:
    def __init__(self, approvals: ApprovalSurface) -> None:
        self.approvals = approvals

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
        """The `input_required` answer for the call `view` waits on (None: no link to name)."""
        url = await to_thread.run_sync(self.approvals.approval_url, view)
        if url is None:
            return None
        request = types.ElicitRequest(
            params=types.ElicitRequestFormParams(
                message=prompt(view), requested_schema=DECISION_FORM
            )
        )
        state = {"executionId": view.id, "link": url.rsplit("/", 1)[1]}
        return types.InputRequiredResult(
            input_requests={APPROVAL: request}, request_state=json.dumps(state)
        )

    async def answer(
        self,
        ctx: ServerRequestContext[Any],
        principal: str,
        params: types.CallToolRequestParams,
    ) -> ExecutionView | Running:
        """A retry carrying the person's answer: decide the call (once), and return where the
        execution got to. A dismissed prompt decides nothing."""
        assert params.request_state is not None  # unsealed by the SDK's boundary
        state = json.loads(params.request_state)
        response = (params.input_responses or {}).get(APPROVAL)
        if isinstance(response, types.ElicitResult) and response.action in ("accept", "decline"):
            action = Action.ACCEPT if response.action == "accept" else Action.DECLINE
            return await self.approvals.decide_with_token(
                str(state["link"]),
                principal,
                action,
                by_client_prompt(ctx, principal),
                granted(response) if action is Action.ACCEPT else None,
            )
        engine = self.approvals.runtime.engine
        return await to_thread.run_sync(engine.get, str(state["executionId"]), principal)
