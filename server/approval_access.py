"""Who may act on the approval API, and whether this request may reach a decision at all.

Two credentials open the API: the approval token, sent in the `X-Approval-Token` header
(a cross-site form cannot set a header, and a cross-site script cannot without a CORS
preflight we never grant), or a principal's Bearer key. Either way the principal is held
to the same request budget as /mcp. A token decides only the call it was minted for.

A decision must come as JSON and, when the browser names its origin, from this server's
own page (`check_decision`, before any credential is looked at); its body is read only up
to the request limit. Every check refuses with a `Refusal`, which the routes answer as a
JSON problem.
"""

from __future__ import annotations

from datetime import datetime
from urllib.parse import urlsplit

from anyio import to_thread
from starlette.requests import Request

from lockgate.machine.db.schema import ApprovalToken
from lockgate.machine.runtime import Runtime
from lockgate.server.approval_answers import Refusal, token_refusal
from lockgate.server.approval_tokens import ApprovalTokens, TokenRefused
from lockgate.server.auth import RequestRate, bearer_token
from lockgate.server.keys import ApiKeys
from lockgate.spec import ExecutionStatus as E

TOKEN_HEADER = "x-approval-token"


def _media_type(request: Request) -> str:
    return request.headers.get("content-type", "").split(";")[0].strip().lower()


def _origin_of(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}".lower()


class ApprovalAccess:
    """The approval API's checks on a request, on the runtime's clock and settings."""

    def __init__(
        self,
        runtime: Runtime,
        keys: ApiKeys,
        tokens: ApprovalTokens,
        rate: RequestRate | None,
    ) -> None:
        self.runtime, self.keys, self.tokens = runtime, keys, tokens
        #: The same per-principal request budget as /mcp.
        self.rate = rate

    def now(self) -> datetime:
        """The runtime's clock: links expire on the same clock as the calls' deadlines."""
        return self.runtime.engine.clock()

    def check(self, token: str, execution_id: str | None) -> ApprovalToken:
        return self.tokens.check(token, execution_id, now=self.now())

    def check_decision(self, request: Request) -> None:
        """A decision comes as JSON, and from this server's own page when the browser says
        where it comes from."""
        origin = request.headers.get("origin")
        if origin is not None and not self._same_origin(request, origin):
            raise Refusal(403, "forbidden", "Cross-site requests are refused.")
        if _media_type(request) != "application/json":
            raise Refusal(415, "invalid_input", "Send the decision as application/json.")

    def _same_origin(self, request: Request, origin: str) -> bool:
        """The page's own origin: as the request reached us, or as configured publicly
        (behind a TLS-terminating proxy the two differ in scheme)."""
        own = {f"{request.url.scheme}://{request.headers.get('host', '')}".lower()}
        if self.runtime.settings.public_url:
            own.add(_origin_of(self.runtime.settings.public_url))
        return origin.rstrip("/").lower() in own

    async def authorize(
        self, request: Request, execution_id: str
    ) -> tuple[str, ApprovalToken | None]:
        """Who may act: the approval token's principal (and its row), or the Bearer key's."""
        token = request.headers.get(TOKEN_HEADER)
        if token:
            try:
                row = await to_thread.run_sync(self.check, token, execution_id)
            except TokenRefused as exc:
                raise token_refusal(exc) from None
            self._admit(row.principal_id)
            return row.principal_id, row
        return await self.key_principal(request), None

    async def key_principal(self, request: Request) -> str:
        """The Bearer key's principal (admitted under its rate), or the refusal in words."""
        key = bearer_token(request.scope)
        principal = await to_thread.run_sync(self.keys.authenticate, key) if key else None
        if principal is None:
            raise Refusal(
                401,
                "unauthorized",
                "The API key is not valid (unknown or revoked)."
                if key
                else "Send the approval token (X-Approval-Token) or an API key "
                "(Authorization: Bearer ...).",
                headers={
                    "WWW-Authenticate": 'Bearer realm="lockgate"'
                    + (', error="invalid_token"' if key else "")
                },
            )
        self._admit(principal)
        return principal

    def _admit(self, principal: str) -> None:
        wait = self.rate.admit(principal) if self.rate is not None else None
        if wait is not None:
            raise Refusal(
                429,
                "limit_reached",
                "Too many requests for this principal in the last minute (the limit, "
                "LOCKGATE_MAX_REQUESTS_PER_MINUTE).",
                f"Retry in {wait:.0f} s.",
                headers={"Retry-After": str(round(wait))},
            )

    async def read_body(self, request: Request) -> bytes:
        limit = self.runtime.settings.max_request_bytes
        declared = request.headers.get("content-length", "")
        too_large = Refusal(413, "invalid_input", f"The body is larger than {limit} bytes.")
        if declared.isdigit() and int(declared) > limit:
            raise too_large
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise too_large
        return bytes(body)

    def still_pending(self, row: ApprovalToken) -> None:
        """A token decides the call it was minted for, and no later one."""
        view = self.runtime.engine.get(row.execution_id, row.principal_id)
        if view.pending is not None and view.pending.seq == row.call_seq:
            return
        if view.status == E.EXPIRED:
            raise Refusal(
                410,
                "expired",
                "This request expired before a decision arrived; the tool call was not made.",
                "Ask the agent to run the code again.",
            )
        raise Refusal(
            409,
            "already_settled",
            f"The tool call this link was for is no longer waiting for a decision "
            f"(the execution is {view.status}).",
            "Fetch the execution to see its outcome.",
        )
