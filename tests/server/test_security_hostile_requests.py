"""Security against hostile requests, on a real server with two principals (alice, bob).

Every test talks to a real `lockgate serve` over loopback with raw HTTP: a huge chunked body
is refused without being held in memory, huge numbers, deep nesting and fuzzed bodies are
client errors, never a server error, and one principal at its limits (sessions, request
rate; tried against a server of its own) does not stop another. What bob can reach of
alice's is in test_security.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.security_target import MAX_BODY, Target, legacy_headers, start_target
from tests.support.servers import ACCEPT, MODERN, RawMCP

pytest_plugins = ["tests.support.servers", "tests.support.security_target"]
pytestmark = pytest.mark.slow


# -- 2. body limits while reading -----------------------------------------------------------------


def peak_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM in /proc status")


def chunked_flood(port: int, path: str, key: str, mib: int) -> bytes:
    """POST `mib` MiB with chunked encoding (no Content-Length); what came back."""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
        "Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2025-11-25\r\n"
        "Transfer-Encoding: chunked\r\n\r\n"
    ).encode()
    chunk = b"[" * (1024 * 1024)
    framed = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
    received = b""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head)
        try:
            for _ in range(mib):
                sock.sendall(framed)
            sock.sendall(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server stopped reading: the point
        try:
            # Until the answer is whole: the server may keep the connection open after it.
            while not whole_answer(received) and (data := sock.recv(65536)):
                received += data
        except (ConnectionResetError, TimeoutError):
            pass
    return received


def whole_answer(received: bytes) -> bool:
    """An HTTP answer's head and its whole body have arrived: as much as its Content-Length
    says, or a chunked body's last chunk."""
    head, sep, body = received.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) >= int(value.strip())
        if name.strip().lower() == b"transfer-encoding" and b"chunked" in value.lower():
            return body.endswith(b"0\r\n\r\n")
    return False


@pytest.mark.parametrize("path", ["/mcp", "/api/executions/x/resume", "/approve/x"])
def test_a_huge_chunked_body_is_refused_without_being_held(
    target: Target, http: httpx2.Client, path: str
) -> None:
    before = peak_rss_kib(target.server.pid)
    answer = chunked_flood(target.server.port, path, target.alice, mib=96)
    grown_mib = (peak_rss_kib(target.server.pid) - before) / 1024
    assert grown_mib < 24, f"the server grew by {grown_mib:.0f} MiB reading a refused body"
    if answer:  # the refusal may be lost to the reset of a connection still sending
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    # A declared length over the limit is refused before a byte of the body is read.
    declared = http.post(
        target.base_url + path,
        headers={**legacy_headers(target.alice), "Content-Length": str(10 * MAX_BODY)},
        content=b"x" * (10 * MAX_BODY),
    )
    assert declared.status_code == 413, declared.text
    assert f"larger than {MAX_BODY} bytes" in declared.text
    assert http.get(target.base_url + "/healthz").status_code == 200


# -- 5. nothing a client sends is a server error --------------------------------------------------


def modern_headers(key: str, method: str = "tools/list") -> dict[str, str]:
    return {
        "Authorization": f"Bearer {key}",
        **ACCEPT,
        "MCP-Protocol-Version": MODERN,
        "Mcp-Method": method,
    }


HOSTILE_BODIES = [
    b'{"jsonrpc": "2.0", "id": ' + b"9" * 5000 + b', "method": "ping"}',
    b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "execute", '
    b'"arguments": {"code": ' + b"1" * 5000 + b"}}}",
    b"[" * 3000 + b"]" * 3000,
    b'{"a":' * 3000 + b"1" + b"}" * 3000,
    b'{"jsonrpc": "2.0", "id": 1, "method": "ping", "params": ' + b"[" * 3000 + b"]" * 3000 + b"}",
    b"\xff\xfe\x00garbage",
    b'{"jsonrpc": "2.0", "id": 1e400, "method": "ping"}',
]


@pytest.mark.parametrize("era", ["legacy", MODERN])
@pytest.mark.parametrize("body", HOSTILE_BODIES, ids=range(len(HOSTILE_BODIES)))
def test_huge_numbers_and_deep_nesting_are_client_errors(
    target: Target, http: httpx2.Client, era: str, body: bytes
) -> None:
    if era == MODERN:
        headers = modern_headers(target.alice)
    else:
        raw = RawMCP(http, target.url, target.alice, "legacy")
        headers = raw.headers("ping")
    response = http.post(target.url, headers=headers, content=body)
    assert response.status_code < 500, (response.status_code, response.text[:300])
    assert "Traceback" not in response.text


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.integers(min_value=10**30, max_value=10**60),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
methods = st.sampled_from(
    ["ping", "tools/list", "tools/call", "initialize", "resources/list", "x", "", "tasks/get"]
)
rpc_messages = st.fixed_dictionaries(
    {"jsonrpc": st.sampled_from(["2.0", "1.0", 2]), "method": methods},
    optional={"id": json_values, "params": json_values},
)
tool_calls = st.fixed_dictionaries(
    {
        "jsonrpc": st.just("2.0"),
        "id": st.integers(0, 10**6),
        "method": st.just("tools/call"),
        "params": st.fixed_dictionaries(
            {"name": st.sampled_from(["execute", "resume", "describe_tools", "nope"])},
            optional={"arguments": json_values},
        ),
    }
)
bodies = st.one_of(
    st.binary(max_size=200),
    json_values.map(lambda v: json.dumps(v).encode()),
    rpc_messages.map(lambda v: json.dumps(v).encode()),
    tool_calls.map(lambda v: json.dumps(v).encode()),
    st.integers(1, 6000).map(lambda depth: b"[" * depth + b"]" * depth),
    st.integers(1, 8000).map(lambda digits: b'{"jsonrpc":"2.0","id":' + b"7" * digits + b"}"),
)


@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(body=bodies, era=st.sampled_from(["legacy", MODERN]))
def test_fuzzed_bodies_never_get_a_server_error(
    target: Target, http: httpx2.Client, body: bytes, era: str
) -> None:
    if era == MODERN:
        headers = modern_headers(target.alice)
    else:
        headers = legacy_headers(target.alice, _fuzz_session(target, http))
    response = http.post(target.url, headers=headers, content=body)
    assert response.status_code < 500, (body[:200], response.status_code, response.text[:300])


_fuzz_sessions: dict[str, str] = {}


def _fuzz_session(target: Target, http: httpx2.Client) -> str:
    """One session for the whole fuzz run (a fuzzed body may even close it: then another)."""
    session = _fuzz_sessions.get(target.url)
    if (
        session is not None
        and http.post(
            target.url,
            headers=legacy_headers(target.alice, session),
            json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
        ).status_code
        == 200
    ):
        return session
    raw = RawMCP(http, target.url, target.alice, "legacy")
    assert raw.initialize().status_code == 200 and raw.session_id is not None
    _fuzz_sessions[target.url] = raw.session_id
    return raw.session_id


# -- 4. per-principal limits at the door ---------------------------------------------------------


@pytest.fixture(name="limited")
def limited_fixture(tmp_path: Path) -> Iterator[Target]:
    made = start_target(
        tmp_path,
        LOCKGATE_MAX_SESSIONS_PER_PRINCIPAL="2",
        LOCKGATE_MAX_REQUESTS_PER_MINUTE="24",
    )
    try:
        yield made
    finally:
        made.deployment.stop_all()


def test_one_principal_at_its_limits_does_not_stop_another(
    limited: Target, http: httpx2.Client
) -> None:
    sessions = []
    for _ in range(2):
        raw = RawMCP(http, limited.url, limited.alice, "legacy")
        assert raw.initialize().status_code == 200
        sessions.append(raw)
    third = RawMCP(http, limited.url, limited.alice, "legacy").initialize()
    assert third.status_code == 429, third.text
    assert "LOCKGATE_MAX_SESSIONS_PER_PRINCIPAL=2" in third.json()["error"]["message"]
    bobs = RawMCP(http, limited.url, limited.bob, "legacy")
    assert bobs.initialize().status_code == 200
    # Closing one of alice's sessions makes room for another.
    closed = http.delete(limited.url, headers=sessions[0].headers("ping"))
    assert closed.status_code == 200
    assert RawMCP(http, limited.url, limited.alice, "legacy").initialize().status_code == 200

    # The request rate: alice runs out (24 a minute, 8 of them spent above); bob does not.
    statuses = [sessions[1].request("ping").status_code for _ in range(24)]
    assert statuses.count(200) >= 1 and statuses[-1] == 429, statuses
    refused = sessions[1].request("ping")
    assert refused.status_code == 429
    assert int(refused.headers["retry-after"]) >= 1
    assert "LOCKGATE_MAX_REQUESTS_PER_MINUTE" in refused.json()["error"]["message"]
    assert bobs.request("ping").status_code == 200
