"""The approvals inbox, for a signed-in person: every call waiting on the decision of the
principals they approve for, newest first, and the decisions made lately.

`GET /api/approvals` answers it as JSON and `GET /approvals` is the page; both only to a
signed-in approver (an API key gets a refusal in words: nothing a key can read carries
anything that decides). A call whose arguments and code are short enough is shown whole
and decided from the list, with the digest of what was shown; a longer one is decided on
its own page, which shows everything.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

from anyio import to_thread
from fastapi import APIRouter, Depends
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from lockgate.machine.approval_audit import exported
from lockgate.machine.errors import LockgateError
from lockgate.machine.people import SignedIn
from lockgate.server.approval_answers import NO_STORE
from lockgate.server.approval_page import ApprovalSurface
from lockgate.server.call_shown import call_shown, page_url
from lockgate.server.http_api import ApiAuth, ProblemRoute, answer_head, refusals
from lockgate.server.http_models import Inbox
from lockgate.server.pages import render
from lockgate.server.person_session import csrf_token

#: The most waiting calls, and decided ones, one answer lists.
LISTED = 100
DECIDED = 20
#: Arguments and code up to this size are shown whole in the list (and decided there).
SHOWN_WHOLE_BYTES = 16 * 1024


class ApprovalInbox:
    def __init__(self, approvals: ApprovalSurface) -> None:
        self.approvals = approvals
        self.runtime = approvals.runtime

    def listing(self, person: SignedIn) -> dict[str, Any]:
        """What waits for `person`'s decision, and what was decided lately."""
        engine = self.runtime.engine
        store = engine.store
        principals = self.runtime.people.principals_of(person.approver.id)
        base = self.runtime.settings.base_url
        waiting: list[dict[str, Any]] = []
        for execution_id, principal in store.inbox.waiting(principals, LISTED):
            try:
                view = engine.get(execution_id, principal)  # expires it when overdue
            except LockgateError:
                continue
            if view.pending is None:
                continue  # decided or expired since it was listed
            shown = call_shown(store, execution_id, view.pending.seq)
            if shown is None or not shown.waiting:
                continue
            size = len(json.dumps(shown.arguments, ensure_ascii=False).encode()) + len(
                shown.code.encode("utf-8", "surrogatepass")
            )
            whole = size <= SHOWN_WHOLE_BYTES
            item = shown.as_json()
            if not whole:
                item.pop("arguments")
                item.pop("code")
                item.pop("digest")
            item["shownWhole"] = whole
            item["pageUrl"] = page_url(base, execution_id, shown.call)
            item["decideUrl"] = f"/api/approvals/{quote(execution_id)}/{shown.call}"
            waiting.append(item)
        decided = [
            exported(
                execution_id=call.execution_id,
                principal_id=owner,
                seq=call.seq,
                tool=call.tool,
                decision=call.decision,
                decided_at=call.decided_at,
            )
            for call, owner in store.audit_export.recent(principals, DECIDED)
        ]
        return {
            "approver": person.approver.name,
            "principals": principals if principals is not None else "*",
            "waiting": waiting,
            "decided": decided,
        }

    async def _api(self, person: SignedIn) -> Response:
        body = await to_thread.run_sync(self.listing, person)
        return JSONResponse(body, headers=NO_STORE)

    async def _page(self, request: Request) -> Response:
        auth = self.approvals.people
        person = await auth.signed_in(request)
        if person is None:
            return RedirectResponse("/signin?next=%2Fapprovals", status_code=303)
        principals = await to_thread.run_sync(self.runtime.people.principals_of, person.approver.id)
        scope = "every principal" if principals is None else ", ".join(principals) or "nobody"
        csrf = csrf_token(auth.cookie(request) or "")
        return render(
            200,
            "inbox.html",
            title="Approvals",
            scope=scope,
            data={"csrf": csrf},
            person=person,
            csrf=csrf,
        )

    def router(self, auth: ApiAuth) -> APIRouter:
        router = APIRouter(route_class=ProblemRoute)

        @router.get(
            "/api/approvals",
            response_model=Inbox,
            responses=refusals([401, 421]),
            tags=["approvals (a person)"],
            summary="What waits for the signed-in person's decision, and what was decided lately",
            operation_id="inbox",
        )
        async def api(person: SignedIn = Depends(auth.person)) -> Response:
            return await self._api(person)

        return answer_head(router)

    def pages(self) -> list[Route]:
        """The inbox page (HTML; not in the API's document)."""

        async def page(request: Request) -> Response:
            return await self._page(request)

        return [Route("/approvals", page, methods=["GET"])]
