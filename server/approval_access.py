"""The HTTP API's checks on a principal's request (its API key), the key-side twin of
`server/person_session.py`: who the key belongs to, the request budget, the body's media type
(its size is bounded for every route by `BodyLimit`, `server/http_guards.py`).

A key reads its own executions and may give up its own calls (decline, cancel): it is the
agent's credential. It accepts only where the operator chose approval mode `model`
(`server/decisions.py` decides that, for every door). A header that once carried an approval
link's token is refused in words: a link authorises nothing.
"""

from __future__ import annotations

from anyio import to_thread
from starlette.requests import Request

from lockgate.machine.runtime import Runtime
from lockgate.server.approval_answers import Refusal
from lockgate.server.auth import RequestRate, bearer_token
from lockgate.server.keys import ApiKeys

#: The header approval links' tokens were sent in, before links stopped being credentials.
OLD_TOKEN_HEADER = "x-approval-token"


class ApprovalAccess:
    """The API's checks on a keyed request, on the runtime's settings."""

    def __init__(self, runtime: Runtime, keys: ApiKeys, rate: RequestRate | None) -> None:
        self.runtime, self.keys = runtime, keys
        #: The same per-principal request budget as /mcp.
        self.rate = rate

    def refuse_link_tokens(self, request: Request) -> None:
        if request.headers.get(OLD_TOKEN_HEADER):
            raise Refusal(
                401,
                "unauthorized",
                "An approval link is not a credential: it names a call, and only a person who "
                "signed in decides it.",
                f"Open the link in a browser and sign in ({self.runtime.settings.base_url}"
                "/signin), or send the principal's API key (Authorization: Bearer ...).",
            )

    async def key_principal(self, request: Request) -> str:
        """The Bearer key's principal (admitted under its rate), or the refusal in words."""
        self.refuse_link_tokens(request)
        key = bearer_token(request.scope)
        principal = await to_thread.run_sync(self.keys.authenticate, key) if key else None
        if principal is None:
            raise Refusal(
                401,
                "unauthorized",
                "The API key is not valid (unknown or revoked)."
                if key
                else "Send the principal's API key (Authorization: Bearer ...).",
                headers={
                    "WWW-Authenticate": 'Bearer realm="lockgate"'
                    + (', error="invalid_token"' if key else "")
                },
            )
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
        return principal

    @staticmethod
    def check_json(request: Request) -> None:
        media = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if media != "application/json":
            raise Refusal(415, "invalid_input", "Send the body as application/json.")
