"""The gate opens only for a person: nothing an agent holds decides its own call.

Tried as an attacker would, on a real `lockgate serve` over loopback with two principals, in
approval modes `browser` and `native`: bob's agent pauses a write and then uses everything
it was ever given (its API key, the waiting answer's `approvalUrl`, the parts of that URL)
through every door an HTTP client can reach: the resume API with the key, with the link's
parts as the header approval tokens used to travel in, with both; the people's decision
route; the inbox; the page. None decides: the write is never made, the call still waits,
and nothing any of those answers carries decides either. Then a signed-in approver of bob
decides it through the page's own API, and the audit names that person.
"""

from __future__ import annotations

from typing import Any

import httpx2
import pytest

from tests.support.people import call_of, links_base, signed_in
from tests.support.servers import (
    Deployment,
    create_key_directly,
    mcp_client,
    paused_write,
    run,
    structured,
    unique_key,
    writes_of,
)

pytest_plugins = ["tests.support.servers"]

pytestmark = pytest.mark.slow

ACCEPT = {"action": "accept"}


async def outcome(url: str, key: str, execution_id: str) -> dict[str, Any]:
    async with mcp_client(url, key, "2026-07-28") as client:
        return structured(await client.call_tool("resume", {"executionId": execution_id}))


@pytest.mark.parametrize("mode", ["browser", "native"])
def test_nothing_an_agent_holds_decides_its_own_call(deployment: Deployment, mode: str) -> None:
    server = deployment.start(LOCKGATE_APPROVAL_MODE=mode)
    alice = create_key_directly(deployment.database_url, "alice")
    bob = create_key_directly(deployment.database_url, "bob")
    base = links_base(server.base_url)
    note = unique_key()

    waiting = run(paused_write(server.url, bob, note))
    execution_id, url = waiting["executionId"], waiting["interaction"]["approvalUrl"]
    # The link names the call, on the server's own name; it carries nothing else.
    assert url == f"{base}/approve/{execution_id}/1"
    assert call_of(url) == (execution_id, 1)

    as_key = {"Authorization": f"Bearer {bob}"}
    # Whatever an old client would send as the link's token: its last parts.
    tokens = [url.rsplit("/approve/", 1)[1], url.rsplit("/", 1)[1], execution_id]
    seen: list[httpx2.Response] = []
    with httpx2.Client(base_url=base, timeout=30) as http:

        def send(method: str, path: str, **kwargs: Any) -> httpx2.Response:
            response = http.request(method, path, **kwargs)
            seen.append(response)
            return response

        resume = f"/api/executions/{execution_id}/resume"
        decide = f"/api/approvals/{execution_id}/1"
        # The agent's own key: refused in words, through the resume API.
        refused = send("POST", resume, json=ACCEPT, headers=as_key)
        assert refused.status_code == 403, refused.text
        assert f"approval mode {mode}" in refused.json()["error"]["message"]
        for token in tokens:
            for headers in (
                {"X-Approval-Token": token},
                {"X-Approval-Token": token, **as_key},
                {"X-Approval-Token": token, "Origin": base},
            ):
                answer = send("POST", resume, json=ACCEPT, headers=headers)
                assert answer.status_code == 401, answer.text
                assert "not a credential" in answer.json()["error"]["message"]
        # The people's decision route, the inbox and the page: none is a key's door.
        for headers in ({}, as_key, {**as_key, "Origin": base}):
            answer = send("POST", decide, json={**ACCEPT, "digest": "0" * 64}, headers=headers)
            assert answer.status_code == 401, answer.text
            assert answer.json()["error"]["code"] == "sign_in_required"
            listed = send("GET", "/api/approvals", headers=headers)
            assert listed.status_code == 401 and execution_id not in listed.text
            shown = send("GET", decide, headers=headers)
            assert shown.status_code == 401 and "digest" not in shown.json()
            page = send("GET", url, headers=headers)
            assert page.status_code == 303, page.text
            assert page.headers["location"].startswith("/signin?next=")
        # Another principal's key reaches none of it either.
        other = send("POST", resume, json=ACCEPT, headers={"Authorization": f"Bearer {alice}"})
        assert other.status_code == 404, other.text

    # Nothing decided; the call still waits, and no answer the agent got carries anything
    # that could (a session cookie, a token).
    assert writes_of(deployment, note) == []
    assert run(outcome(server.url, bob, execution_id))["status"] == "waiting_for_interaction"
    for response in seen:
        assert "set-cookie" not in response.headers, response.request.url
        assert "lockgate_person" not in response.text

    # A person who approves for bob decides it, through the page's own API.
    person = signed_in(deployment.database_url, base, "Bea", ["bob"])
    try:
        decided = person.approve(url)
        assert decided.status_code == 200, decided.text
        assert decided.json()["status"] == "completed"
    finally:
        person.close()
    assert len(writes_of(deployment, note)) == 1
    [record] = [
        line for line in deployment.audit_lines("bob") if line["executionId"] == execution_id
    ]
    assert (record["action"], record["door"], record["actor"]) == ("accept", "approval_page", "Bea")
    assert record["person"]["name"] == "Bea" and record["person"]["signedInWith"] == "passkey"
