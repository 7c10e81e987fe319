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
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel, JsonValue

from lockgate.machine.approval_audit import Door
from lockgate.machine.approval_modes import ApprovalMode
from lockgate.machine.engine import Action
from lockgate.machine.errors import LockgateError
from lockgate.machine.execution_errors import ExecutionAlreadySettled, InvalidExecutionInput
from lockgate.machine.views import ExecutionView
from lockgate.server.deciders import client_of
from lockgate.server.decisions import Answers, ClientPrompt, Decision, Decisions
from lockgate.server.native_approval import DECISION_FORM, granted, prompt
from lockgate.server.shapes import Running

#: The key of the one input request: the approval of the call the execution waits on.
APPROVAL = "approval"
#: The protocol whose requests carry `inputResponses` instead of a session to ask on.
STATELESS = "2026-07-28"


def _responses(params: types.CallToolRequestParams) -> dict[str, JsonValue]:
    """The request's `inputResponses` as the JSON the client sent."""
    return {
        key: value.model_dump(mode="json", by_alias=True, exclude_none=True)
        if isinstance(value, BaseModel)
        else value
        for key, value in (params.input_responses or {}).items()
    }


def dismissed(params: types.CallToolRequestParams) -> bool:
    """Whether a retry's answer to an approval dismissed it (neither accept nor decline): a
    dismissed prompt is not asked again in a loop; its answer names the approval page."""
    answer = (params.input_responses or {}).get(APPROVAL)
    if answer is None:
        return False
    return not (isinstance(answer, types.ElicitResult) and answer.action in ("accept", "decline"))


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
        """The `input_required` answer for the call `view` waits on (None: none waits): its
        tool's open questions, keyed as the tool keyed them, or the approval of the call."""
        if view.pending is None:
            return None
        if view.pending.questions is not None:
            asked = view.pending.questions
            # The keys still open name the round: each round's state differs from the last.
            state = {"executionId": view.id, "call": view.pending.seq, "asked": sorted(asked)}
            return types.InputRequiredResult(
                input_requests={
                    key: types.ElicitRequest.model_validate(request)
                    for key, request in asked.items()
                },
                request_state=json.dumps(state),
            )
        request = types.ElicitRequest(
            params=types.ElicitRequestFormParams(
                message=prompt(view, self.page(view)), requested_schema=DECISION_FORM
            )
        )
        state = {"executionId": view.id, "call": view.pending.seq}
        return types.InputRequiredResult(
            input_requests={APPROVAL: request}, request_state=json.dumps(state)
        )

    async def answered_at_once(
        self,
        ctx: ServerRequestContext[Any],
        principal: str,
        outcome: ExecutionView | Running,
        params: types.CallToolRequestParams,
        budget: float | None,
    ) -> ExecutionView | Running:
        """A first call that already carries answers (`inputResponses` without a
        `requestState`, MCP's stateless form): they answer what its tool asks, as a retry's
        would. Keys it does not ask are ignored; answers that do not fit are, and the
        questions are asked again."""
        view = outcome if isinstance(outcome, ExecutionView) else None
        if view is None or view.pending is None or view.pending.questions is None:
            return outcome
        who = ClientPrompt(principal, Door.CLIENT_PROMPT, ApprovalMode.NATIVE, client_of(ctx))
        answers = Answers(view.id, _responses(params), call=view.pending.seq)
        try:
            return await self.decisions.answer(who, answers, budget)
        except LockgateError:  # not as asked, or answered meanwhile: asked (again) as it is
            return await to_thread.run_sync(
                self.decisions.runner.runtime.engine.get, view.id, principal
            )

    async def answer(
        self,
        ctx: ServerRequestContext[Any],
        principal: str,
        params: types.CallToolRequestParams,
        mode: ApprovalMode,
        budget: float | None = None,
    ) -> ExecutionView | Running:
        """A retry carrying the person's answer: decide the call (once), and return where the
        execution got to. A dismissed prompt decides nothing; an accept is the client's
        person's only while the connection's mode is `native` (the decision entry refuses
        it otherwise: a state sealed before the operator made the mode stricter)."""
        assert params.request_state is not None  # unsealed by the SDK's boundary
        state = json.loads(params.request_state)
        execution_id = str(state["executionId"])
        if "asked" in state:  # the tool's questions: the answers are the tool's
            who = ClientPrompt(principal, Door.CLIENT_PROMPT, mode, client_of(ctx))
            answers = Answers(execution_id, _responses(params), call=int(state["call"]))
            try:
                return await self.decisions.answer(who, answers, budget)
            except ExecutionAlreadySettled:
                pass  # answered before (this very retry, replayed): where it got to
            except InvalidExecutionInput as exc:  # not as asked: said, the question open
                raise MCPError(
                    code=types.INVALID_PARAMS, message=f"{exc.message} {exc.hint or ''}".strip()
                ) from None
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
