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
from urllib.parse import quote

from anyio import to_thread
from fastapi import APIRouter, Depends
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from lockgate.machine.approval_audit import Door
from lockgate.machine.approval_modes import ApprovalModes
from lockgate.machine.engine import Action
from lockgate.machine.people import SignedIn
from lockgate.machine.runtime import Runtime
from lockgate.machine.views import ExecutionView
from lockgate.server.approval_access import ApprovalAccess
from lockgate.server.approval_answers import NO_STORE, Refusal, public_view
from lockgate.server.call_shown import CallShown, call_shown, page_url
from lockgate.server.decisions import Agent, Decision, Decisions, Person
from lockgate.server.http_api import ApiAuth, ProblemRoute, answer_head, refusals
from lockgate.server.http_models import (
    CallOut,
    ExecutionOut,
    ExecutionRunning,
    PersonDecisionBody,
    ResumeBody,
)
from lockgate.server.pages import expiry_text, failure_notice, notice, render, settled_notice
from lockgate.server.person_session import PersonAuth, csrf_token
from lockgate.server.runner import ExecutionRunner
from lockgate.server.shapes import Running

log = logging.getLogger("lockgate.approval")


#: What the key's resume and a person's decision answer to a body that is not one.
RESUME_SHAPE = 'The body must be {"action": "accept" | "decline" | "cancel"}.'
DECISION_SHAPE = (
    'The body must be {"action": "accept" | "decline", "digest": "<the digest the page '
    'shows>"} (and optionally "grant": {"calls": N} or {"untilEnd": true}).'
)


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

    async def _get(self, execution_id: str, principal: str) -> Response:
        view = await to_thread.run_sync(self.runtime.engine.get, execution_id, principal)
        code = await to_thread.run_sync(self._code, execution_id)
        return JSONResponse(public_view(view, code), headers=NO_STORE)

    async def _resume(self, execution_id: str, principal: str, body: ResumeBody) -> Response:
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

    async def _person_get(self, execution_id: str, call: int, person: SignedIn) -> Response:
        shown = await self.shown_to(person, execution_id, call)
        return JSONResponse(shown.as_json(), headers=NO_STORE)

    async def _person_decide(
        self, execution_id: str, call: int, person: SignedIn, body: PersonDecisionBody
    ) -> Response:
        door = Door.INBOX if body.door == "inbox" else Door.APPROVAL_PAGE
        decision = Decision(
            execution_id,
            Action(body.action),
            call=call,
            content={"grant": body.grant.model_dump()} if body.grant is not None else None,
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

    def router(self, auth: ApiAuth) -> APIRouter:
        """The JSON API: the principal's key on its own executions, a person on a call."""
        router = APIRouter(route_class=ProblemRoute)

        @router.get(
            "/api/executions/{execution_id}",
            response_model=ExecutionOut,
            responses=refusals([401, 404, 421, 429]),
            tags=["executions (API key)"],
            summary="The principal's own execution",
            operation_id="getExecution",
        )
        async def get_execution(
            execution_id: str, principal: str = Depends(auth.principal)
        ) -> Response:
            return await self._get(execution_id, principal)

        @router.post(
            "/api/executions/{execution_id}/resume",
            response_model=ExecutionOut | ExecutionRunning,
            responses=refusals(
                [400, 401, 403, 404, 409, 410, 413, 415, 421, 429], {400: RESUME_SHAPE}
            ),
            tags=["executions (API key)"],
            summary="Decline or cancel the call it waits on (accept: approval mode `model` only)",
            operation_id="resumeExecution",
        )
        async def resume(
            execution_id: str,
            body: ResumeBody,
            _json: None = Depends(auth.json_only),
            principal: str = Depends(auth.principal),
        ) -> Response:
            return await self._resume(execution_id, principal, body)

        @router.get(
            "/api/approvals/{execution_id}/{call:int}",
            response_model=CallOut,
            responses=refusals([401, 403, 404, 421]),
            tags=["approvals (a person)"],
            summary="A call, exactly as its page shows it, with its digest",
            operation_id="getCall",
        )
        async def person_call(
            execution_id: str, call: int, person: SignedIn = Depends(auth.person)
        ) -> Response:
            return await self._person_get(execution_id, call, person)

        @router.post(
            "/api/approvals/{execution_id}/{call:int}",
            response_model=ExecutionOut | ExecutionRunning,
            responses=refusals(
                [400, 401, 403, 404, 409, 410, 413, 415, 421, 429], {400: DECISION_SHAPE}
            ),
            tags=["approvals (a person)"],
            summary="Accept or decline a call (naming the digest of what was shown)",
            operation_id="decideCall",
        )
        async def person_decide(
            execution_id: str,
            call: int,
            body: PersonDecisionBody,
            person: SignedIn = Depends(auth.person),
            _posted: None = Depends(auth.posted),
        ) -> Response:
            return await self._person_decide(execution_id, call, person, body)

        return answer_head(router)

    def pages(self) -> list[Route]:
        """The approval page (HTML; not in the API's document)."""

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
            Route("/approve/{execution_id}/{call:int}", page, methods=["GET"]),
            Route("/approve/{token}", old_link, methods=["GET"]),
        ]
