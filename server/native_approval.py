"""The native door on a 2025 session: the client asks its person (MCP elicitation) while the
`execute` or `resume` request that met the paused call is still open.

Form mode, where the client declares elicitation: the call is described and the person
accepts or declines; the answer decides the call (exactly the call shown: `expected_call`)
and the execution goes on, within the same request. URL mode, where the client declares only
that: the client opens the call's approval page for its person (`elicitation/create` with
the page's URL); once the person decides there, the server says so
(`notifications/elicitation/complete`) and the request goes on with the outcome. A client
that declares no elicitation gets the page's URL in the answer, as in `browser` mode.

Nothing is lost when the client does not answer: a dismissed prompt (`cancel`), an error, a
dropped connection or the call's deadline leave the execution paused exactly as it was, and
the other doors (the page, `resume` from any session, after any restart) still decide it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, cast

import anyio
import mcp_types as types
from mcp.server import ServerRequestContext
from mcp.shared.message import ServerMessageMetadata
from pydantic import JsonValue

from lockgate.machine.approval_audit import Door
from lockgate.machine.approval_modes import ApprovalMode
from lockgate.machine.engine import Action
from lockgate.machine.errors import LockgateError
from lockgate.machine.tools.questions import form_of
from lockgate.machine.views import ExecutionView
from lockgate.server.deciders import client_of
from lockgate.server.decisions import Answers, ClientPrompt, Decision, Decisions
from lockgate.server.runner import ExecutionRunner
from lockgate.server.shapes import Running

log = logging.getLogger("lockgate.mcp")

#: The most calls one request asks about in turn (code that pauses again after each
#: decision); past it, the answer is the paused execution, for `resume` to go on with.
MAX_ASKED = 20
#: How often a URL-mode request looks for the decision made on the page (a read of one row).
PAGE_POLL_SECONDS = 0.25
#: The most characters of the arguments a prompt quotes: a client shows its person a short
#: message, so a longer call is cut there, says so, and names its page (which shows it all).
PROMPT_ARGUMENT_CHARS = 2000
#: What the form asks for besides the decision: optionally, how many more calls of the same
#: tool in the execution the approval also covers (`machine/approval_grants.py`).
GRANT_FIELD = "alsoApproveNext"
DECISION_FORM: types.ElicitRequestedSchema = {
    "type": "object",
    "properties": {
        GRANT_FIELD: {
            "type": "integer",
            "minimum": 0,
            "maximum": 1000,
            "default": 0,
            "title": "Also approve the next calls of this tool",
            "description": "For code that calls this tool in a loop: how many more of its "
            "calls in this execution this approval covers (each is still recorded).",
        }
    },
}


def granted(answer: types.ElicitResult | dict[str, Any]) -> JsonValue:
    """The decision's content for an accepted form: the grant its person filled in, if any."""
    content = answer.content if isinstance(answer, types.ElicitResult) else answer.get("content")
    more = content.get(GRANT_FIELD) if isinstance(content, dict) else None
    if isinstance(more, int) and not isinstance(more, bool) and more > 0:
        return {"grant": {"calls": more}}
    return None


def prompt(view: ExecutionView, page: str | None) -> str:
    """What the person reads: the call, its arguments, whose code asks, until when. Arguments
    longer than a prompt holds are cut, and the prompt says so and names the call's page."""
    pending = view.pending
    assert pending is not None
    expires = (
        f" The request expires at {pending.deadline:%Y-%m-%d %H:%M} UTC."
        if (pending.deadline)
        else ""
    )
    arguments = json.dumps(pending.arguments_preview, ensure_ascii=False)
    cut = len(arguments) > PROMPT_ARGUMENT_CHARS or (
        isinstance(pending.arguments_preview, dict) and pending.arguments_preview.get("truncated")
    )
    if cut:
        where = f" at {page}" if page else " on its approval page"
        arguments = (
            arguments[:PROMPT_ARGUMENT_CHARS] + f" … [CUT: the arguments are longer than this "
            f"prompt shows; read them all{where} before you accept]"
        )
    return (
        f"Approve a call of tools.{pending.tool} with {arguments}? It was asked by code "
        f"running for {view.principal_id} (execution {view.id}).{expires} Accept makes the "
        "call; decline refuses it (the code sees PermissionError)."
    )


#: The `_meta` key naming the task a message belongs to (2025-11-25 tasks).
RELATED_TASK = "io.modelcontextprotocol/related-task"


async def _elicit(
    ctx: ServerRequestContext[Any],
    params: types.ElicitRequestFormParams | types.ElicitRequestURLParams,
    related_task: str | None,
) -> types.ElicitResult:
    """An `elicitation/create` on this request's stream (the SDK's `elicit_form` and
    `elicit_url`, with the related task in its `_meta` when there is one)."""
    if related_task is not None:
        # An open map (`extra_items=Any`) whose reserved keys mypy cannot spell.
        params.meta = cast(types.RequestParamsMeta, {RELATED_TASK: {"taskId": related_task}})
    return await ctx.session.send_request(
        types.ElicitRequest(params=params),
        types.ElicitResult,
        metadata=ServerMessageMetadata(related_request_id=ctx.request_id),
    )


class NativeDoor:
    def __init__(
        self,
        runner: ExecutionRunner,
        decisions: Decisions,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.runner, self.decisions, self.clock = runner, decisions, clock

    @staticmethod
    def can_ask(ctx: ServerRequestContext[Any]) -> bool:
        """Whether this request's client can be asked (in a form, or on the page), now (a
        2026-07-28 request has no channel for it: its door is InputRequiredResult)."""
        session = ctx.session
        declared = session.client_capabilities
        return (
            declared is not None
            and declared.elicitation is not None
            and bool(session.can_send_request)
        )

    @staticmethod
    def _by_url(ctx: ServerRequestContext[Any]) -> bool:
        """Whether the client declared URL mode only (so the page is where its person goes).
        One that declared elicitation with neither mode (the 2025-06-18 form) has forms."""
        declared = ctx.session.client_capabilities
        assert declared is not None and declared.elicitation is not None
        return declared.elicitation.form is None and declared.elicitation.url is not None

    async def settle(
        self,
        ctx: ServerRequestContext[Any],
        principal: str,
        outcome: ExecutionView | Running,
        page: Callable[[ExecutionView], str | None],
        *,
        related_task: str | None = None,
        approvals: bool = True,
    ) -> ExecutionView | Running:
        """Ask the client's person about each call the execution waits on, in turn: in a
        form, or on the call's approval page (`page`: its URL) for a URL-mode client. With
        `related_task`, each question names the task it belongs to (2025-11-25 tasks).
        A call whose tool asked its user questions gets them, one form each, whatever the
        approval mode; `approvals` False (the mode is not `native`): only those."""
        if not self.can_ask(ctx):
            return outcome
        by_url = self._by_url(ctx)
        for _ in range(MAX_ASKED):
            if not isinstance(outcome, ExecutionView) or outcome.pending is None:
                return outcome
            if outcome.pending.questions is not None:
                if by_url:
                    return outcome  # a URL-mode client shows no forms
                decided = await self._answer_in_forms(ctx, principal, outcome, related_task)
            elif not approvals:
                return outcome
            elif by_url:
                decided = await self._ask_on_page(ctx, principal, outcome, page, related_task)
            else:
                decided = await self._ask_in_form(ctx, principal, outcome, page, related_task)
            if decided is None:
                return outcome  # unanswered: paused as it was, for the other doors
            outcome = decided
        return outcome

    async def _ask_on_page(
        self,
        ctx: ServerRequestContext[Any],
        principal: str,
        view: ExecutionView,
        page: Callable[[ExecutionView], str | None],
        related_task: str | None,
    ) -> ExecutionView | Running | None:
        """URL mode: the client sends its person to the call's page; the person's decision
        there (any door, really: the page, the inbox, a `resume` from elsewhere) ends the
        wait, and the client is told the elicitation is complete."""
        assert view.pending is not None
        url = page(view)
        if url is None:
            return None
        elicitation = f"{view.id}:{view.pending.seq}"
        try:
            with anyio.fail_after(self._seconds_left(view)):
                answer = await _elicit(
                    ctx,
                    types.ElicitRequestURLParams(
                        message=prompt(view, url), url=url, elicitation_id=elicitation
                    ),
                    related_task,
                )
                if answer.action != "accept":
                    return None  # the person would not open the page: nobody decided
                decided = await self._decided_elsewhere(principal, view)
            await ctx.session.send_elicit_complete(elicitation, related_request_id=ctx.request_id)
        except Exception as exc:  # gone or too late: the execution stays paused
            log.info("execution %s: the page's decision did not come (%s)", view.id, exc)
            return None
        return decided

    async def _decided_elsewhere(
        self, principal: str, view: ExecutionView
    ) -> ExecutionView | Running:
        """Once the call `view` waits on is decided, the execution's outcome."""
        assert view.pending is not None
        engine = self.runner.runtime.engine
        while True:
            now = await anyio.to_thread.run_sync(engine.get, view.id, principal)
            if now.pending is None or now.pending.seq != view.pending.seq:
                return await self.runner.wait(principal, view.id)
            await anyio.sleep(PAGE_POLL_SECONDS)

    def _seconds_left(self, view: ExecutionView) -> float:
        assert view.pending is not None
        deadline = view.pending.deadline
        if deadline is None:
            return self.runner.runtime.settings.approval_ttl.total_seconds()
        return max(0.0, (deadline - self.clock()).total_seconds())

    async def _answer_in_forms(
        self,
        ctx: ServerRequestContext[Any],
        principal: str,
        view: ExecutionView,
        related_task: str | None,
    ) -> ExecutionView | Running | None:
        """Each open question of the call's tool, as the form it is; the answers (accept,
        decline or cancel, each an answer the tool reads) are applied together. A question
        that got no answer (an error, the deadline) ends the round: what was answered is
        kept, the rest waits for another door."""
        pending = view.pending
        assert pending is not None and pending.questions is not None
        answers: dict[str, JsonValue] = {}
        for key, request in pending.questions.items():
            message, schema = form_of(request)
            try:
                with anyio.fail_after(self._seconds_left(view)):
                    answer = await _elicit(
                        ctx,
                        types.ElicitRequestFormParams(
                            message=message,
                            requested_schema=cast(types.ElicitRequestedSchema, schema),
                        ),
                        related_task,
                    )
            except Exception as exc:  # gone or too late: the question stays open
                log.info("execution %s: question %s got no answer (%s)", view.id, key, exc)
                break
            answers[key] = answer.model_dump(
                mode="json", include={"action", "content"}, exclude_none=True
            )
        if not answers:
            return None
        who = ClientPrompt(principal, Door.CLIENT_PROMPT, ApprovalMode.NATIVE, client_of(ctx))
        try:
            outcome = await self.decisions.answer(who, Answers(view.id, answers, call=pending.seq))
        except LockgateError as exc:  # answered elsewhere meanwhile, or not as asked
            log.info("execution %s: the answers were not taken (%s)", view.id, exc.message)
            return None
        if len(answers) < len(pending.questions):
            return None  # some stay open: for another door
        return outcome

    async def _ask_in_form(
        self,
        ctx: ServerRequestContext[Any],
        principal: str,
        view: ExecutionView,
        page: Callable[[ExecutionView], str | None],
        related_task: str | None,
    ) -> ExecutionView | Running | None:
        assert view.pending is not None
        try:
            with anyio.fail_after(self._seconds_left(view)):
                answer = await _elicit(
                    ctx,
                    types.ElicitRequestFormParams(
                        message=prompt(view, page(view)), requested_schema=DECISION_FORM
                    ),
                    related_task,
                )
        except Exception as exc:  # gone, refused or too late: the execution stays paused
            log.info("execution %s: the client's prompt got no answer (%s)", view.id, exc)
            return None
        if answer.action == "accept":
            action = Action.ACCEPT
        elif answer.action == "decline":
            action = Action.DECLINE
        else:  # dismissed: nobody decided
            return None
        return await self.decisions.decide(
            ClientPrompt(principal, Door.CLIENT_PROMPT, ApprovalMode.NATIVE, client_of(ctx)),
            Decision(
                view.id,
                action,
                call=view.pending.seq,
                content=granted(answer) if action is Action.ACCEPT else None,
            ),
        )
