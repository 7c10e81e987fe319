"""Who may call: Bearer API keys in front of /mcp, sessions bound to their principal, and
executions owned by principals. Over real HTTP, in both protocol eras."""

from __future__ import annotations

from collections.abc import Iterator

import httpx2
import pytest
from mcp import MCPError

from tests.support.servers import (
    MODES,
    Fleet,
    RawMCP,
    SharedServer,
    mcp_client,
    pause,
    rpc_body,
    run,
    structured,
    unique_key,
    writes_of,
)

#: The fixtures (`shared`, `short`, `deployment`, ...) are registered once for the session.
pytest_plugins = ["tests.support.servers"]

pytestmark = pytest.mark.slow
both_modes = pytest.mark.parametrize("mode", MODES)

UNAUTHORIZED = -32004


def only_mcp_error(group: BaseException) -> MCPError:
    """The one MCPError inside the client's (nested) exception groups."""
    while isinstance(group, BaseExceptionGroup):
        assert len(group.exceptions) == 1, group.exceptions
        group = group.exceptions[0]
    assert isinstance(group, MCPError), repr(group)
    return group


def client_refusal(url: str, key: str | None, mode: str) -> MCPError:
    """What the real client raises when the server refuses its key."""

    async def scenario() -> None:
        async with mcp_client(url, key, mode) as client:
            await client.list_tools()

    try:
        run(scenario())
    except (MCPError, ExceptionGroup) as raised:
        return only_mcp_error(raised)
    pytest.fail("the client was served without a valid key")


def assert_401(response: httpx2.Response, error: str) -> str:
    assert response.status_code == 401, response.text
    challenge = response.headers["www-authenticate"]
    assert challenge.startswith("Bearer "), challenge
    assert f'error="{error}"' in challenge
    body = response.json()
    assert body["jsonrpc"] == "2.0"
    assert body["error"]["code"] == UNAUTHORIZED
    message: str = body["error"]["message"]
    return message


@pytest.fixture
def http() -> Iterator[httpx2.Client]:
    with httpx2.Client(timeout=30.0) as client:
        yield client


@both_modes
def test_no_key_is_refused_with_a_challenge(
    shared: SharedServer, mode: str, http: httpx2.Client
) -> None:
    raw = RawMCP(http, shared.url, None, mode)
    message = assert_401(raw.request("tools/list"), "invalid_request")
    assert "Authorization: Bearer" in message

    refused = client_refusal(shared.url, None, mode)
    assert refused.code == UNAUTHORIZED
    assert "Bearer" in refused.message


@both_modes
def test_a_wrong_key_is_refused(shared: SharedServer, mode: str, http: httpx2.Client) -> None:
    for wrong in ("lg_" + "x" * 43, "not-even-a-lockgate-key", shared.alice + "x"):
        raw = RawMCP(http, shared.url, wrong, mode)
        message = assert_401(raw.request("tools/list"), "invalid_token")
        assert "not valid" in message
        assert wrong not in message
    refused = client_refusal(shared.url, "lg_" + "x" * 43, mode)
    assert refused.code == UNAUTHORIZED


@pytest.fixture(scope="module")
def revoked_key(fleet: Fleet) -> str:
    """A key made and then revoked with the CLI, checked to work in between."""
    deployment, key = fleet.shared.deployment, fleet.carol
    with httpx2.Client(timeout=30.0) as http:
        assert RawMCP(http, fleet.shared.url, key.secret, "legacy").initialize().status_code == 200
        deployment.revoke_key(key.id)
    return key.secret


@both_modes
def test_a_revoked_key_is_refused(
    shared: SharedServer, mode: str, http: httpx2.Client, revoked_key: str
) -> None:
    raw = RawMCP(http, shared.url, revoked_key, mode)
    message = assert_401(raw.request("tools/list"), "invalid_token")
    assert "revoked" in message
    assert client_refusal(shared.url, revoked_key, mode).code == UNAUTHORIZED


def test_another_principals_session_is_not_found(shared: SharedServer, http: httpx2.Client) -> None:
    """Sessions exist in the 2025 protocol only (2026-07-28 is stateless). Another
    principal's session is answered exactly like one that does not exist."""
    mode = "legacy"
    alice = RawMCP(http, shared.url, shared.alice, mode)
    assert alice.initialize().status_code == 200
    own = alice.request("tools/list")
    assert own.status_code == 200, own.text
    assert {t["name"] for t in rpc_body(own)["result"]["tools"]} >= {"execute", "resume"}

    bob = RawMCP(http, shared.url, shared.bob, mode)
    bob.session_id = alice.session_id  # bob presents alice's session
    for method, params in (
        ("tools/list", None),
        ("tools/call", {"name": "execute", "arguments": {"code": "1"}}),
    ):
        response = bob.request(method, params)
        assert response.status_code == 404, response.text
        bob.session_id = "0" * 32
        missing = bob.request(method, params)
        bob.session_id = alice.session_id
        assert missing.status_code == 404, missing.text
        assert response.json() == missing.json()
        assert response.json()["error"]["code"] == -32600
    # The refusal did not hurt alice's session.
    assert alice.request("tools/list").status_code == 200


@both_modes
def test_bob_can_neither_resume_nor_see_alices_execution(shared: SharedServer, mode: str) -> None:
    key = unique_key()

    async def scenario() -> None:
        async with mcp_client(shared.url, shared.alice, mode) as alice:
            execution_id = (await pause(alice, key))["executionId"]
            async with mcp_client(shared.url, shared.bob, mode) as bob:
                for arguments in (
                    {"executionId": execution_id, "action": "accept"},
                    {"executionId": execution_id, "action": "cancel"},
                    {"executionId": execution_id},
                ):
                    result = await bob.call_tool("resume", arguments)
                    body = structured(result)
                    assert result.is_error, body
                    # Exactly what a missing execution gets: no existence oracle.
                    assert body["status"] == "execution_not_found", body
                    assert body["error"]["code"] == "not_found"
                    assert "another principal" not in body["error"]["message"]
                    assert "result" not in body and "interaction" not in body
            assert writes_of(shared.deployment, key) == []

            # Untouched by bob: alice still decides.
            result = await alice.call_tool(
                "resume", {"executionId": execution_id, "action": "accept"}
            )
            assert structured(result)["status"] == "completed", structured(result)
        assert [w["principal_id"] for w in writes_of(shared.deployment, key)] == ["alice"]

    run(scenario())
