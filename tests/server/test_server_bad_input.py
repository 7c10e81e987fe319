"""Bad input over raw HTTP: answered with a clear status and JSON-RPC error (or an isError
tool result), never a 500, never a crash. After each case the server still answers.

The shared server runs with LOCKGATE_MAX_CODE_CHARS=2000 and LOCKGATE_MAX_REQUEST_BYTES=65536.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest

from tests.support.servers import (
    MODERN,
    MODES,
    RawMCP,
    SharedServer,
    rpc_body,
)

#: The fixtures (`shared`, `short`, `deployment`, ...) are registered once for the session.
pytest_plugins = ["tests.support.servers"]

pytestmark = [pytest.mark.slow, pytest.mark.parametrize("mode", MODES)]

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
INVALID_PARAMS = -32602
METHOD_NOT_FOUND = -32601


@pytest.fixture
def raw(shared: SharedServer, mode: str) -> Iterator[RawMCP]:
    with httpx2.Client(timeout=30.0) as http:
        yield RawMCP(http, shared.url, shared.alice, mode)
        # Whatever the case sent, the server is alive and serving.
        assert shared.server.exited() is None, shared.server.output()
        health = http.get(f"{shared.base_url}/healthz")
        assert health.status_code == 200
        assert health.json() == {"status": "ok"}


def json_rpc_error(response: httpx2.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, (response.status_code, response.text)
    body = rpc_body(response)
    assert body["jsonrpc"] == "2.0"
    error: dict[str, Any] = body["error"]
    assert isinstance(error["code"], int) and error["message"]
    return error


def tool_error(response: httpx2.Response) -> dict[str, Any]:
    """A tools/call refused as a tool result (isError), with a stable code and a message."""
    assert response.status_code == 200, (response.status_code, response.text)
    result = rpc_body(response)["result"]
    assert result["isError"] is True, result
    structured: dict[str, Any] = result["structuredContent"]
    assert structured["status"] == "error"
    assert structured["error"]["message"] in result["content"][0]["text"]
    error: dict[str, Any] = structured["error"]
    return error


def test_malformed_json(raw: RawMCP, mode: str) -> None:
    error = json_rpc_error(raw.post_raw(b'{"jsonrpc": "2.0", "id": 1, "method": '), 400)
    assert error["code"] == PARSE_ERROR
    assert "Parse error" in error["message"]


def test_not_a_json_rpc_object(raw: RawMCP, mode: str) -> None:
    for body in (b'{"foo": 1}', b"[1, 2]", b'"just a string"', b"42"):
        error = json_rpc_error(raw.post_raw(body), 400)
        assert error["code"] in (INVALID_REQUEST, INVALID_PARAMS), error


def test_unknown_method(raw: RawMCP, mode: str) -> None:
    # The 2025 protocol answers JSON-RPC errors with 200; 2026-07-28 maps -32601 to 404.
    response = raw.request("lockgate/no-such-method")
    error = json_rpc_error(response, 404 if mode == MODERN else 200)
    assert error["code"] == METHOD_NOT_FOUND


def test_tools_call_without_a_name(raw: RawMCP, mode: str) -> None:
    response = raw.request("tools/call", {"arguments": {"code": "1"}})
    assert response.status_code in (200, 400), response.text
    assert rpc_body(response)["error"]["code"] == INVALID_PARAMS


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        pytest.param({"code": 5}, "code: Input should be a valid string", id="code-not-a-string"),
        pytest.param({"code": ["1"]}, "code: Input should be a valid string", id="code-a-list"),
        pytest.param({}, "code: Field required", id="missing-code"),
        pytest.param({"code": ""}, "code: String should have at least 1 character", id="empty"),
        pytest.param({"code": "1", "timeout": 5}, "timeout: Extra inputs", id="extra-argument"),
    ],
)
def test_execute_with_bad_arguments(
    raw: RawMCP, mode: str, arguments: dict[str, Any], expected: str
) -> None:
    error = tool_error(raw.call_tool("execute", arguments))
    assert error["code"] == "invalid_arguments"
    assert expected in error["message"]


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        pytest.param({"executionId": 5}, "executionId: Input should be a valid string", id="id"),
        pytest.param({}, "executionId: Field required", id="missing-id"),
        pytest.param({"executionId": "x", "action": "maybe"}, "action: Input", id="bad-action"),
        pytest.param({"executionId": "x", "why": 1}, "why: Extra inputs", id="extra-argument"),
        pytest.param(
            {"executionId": "x" * 65}, "executionId: String should have at most", id="long"
        ),
    ],
)
def test_resume_with_bad_arguments(
    raw: RawMCP, mode: str, arguments: dict[str, Any], expected: str
) -> None:
    error = tool_error(raw.call_tool("resume", arguments))
    assert error["code"] == "invalid_arguments"
    assert expected in error["message"]


def test_arguments_that_are_not_an_object(raw: RawMCP, mode: str) -> None:
    response = raw.call_tool("execute", ["print(1)"])
    assert response.status_code in (200, 400), response.text
    body = rpc_body(response)
    if "error" in body:
        assert body["error"]["code"] == INVALID_PARAMS
    else:
        assert body["result"]["isError"] is True


def test_unknown_tool_name(raw: RawMCP, mode: str) -> None:
    error = tool_error(raw.call_tool("run_shell", {"cmd": "ls"}))
    assert error["code"] == "invalid_arguments"
    assert "run_shell" in error["message"]
    assert "execute" in error["message"]


def test_code_over_the_limit(raw: RawMCP, mode: str) -> None:
    code = "x = 1\n" * 400  # 2400 characters, the limit is 2000
    error = tool_error(raw.call_tool("execute", {"code": code}))
    assert error["code"] == "invalid_arguments"
    assert "2400" in error["message"] and "2000" in error["message"]


def test_a_body_over_the_limit_is_413(raw: RawMCP, mode: str) -> None:
    body = json.dumps(
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "execute", "arguments": {"code": "#" + "x" * 70_000}},
        }
    ).encode()
    response = raw.post_raw(body, "tools/call")
    assert response.status_code == 413, response.text
    assert "larger than 65536 bytes" in response.json()["error"]["message"]


def test_the_server_still_works_after_bad_input(raw: RawMCP, mode: str) -> None:
    raw.post_raw(b"{")
    raw.call_tool("execute", {"code": 5})
    response = raw.call_tool("execute", {"code": "21 * 2"})
    assert response.status_code == 200, response.text
    result = rpc_body(response)["result"]
    assert result["isError"] is False, result
    assert result["structuredContent"]["status"] == "completed"
    assert result["structuredContent"]["result"] == 42
