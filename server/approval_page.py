"""The browser approval: a page at the approval URL and the small REST API behind it.

The approval URL carries a single-use token, `<id>-<mac>`, bound to one paused call and
signed with a server key (`server.approval_tokens`: nothing in the database opens it). The
page's POST sends the token in a custom header with a JSON body, which a cross-site form
cannot do (and a cross-site script cannot without a CORS preflight we never grant); an
Origin header, when present, must be this server's. The API also accepts a principal's Bearer key.

A token decides only the call it was minted for: once that call is settled (or the
execution moved on to another call) the link is refused, even if it was never used. Every
refusal is a JSON problem (API) or a short HTML page (browser), never a stack trace.

This module is the routes and what they decide; who may act, and which requests are taken,
is `server.approval_access`; the JSON answers are `server.approval_answers`, the HTML ones
`server.approval_html`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from typing import Literal

from anyio import to_thread
from pydantic import BaseModel, ConfigDict, JsonValue, ValidationError
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from lockgate.machine.approval_audit import Decider
from lockgate.machine.approval_modes import ApprovalMode, ApprovalModes, accept_refused
from lockgate.machine.db.approval_token_queries import ApprovalTokenUsed
from lockgate.machine.db.schema import ApprovalToken
from lockgate.machine.engine import Action
from lockgate.machine.errors import LockgateError
from lockgate.machine.runtime import Runtime
from lockgate.machine.views import ExecutionView
from lockgate.server.approval_access import TOKEN_HEADER, ApprovalAccess
from lockgate.server.approval_answers import (
    NO_STORE,
    Refusal,
    from_error,
    problem,
    public_view,
    refused,
)
from lockgate.server.approval_html import (
    approval_page,
    failure_notice,
    settled_notice,
    token_notice,
)
from lockgate.server.approval_tokens import USED, ApprovalTokens, TokenRefused
from lockgate.server.auth import RequestRate, current_key_id
from lockgate.server.deciders import by_key, by_link
from lockgate.server.keys import ApiKeys
from lockgate.server.runner import ExecutionRunner
from lockgate.server.shapes import Running

log = logging.getLogger("lockgate.approval")


class ResumeBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    action: Literal["accept", "decline", "cancel"]
    content: JsonValue = None


class ApprovalSurface:
    def __init__(
        self,
        runtime: Runtime,
        runner: ExecutionRunner,
        keys: ApiKeys,
        tokens: ApprovalTokens,
        *,
        rate: RequestRate | None = None,
    ) -> None:
        self.runtime, self.runner, self.tokens = runtime, runner, tokens
        self.access = ApprovalAccess(runtime, keys, tokens, rate)
        settings = runtime.settings
        self.modes = ApprovalModes.from_text(settings.approval_mode, settings.approval_modes)

    def approval_url(self, view: ExecutionView) -> str | None:
        """The link for the call a paused execution waits on: minted the first time an
        answer shows the call, the same link in every answer after (`ApprovalTokens.link`).
        It expires with the call's deadline, the expiry the page shows."""
        if view.pending is None or view.pending.deadline is None:
            return None
        token = self.tokens.link(
            view.id,
            view.pending.seq,
            view.principal_id,
            view.pending.deadline,
            key_id=current_key_id.get(),
            now=self.access.now(),
        )
        return f"{self.runtime.settings.base_url}/approve/{token}"

    def _code(self, execution_id: str) -> str:
        row = self.runtime.engine.store.executions.get(execution_id)
        return row.code if row is not None else ""

    async def _get(self, execution_id: str, request: Request) -> Response:
        principal, token_row = await self.access.authorize(request, execution_id)
        if token_row is not None:
            # A link reads the execution only while its call waits for a decision; after
            # that, what the code did is for the principal's key to see, not the link's.
            await to_thread.run_sync(self.access.still_pending, token_row)
        view = await to_thread.run_sync(self.runtime.engine.get, execution_id, principal)
        code = await to_thread.run_sync(self._code, execution_id)
        return JSONResponse(public_view(view, code), headers=NO_STORE)

    async def _resume(self, execution_id: str, request: Request) -> Response:
        self.access.check_decision(request)
        principal, token_row = await self.access.authorize(request, execution_id)
        try:
            body = ResumeBody.model_validate_json(await self.access.read_body(request))
        except ValidationError:
            raise Refusal(
                400,
                "invalid_input",
                'The body must be {"action": "accept" | "decline" | "cancel"}.',
            ) from None
        if token_row is None and body.action == "accept":
            # The key is the agent's credential: where a person must accept, it cannot.
            mode = self.modes.for_principal(principal)
            if mode is not ApprovalMode.MODEL:
                refusal = accept_refused(mode, None)
                raise Refusal(403, "forbidden", refusal.message, refusal.hint)
        if token_row is None:
            outcome = await self.runner.resume(
                principal,
                execution_id,
                Action(body.action),
                body.content,
                decided_by=by_key(principal),
            )
        else:
            outcome = await self._decide_by_link(
                token_row,
                request.headers.get(TOKEN_HEADER, ""),
                body,
                by_link(token_row.principal_id),
            )
        if isinstance(outcome, Running):
            return JSONResponse(
                {"executionId": execution_id, "status": "running"}, headers=NO_STORE
            )
        code = await to_thread.run_sync(self._code, execution_id)
        return JSONResponse(public_view(outcome, code), headers=NO_STORE)

    async def decide_with_token(
        self,
        token: str,
        principal: str,
        action: Action,
        decided_by: Decider,
        content: JsonValue = None,
    ) -> ExecutionView | Running:
        """Decide the call an approval link was made for, as the page does (once only), for
        a door that carries the link's token itself (a 2026-07-28 client's retry)."""
        row = await to_thread.run_sync(self.access.check, token, None)
        if row.principal_id != principal:
            raise TokenRefused("unknown", "This approval belongs to someone else.")
        body = ResumeBody(action=action.value, content=content)
        return await self._decide_by_link(row, token, body, decided_by)

    async def _decide_by_link(
        self, row: ApprovalToken, token: str, body: ResumeBody, decided_by: Decider
    ) -> ExecutionView | Running:
        """Decide the link's call, using the link up in the decision's own transaction:
        a crash before that commits leaves both undone (the link still works), and of two
        clicks only one decides (the other is told the link was used)."""
        try:
            await to_thread.run_sync(self.access.still_pending, row)
            return await self.runner.resume(
                row.principal_id,
                row.execution_id,
                Action(body.action),
                body.content,
                expected_call=row.call_seq,
                writes=[self.tokens.use(row, now=self.access.now())],
                decided_by=decided_by,
            )
        except ApprovalTokenUsed:
            raise TokenRefused("used", USED) from None
        except (Refusal, LockgateError):
            # Refused for another reason, e.g. the call was settled meanwhile: if that was
            # another click with this same link, what the approver needs to hear is that
            # the link was used.
            await to_thread.run_sync(self._refuse_if_used, token, row.execution_id)
            raise

    def _refuse_if_used(self, token: str, execution_id: str) -> None:
        try:
            self.access.check(token, execution_id)
        except TokenRefused as exc:
            if exc.reason == "used":
                raise
        # Any other state of the link leaves the first refusal to stand.

    async def _page(self, token: str) -> HTMLResponse:
        try:
            row = await to_thread.run_sync(self.access.check, token, None)
        except TokenRefused as exc:
            return token_notice(exc.reason)
        try:
            view = await to_thread.run_sync(
                self.runtime.engine.get, row.execution_id, row.principal_id
            )
        except LockgateError:
            return token_notice("unknown")
        if view.pending is None or view.pending.seq != row.call_seq:
            return settled_notice(view.status)
        code = await to_thread.run_sync(self._code, row.execution_id)
        return approval_page(public_view(view, code), token)

    def routes(self) -> list[Route]:
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
                return problem(
                    500, "internal_error", "The server failed to handle this request; retry."
                )

        async def get_execution(request: Request) -> Response:
            return await answer(self._get(request.path_params["execution_id"], request))

        async def resume(request: Request) -> Response:
            return await answer(self._resume(request.path_params["execution_id"], request))

        async def page(request: Request) -> Response:
            try:
                return await self._page(request.path_params["token"])
            except Exception:
                log.exception("the approval page failed")
                return failure_notice()

        return [
            Route("/api/executions/{execution_id}", get_execution, methods=["GET"]),
            Route("/api/executions/{execution_id}/resume", resume, methods=["POST"]),
            Route("/approve/{token}", page, methods=["GET"]),
        ]
