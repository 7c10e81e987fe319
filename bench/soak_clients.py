"""The soak's clients: each one Python SDK session (a new one when the SDK gives up on it),
doing a random mix of what agents and people do, and keeping its own log of every request.

Operations, each on a note of its own: `approve` (execute a gated write, accept it),
`decline` and `cancel` (the code catches the refusal), `browser` (a signed-in person accepts
the call the answer's approval link names, through the page's API: the call as shown, then
the decision naming its digest; then `resume` waits for the result) and `read` (a call the
policy runs at once). A step that fails (a stream cut by a kill, an instance down) is
retried as a robust client would: `execute` with its idempotency key attaches to the
execution an earlier attempt started, and a decision sent again answers the same outcome
(or, for the person, that the call was already decided).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from lockgate.machine.lost_report import REQUEST_LOST
from lockgate.server.person_session import csrf_token

OPERATIONS = ("approve", "decline", "cancel", "browser", "read")
#: A request not answered (nor failed) within this is hung: it must never happen.
PATIENCE_SECS = 100.0
#: Attempts at one step before the operation is given up (and counted).
ATTEMPTS = 8


def gated(note: str) -> str:
    """A write that needs approval; a refusal is caught by the code."""
    return (
        "try:\n"
        f"    outcome = {{'written': tools.notes.write(key={note!r}, text='soak')}}\n"
        "except PermissionError as exc:\n"
        "    outcome = {'refused': str(exc)}\n"
        "outcome\n"
    )


@dataclass
class ClientLog:
    """What one client saw, request by request, and what it asked for."""

    requests: Counter[str] = field(default_factory=Counter)
    #: note -> the operation and the final outcome status (or "given up").
    operations: dict[str, tuple[str, str]] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)


class GiveUp(Exception):
    pass


@dataclass(frozen=True)
class Person:
    """The person who approves on the page: the session cookie their sign-in set (for a
    public URL on http, so without the `__Host-` prefix)."""

    cookie: str

    def headers(self, origin: str) -> dict[str, str]:
        """What the page's script sends with a decision: the cookie, its CSRF token, the
        page's own origin."""
        return {
            "Cookie": f"lockgate_person={self.cookie}",
            "X-CSRF-Token": csrf_token(self.cookie),
            "Origin": origin,
        }


class SoakClient:
    def __init__(
        self, n: int, url: str, base_url: str, key: str, seed: int, person: Person
    ) -> None:
        self.n, self.url, self.base_url, self.key = n, url, base_url, key
        self.person = person
        self.rng = random.Random(seed * 1000 + n)
        self.log = ClientLog()
        self._client: Client | None = None
        self._http: httpx2.AsyncClient | None = None

    async def _open(self) -> Client:
        if self._client is None:
            self._http = httpx2.AsyncClient(
                headers={"Authorization": f"Bearer {self.key}"}, timeout=30.0
            )
            client = Client(streamable_http_client(self.url, http_client=self._http), mode="legacy")
            await client.__aenter__()
            self._client = client
        return self._client

    async def close(self) -> None:
        client, http = self._client, self._http
        self._client = self._http = None
        if client is not None:
            with contextlib.suppress(BaseException):
                await client.__aexit__(None, None, None)
        if http is not None:
            await http.aclose()

    async def request(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """One `tools/call`, counted: answered, reported (-32010), failed or hung."""
        self.log.requests["sent"] += 1
        try:
            client = await self._open()
            result = await asyncio.wait_for(client.call_tool(tool, arguments), PATIENCE_SECS)
        except TimeoutError:
            self.log.requests["hung"] += 1
            self.log.lines.append(f"hung: {tool} {arguments}")
            await self.close()
            raise GiveUp() from None
        except MCPError as error:
            kind = "reported" if error.code == REQUEST_LOST else "failed"
            self.log.requests[kind] += 1
            self.log.lines.append(f"{kind}: {tool}: {error.code} {error}")
            await self.close()
            raise GiveUp() from None
        except Exception as error:
            self.log.requests["failed"] += 1
            self.log.lines.append(f"failed: {tool}: {type(error).__name__}: {error}")
            await self.close()
            raise GiveUp() from None
        self.log.requests["answered"] += 1
        content = result.structured_content
        if result.is_error:
            self.log.lines.append(f"refused: {tool}: {content}")
        if not isinstance(content, dict):
            self.log.lines.append(f"unstructured: {tool}: {result}")
            raise GiveUp()
        return content

    async def retried(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        for _ in range(ATTEMPTS):
            try:
                return await self.request(tool, arguments)
            except GiveUp:
                await asyncio.sleep(0.2)  # a client's pause before it tries again
        raise GiveUp()

    async def browser_accepts(self, paused: dict[str, Any]) -> None:
        """The person opens the call the link names and accepts what it shows."""
        # `<base>/approve/<execution>/<call>`: the link names the call, and authorises nothing.
        execution_id, call = paused["interaction"]["approvalUrl"].rsplit("/", 2)[-2:]
        assert execution_id == paused["executionId"], paused
        api = f"{self.base_url}/api/approvals/{execution_id}/{call}"
        headers = self.person.headers(self.base_url)
        for _ in range(ATTEMPTS):
            try:
                async with httpx2.AsyncClient(timeout=30.0) as http:
                    shown = await http.get(api, headers={"Cookie": headers["Cookie"]})
                    answer = shown
                    if shown.status_code == 200:
                        digest = shown.json()["digest"]
                        body = {"action": "accept", "digest": digest, "door": "page"}
                        answer = await http.post(api, headers=headers, json=body)
                if answer.status_code in (200, 409):
                    # Decided now, or (409, already settled) by an earlier try whose answer
                    # was lost: the resume that follows says which.
                    return
                if answer.status_code < 500:
                    # Refused (not signed in, not this principal's approver, ...): a broken
                    # set-up, never something a retry mends.
                    self.log.lines.append(f"person refused: {answer.status_code} {answer.text}")
                    raise GiveUp()
            except httpx2.HTTPError:
                pass
            await asyncio.sleep(0.2)
        raise GiveUp()

    async def operation(self, op: str, note: str) -> str:
        if op == "read":
            done = await self.retried("execute", {"code": "tools.notes.list()"})
            return str(done.get("executionStatus") or done["status"])
        view = await self.retried("execute", {"code": gated(note), "idempotencyKey": note})
        if view["status"] == "waiting_for_interaction":
            target = {"executionId": view["executionId"]}
            if op == "browser":
                await self.browser_accepts(view)
                view = await self.retried("resume", target)
            else:
                action = {"approve": "accept"}.get(op, op)
                view = await self.retried("resume", {**target, "action": action})
        while view["status"] in ("running", "pending"):
            view = await self.retried("resume", {"executionId": view["executionId"]})
        # An execution that ended without a result (interrupted, expired) answers an error
        # whose `executionStatus` says which.
        return str(view.get("executionStatus") or view["status"])

    async def run(self, until: float) -> ClientLog:
        count = 0
        while time.monotonic() < until:
            op = self.rng.choice(OPERATIONS)
            note = f"soak-{self.n}-{count}"
            count += 1
            try:
                status = await self.operation(op, note)
            except GiveUp:
                status = "given up"
            self.log.operations[note] = (op, status)
        await self.close()
        return self.log
