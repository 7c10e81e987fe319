"""Every resource a key holder can consume has a bound, tried as an attacker would on a real
`lockgate serve` with two principals; each test fails on the code before its fix.

- One principal's stalled upstream stalls no other principal: bob's source is being built
  (its upstream holds the connection) while alice's code runs.
- A document a principal adds costs little to refuse: a YAML alias bomb, a document nested
  thousands deep, `paths` that is not an object; each refused in words before approval.
- No log line carries a credential, whatever the auth, on the operator's sources too.
- An upstream sending a byte at a time is cut at the call's whole deadline; a webhook
  receiver that holds one principal's events delays no other principal's.
- The cap on a principal's unfinished executions holds exactly under concurrency.
- A foreign Host is refused as such on /mcp before its body is read.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import httpx2
import pytest

from lockgate.machine.db.migrate import prepare_database
from lockgate.machine.db.schema import StoredSource
from lockgate.machine.db.store import SqlStore
from lockgate.machine.settings import Settings
from lockgate.machine.webhook_signing import make_secret
from tests.support.listener import Listener, listening
from tests.support.polling import wait_for
from tests.support.servers import (
    Deployment,
    LockgateServer,
    create_key_directly,
    mcp_client,
    run,
    structured,
    text_of,
)

pytest_plugins = ["tests.support.servers"]

pytestmark = pytest.mark.slow


@pytest.fixture(name="listener")
def listener_fixture() -> Iterator[Listener]:
    with listening("127.0.0.1") as listener:
        yield listener


async def execute(url: str, key: str, code: str) -> dict[str, Any]:
    async with mcp_client(url, key, "2026-07-28") as client:
        answer = await client.call_tool("execute", {"code": code})
        shown = structured(answer)
        if answer.is_error and "error" not in shown:
            shown["error"] = {"message": text_of(answer)}
        return shown


async def call(url: str, key: str, tool: str, arguments: dict[str, Any]) -> str:
    async with mcp_client(url, key, "legacy") as client:
        answer = await client.call_tool(tool, arguments)
        return json.dumps(structured(answer)) + text_of(answer)


def cpu_seconds(server: LockgateServer) -> float:
    """The server process's CPU time so far (user and system)."""
    with open(f"/proc/{server.pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_one_principal_s_stalled_upstream_stalls_no_other(
    deployment: Deployment, listener: Listener
) -> None:
    server = deployment.start(
        LOCKGATE_SOURCE_ALLOWED_NETWORKS="127.0.0.1/32", LOCKGATE_HTTP_TIMEOUT_SECS="20"
    )
    alice = create_key_directly(deployment.database_url, "alice")
    bob = create_key_directly(deployment.database_url, "bob")
    # Bob's stored OpenAPI source, whose document's host holds every request until the test
    # releases it (written straight to the database: its add is tested elsewhere).
    engine = prepare_database(Settings(database_url=deployment.database_url))
    SqlStore(engine).sources.add(
        StoredSource(
            id=uuid.uuid4().hex,
            principal_id="bob",
            name="slow",
            kind="openapi",
            config={"name": "slow", "document": f"{listener.url}/held-document"},
            created_at=datetime.now(UTC),
        )
    )
    engine.dispose()
    bobs: list[dict[str, Any]] = []
    thread = threading.Thread(
        target=lambda: bobs.append(run(execute(server.url, bob, "tools.slow.anything()")))
    )
    thread.start()
    try:
        assert listener.holding.wait(30), "bob's source was never built"
        # While bob's upstream holds his build, alice's code runs at once.
        done = run(execute(server.url, alice, "tools.notes.list()"))
        assert done["status"] == "completed", done
        assert not listener.given_up.is_set(), "alice waited until bob's build gave up"
    finally:
        listener.released.set()
        thread.join(60)
    assert bobs and bobs[0]["status"] != "completed"


#: 587 bytes of YAML whose aliases expand to 9**8 (43 million) strings.
ALIAS_BOMB = (
    'openapi: 3.1.0\ninfo: {title: t, version: "1"}\nservers: [{url: "https://api.example"}]\n'
    'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    + "".join(
        f"{name}: &{name} [{', '.join([f'*{prev}'] * 9)}]\n"
        for prev, name in zip("abcdefg", "bcdefgh", strict=True)
    )
    + "paths: {}\n"
)


def test_documents_a_principal_adds_are_refused_in_words_at_little_cost(
    deployment: Deployment,
) -> None:
    server = deployment.start()
    bob = create_key_directly(deployment.database_url, "bob")
    before = cpu_seconds(server)
    bomb = run(call(server.url, bob, "add_openapi_source", {"name": "b", "document": ALIAS_BOMB}))
    spent = cpu_seconds(server) - before
    assert "YAML aliases" in bomb, bomb
    assert "waiting_for_interaction" not in bomb
    assert spent < 1.0, f"refusing a 587-byte document cost {spent:.1f} s of CPU"

    deep = '{"openapi": "3.1.0", "x": ' + "[" * 5000 + "]" * 5000 + "}"
    nested = run(call(server.url, bob, "add_openapi_source", {"name": "d", "document": deep}))
    assert "nest" in nested and "internal_error" not in nested, nested
    listed_paths = json.dumps(
        {
            "openapi": "3.1.0",
            "info": {"title": "t", "version": "1"},
            "servers": [{"url": "https://api.example"}],
            "paths": ["/a", "/b"],
        }
    )
    paths = run(
        call(server.url, bob, "add_openapi_source", {"name": "p", "document": listed_paths})
    )
    assert "'paths' is a list" in paths and "internal_error" not in paths, paths
    # A document built by code is bounded like any call's arguments.
    built = run(
        execute(
            server.url,
            bob,
            "try:\n    tools.lockgate.add_openapi_source(name='x', document='x' * 2300000)\n"
            "except ValueError as exc:\n    out = str(exc)\nout",
        )
    )
    assert "LOCKGATE_MAX_CALL_ARGUMENT_BYTES" in str(built["result"]), built


CANARIES = {
    "bearer": "canary-bearer-81f2",
    "basic": "canary-user:canary-basic-2e9c",
    "header": "canary-header-7d31",
    "query": "canary-query-5a07",
    "oauth": "canary-client:canary-oauth-c4e8",
}


def test_no_log_line_carries_a_credential(deployment: Deployment, listener: Listener) -> None:
    document = json.dumps(listener.document())
    tables = {
        "bearer": '{ bearer = "t_bearer" }',
        "basic": '{ basic = "t_basic" }',
        "header": '{ header = "X-Key", secret = "t_header" }',
        "query": '{ query = "api_key", secret = "t_query" }',
        "oauth": f'{{ oauth_token_url = "{listener.url}/token", secret = "t_oauth" }}',
    }
    sources = deployment.logs_dir / "sources.toml"
    sources.write_text(
        "".join(
            f"[[openapi]]\nname = \"s_{kind}\"\ndocument = '''{document}'''\nauth = {table}\n\n"
            for kind, table in tables.items()
        )
    )
    server = deployment.start(
        LOCKGATE_SOURCES_FILE=str(sources),
        LOCKGATE_POLICY="*=approve",
        **{f"LOCKGATE_SECRET_T_{kind.upper()}": value for kind, value in CANARIES.items()},
    )
    alice = create_key_directly(deployment.database_url, "alice")
    for kind in tables:
        done = run(execute(server.url, alice, f"tools.s_{kind}.list_items()"))
        assert done["status"] == "completed", done
    assert listener.saw(CANARIES["query"])  # the calls carried them
    output = server.output()
    for kind, canary in CANARIES.items():
        for part in canary.split(":"):
            assert part not in output, f"the {kind} credential is in the server's output"


def test_an_upstream_sending_a_byte_at_a_time_is_cut_at_the_deadline(
    deployment: Deployment, listener: Listener
) -> None:
    sources = deployment.logs_dir / "sources.toml"
    sources.write_text(
        f"[[openapi]]\nname = \"up\"\ndocument = '''{json.dumps(listener.document())}'''\n"
    )
    server = deployment.start(LOCKGATE_SOURCES_FILE=str(sources), LOCKGATE_HTTP_TIMEOUT_SECS="2")
    alice = create_key_directly(deployment.database_url, "alice")
    # 40 bytes, one every 0.5 s: each read is quick, the whole is 20 s.
    done = run(
        execute(
            server.url,
            alice,
            "try:\n    out = tools.up.drip()\nexcept RuntimeError as exc:\n    out = str(exc)\nout",
        )
    )
    assert "not answered in full within 2 s" in str(done["result"]), done
    wait_for(lambda: bool(listener.dripped), "the upstream to see the call given up")
    assert listener.dripped[0] < 40


def test_a_receiver_holding_one_principal_s_events_delays_no_other_s(
    deployment: Deployment, listener: Listener
) -> None:
    listener.slow_for = "alice"
    server = deployment.start(
        LOCKGATE_WEBHOOK_URL=f"{listener.url}/hook",
        LOCKGATE_WEBHOOK_SECRET=make_secret(),
        LOCKGATE_WEBHOOK_TIMEOUT="30",
        LOCKGATE_APPROVAL_MODE="browser",
    )
    alice = create_key_directly(deployment.database_url, "alice")
    bob = create_key_directly(deployment.database_url, "bob")
    write = "tools.notes.write(key='k', text='v')"
    assert run(execute(server.url, alice, write))["status"] == "waiting_for_interaction"
    assert listener.holding.wait(30), "alice's event never reached the receiver"
    bobs = run(execute(server.url, bob, write))
    assert bobs["status"] == "waiting_for_interaction"
    try:
        wait_for(
            lambda: any(e["data"]["principal"] == "bob" for e in listener.events),
            "bob's event while alice's is held",
            timeout=15,
        )
        assert not listener.given_up.is_set()
    finally:
        listener.released.set()


def test_the_cap_on_unfinished_executions_holds_exactly(deployment: Deployment) -> None:
    server = deployment.start(
        LOCKGATE_MAX_PAUSED_PER_PRINCIPAL="3",
        LOCKGATE_MAX_RUNNING_PER_PRINCIPAL="64",
        LOCKGATE_APPROVAL_MODE="browser",
    )
    bob = create_key_directly(deployment.database_url, "bob")

    async def at_once() -> list[dict[str, Any]]:
        return list(
            await asyncio.gather(
                *(
                    execute(server.url, bob, f"tools.notes.write(key='k{n}', text='v')")
                    for n in range(16)
                )
            )
        )

    answers = run(at_once())
    waiting = [a for a in answers if a["status"] == "waiting_for_interaction"]
    refused = [a for a in answers if "LOCKGATE_MAX_PAUSED_PER_PRINCIPAL" in json.dumps(a)]
    assert len(waiting) == 3, [a.get("status") for a in answers]
    assert len(refused) == 13


def test_a_foreign_host_is_refused_before_the_body_is_read(deployment: Deployment) -> None:
    server = deployment.start()
    key = create_key_directly(deployment.database_url, "alice")
    request = (
        f"POST /mcp HTTP/1.1\r\nHost: evil.example\r\nAuthorization: Bearer {key}\r\n"
        "Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"
        "Content-Length: 9\r\nConnection: close\r\n\r\n{not json"
    ).encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    status = answer.split(b"\r\n", 1)[0]
    assert b" 421 " in status, answer[:300]
    assert b"does not answer to this Host" in answer


def test_the_cap_on_live_sessions_holds_exactly(deployment: Deployment) -> None:
    server = deployment.start(LOCKGATE_MAX_SESSIONS_PER_PRINCIPAL="3")
    bob = create_key_directly(deployment.database_url, "bob")
    alice = create_key_directly(deployment.database_url, "alice")
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "racer", "version": "1"},
        },
    }

    async def open_sessions(key: str, how_many: int) -> list[httpx2.Response]:
        headers = {
            "Authorization": f"Bearer {key}",
            "Accept": "application/json, text/event-stream",
        }
        async with httpx2.AsyncClient(timeout=30) as http:
            return list(
                await asyncio.gather(
                    *(
                        http.post(server.url, json=initialize, headers=headers)
                        for _ in range(how_many)
                    )
                )
            )

    answers = run(open_sessions(bob, 12))
    opened = [a for a in answers if a.status_code == 200]
    refused = [a for a in answers if a.status_code == 429]
    assert len(opened) == 3, [a.status_code for a in answers]
    assert len(refused) == 9
    assert all("mcp-session-id" in a.headers for a in opened)
    assert not any("mcp-session-id" in a.headers for a in refused)
    assert all("LOCKGATE_MAX_SESSIONS_PER_PRINCIPAL" in a.text for a in refused)
    # Bob's sessions are his own count: alice opens hers.
    assert [a.status_code for a in run(open_sessions(alice, 2))] == [200, 200]
