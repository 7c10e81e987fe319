"""The approval page, and the HTTP API behind it and beside it.

- `GET /approve/{execution}/{call}`: the page a waiting answer's `approvalUrl` names. It
  authorises nothing: without a signed-in approver of the call's principal it asks the
  person to sign in (or says they do not approve for that principal); with one, it shows
  the call whole (every argument, the code) and its digest.
- `GET|POST /api/approvals/{execution}/{call}`: the call as the page shows it, and the
  person's decision (JSON, CSRF token, the digest of what was shown). Only a signed-in
  person; never a key or a link.
- `GET /api/executions/{id}` and `POST /api/executions/{id}/resume`: the principal's own
  execution, with its API key: read it, decline or cancel its call; accept only in approval
  mode `model`.

Every decision goes through the one decision entry (`server/decisions.py`); every refusal
is a JSON problem (API) or a short page (browser), never a stack trace.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable
from typing import Literal
from urllib.parse import quote

from anyio import to_thread
from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from lockgate.machine.approval_audit import Door
from lockgate.machine.approval_modes import ApprovalModes
from lockgate.machine.engine import Action
from lockgate.machine.errors import LockgateError
from lockgate.machine.people import SignedIn
from lockgate.machine.runtime import Runtime
from lockgate.machine.views import ExecutionView
from lockgate.server.approval_access import ApprovalAccess
from lockgate.server.approval_answers import (
    NO_STORE,
    Refusal,
    from_error,
    problem,
    public_view,
    refused,
)
from lockgate.server.call_shown import CallShown, call_shown, page_url
from lockgate.server.decisions import Agent, Decision, Decisions, Person
from lockgate.server.pages import expiry_text, failure_notice, notice, render, settled_notice
from lockgate.server.person_session import PersonAuth, csrf_token
from lockgate.server.runner import ExecutionRunner
from lockgate.server.shapes import Running

log = logging.getLogger("lockgate.approval")


class ResumeBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    action: Literal["accept", "decline", "cancel"]
    content: JsonValue = None


class PersonDecisionBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    action: Literal["accept", "decline"]
    #: The digest of the call as the page showed it (sha256, hex).
    digest: str | None = Field(default=None, min_length=64, max_length=64)
    #: For code that calls the tool in a loop: `{"calls": N}` or `{"untilEnd": true}`.
    grant: JsonValue = None
    #: Where the person decided, for the audit record.
    door: Literal["page", "inbox"] = "page"


async def answer(work: Awaitable[Response]) -> Response:
    """Every refusal as a JSON problem; anything unexpected logged, never shown."""
    try:
        return await work
    except Refusal as exc:
        return refused(exc)
    except LockgateError as exc:
        return from_error(exc)
    except Exception:
        log.exception("the approval API failed")
        return problem(500, "internal_error", "The server failed to handle this request; retry.")


class ApprovalSurface:
    def __init__(
        self,
        runtime: Runtime,
        runner: ExecutionRunner,
        access: ApprovalAccess,
        people: PersonAuth,
    ) -> None:
        self.runtime, self.runner, self.access, self.people = runtime, runner, access, people
        settings = runtime.settings
        self.modes = ApprovalModes.from_text(settings.approval_mode, settings.approval_modes)
        self.decisions = Decisions(runner, runtime.people, self.approval_url)

    def approval_url(self, view: ExecutionView) -> str | None:
        """The page of the call a paused execution waits on (it names the call, and
        authorises nothing)."""
        if view.pending is None:
            return None
        return page_url(self.runtime.settings.base_url, view.id, view.pending.seq)

    def _code(self, execution_id: str) -> str:
        row = self.runtime.engine.store.executions.get(execution_id)
        return row.code if row is not None else ""

    # -- the principal's key --------------------------------------------------------------

    async def _get(self, execution_id: str, request: Request) -> Response:
        principal = await self.access.key_principal(request)
        view = await to_thread.run_sync(self.runtime.engine.get, execution_id, principal)
        code = await to_thread.run_sync(self._code, execution_id)
        return JSONResponse(public_view(view, code), headers=NO_STORE)

    async def _resume(self, execution_id: str, request: Request) -> Response:
        self.access.check_json(request)
        principal = await self.access.key_principal(request)
        try:
            body = ResumeBody.model_validate_json(await self.access.read_body(request))
        except ValidationError:
            raise Refusal(
                400,
                "invalid_input",
                'The body must be {"action": "accept" | "decline" | "cancel"}.',
            ) from None
        who = Agent(principal, Door.HTTP_API, self.modes.for_principal(principal))
        decision = Decision(execution_id, Action(body.action), content=body.content)
        return await self._outcome(execution_id, await self.decisions.decide(who, decision))

    async def _outcome(self, execution_id: str, outcome: ExecutionView | Running) -> Response:
        if isinstance(outcome, Running):
            return JSONResponse(
                {"executionId": execution_id, "status": "running"}, headers=NO_STORE
            )
        code = await to_thread.run_sync(self._code, execution_id)
        return JSONResponse(public_view(outcome, code), headers=NO_STORE)

    # -- a signed-in person ---------------------------------------------------------------

    async def shown_to(self, person: SignedIn, execution_id: str, call: int) -> CallShown:
        """The call as `person` may see it (expired first when overdue), or the refusal."""
        store = self.runtime.engine.store
        shown = await to_thread.run_sync(call_shown, store, execution_id, call)
        if shown is None:
            raise Refusal(404, "not_found", f"No call {call} of execution {execution_id[:64]}.")
        approver = person.approver
        if not await to_thread.run_sync(
            self.runtime.people.may_decide, approver.id, shown.principal
        ):
            raise Refusal(
                403,
                "forbidden",
                f"{approver.name} does not approve calls of {shown.principal}.",
                "Ask the operator: lockgate approvers add ... --principal " + shown.principal,
            )
        if shown.waiting:
            # Reading it through the engine expires it when its deadline has passed.
            await to_thread.run_sync(self.runtime.engine.get, execution_id, shown.principal)
            shown = await to_thread.run_sync(call_shown, store, execution_id, call) or shown
        return shown

    async def _person_get(self, execution_id: str, call: int, request: Request) -> Response:
        self.access.refuse_link_tokens(request)
        person = await self.people.require(request)
        shown = await self.shown_to(person, execution_id, call)
        return JSONResponse(shown.as_json(), headers=NO_STORE)

    async def _person_decide(self, execution_id: str, call: int, request: Request) -> Response:
        self.access.refuse_link_tokens(request)
        person = await self.people.require(request)
        self.people.check_posted(request)
        try:
            body = PersonDecisionBody.model_validate_json(await self.access.read_body(request))
        except ValidationError:
            raise Refusal(
                400,
                "invalid_input",
                'The body must be {"action": "accept" | "decline", "digest": "<the digest the '
                'page shows>"} (and optionally "grant": {"calls": N} or {"untilEnd": true}).',
            ) from None
        door = Door.INBOX if body.door == "inbox" else Door.APPROVAL_PAGE
        decision = Decision(
            execution_id,
            Action(body.action),
            call=call,
            content={"grant": body.grant} if body.grant is not None else None,
            shown=body.digest,
        )
        outcome = await self.decisions.decide(Person(person, door), decision)
        return await self._outcome(execution_id, outcome)

    async def _page(self, execution_id: str, call: int, request: Request) -> Response:
        person = await self.people.signed_in(request)
        here = f"/approve/{quote(execution_id)}/{call}"
        if person is None:
            return RedirectResponse(f"/signin?next={quote(here, safe='')}", status_code=303)
        csrf = csrf_token(self.people.cookie(request) or "")
        try:
            shown = await self.shown_to(person, execution_id, call)
        except Refusal as exc:
            return notice(
                exc.status,
                "You cannot decide this call" if exc.status == 403 else "No such call",
                exc.message,
                exc.hint or "Check the link.",
                link=("/approvals", "Open your approvals"),
                person=person,
                csrf=csrf,
            )
        if not shown.waiting:
            view = await to_thread.run_sync(self.runtime.engine.view, execution_id)
            return settled_notice(str(view.status), person=person, csrf=csrf)
        arguments = json.dumps(shown.arguments, indent=2, ensure_ascii=False)
        data = {
            **shown.as_json(),
            "csrf": csrf,
            "decideUrl": f"/api/approvals/{quote(execution_id)}/{call}",
        }
        return render(
            200,
            "approve.html",
            title=f"Approve tools.{shown.tool}?",
            call=shown.as_json(),
            arguments=arguments,
            arguments_bytes=len(json.dumps(shown.arguments, ensure_ascii=False).encode()),
            expires_text=expiry_text(shown.expires_at),
            data=data,
            person=person,
            csrf=csrf,
        )

    def routes(self) -> list[Route]:
        async def get_execution(request: Request) -> Response:
            return await answer(self._get(request.path_params["execution_id"], request))

        async def resume(request: Request) -> Response:
            return await answer(self._resume(request.path_params["execution_id"], request))

        async def person_call(request: Request) -> Response:
            eid, call = request.path_params["execution_id"], request.path_params["call"]
            if request.method == "POST":
                return await answer(self._person_decide(eid, call, request))
            return await answer(self._person_get(eid, call, request))

        async def page(request: Request) -> Response:
            try:
                return await self._page(
                    request.path_params["execution_id"], request.path_params["call"], request
                )
            except Exception:
                log.exception("the approval page failed")
                return failure_notice()

        async def old_link(request: Request) -> Response:
            return notice(
                404,
                "This approval link is from an earlier version",
                "Approval links no longer carry a credential; this one names no call.",
                "Sign in and open your approvals to find the call.",
                link=("/approvals", "Open your approvals"),
            )

        return [
            Route("/api/executions/{execution_id}", get_execution, methods=["GET"]),
            Route("/api/executions/{execution_id}/resume", resume, methods=["POST"]),
            Route("/api/approvals/{execution_id}/{call:int}", person_call, methods=["GET", "POST"]),
            Route("/approve/{execution_id}/{call:int}", page, methods=["GET"]),
            Route("/approve/{token}", old_link, methods=["GET"]),
        ]
