"""A key holder reaches nothing the operator owns, tried as an attacker would on a real
`lockgate serve` with two principals: bob's agent adds sources of its own (through the MCP
tools, accepting them itself in approval mode `model`) pointed at a loopback listener that
stands in for its own host, and at another standing in for an internal service.

- Bob's source carries none of the operator's secrets, whatever its `auth` (bearer, basic,
  header, query, OAuth client credentials, a GraphQL introspection): not a global stored
  one, not an environment variable. A secret the operator stores for bob works.
- With no network allowed, bob's sources reach no private address: loopback by every
  spelling, the server's own /metrics, link-local metadata, unique-local; refused in words
  before anyone is asked to approve. With loopback allowed, a redirect hop into another
  address is refused at connect time.
- A policy rule names bob's source by its owner: a rule for alice's `crm` is not one for
  bob's `crm`.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
from cryptography.fernet import Fernet

from tests.support.listener import Listener, listening
from tests.support.servers import (
    LOCKGATE,
    Deployment,
    LockgateServer,
    create_key_directly,
    mcp_client,
    run,
    settle,
    structured,
    text_of,
)

pytest_plugins = ["tests.support.servers"]

pytestmark = pytest.mark.slow

ENV_CANARY = "env-canary-4f9a21"
GLOBAL_CANARY = "global-canary-7c1e88"
BOBS_OWN = "bobs-own-secret-2d6b"
SECRETS_KEY = Fernet.generate_key().decode()
REACH_REFUSED = "may reach only public addresses"


@pytest.fixture(name="listener")
def listener_fixture() -> Iterator[Listener]:
    with listening("127.0.0.1") as listener:
        yield listener


def start(deployment: Deployment, **env: str) -> LockgateServer:
    return deployment.start(
        LOCKGATE_SECRETS_KEY=SECRETS_KEY, LOCKGATE_SECRET_ITEMS_TOKEN=ENV_CANARY, **env
    )


def store_secret(deployment: Deployment, name: str, value: str, *args: str) -> None:
    done = subprocess.run(
        [str(LOCKGATE), "secrets", "set", name, *args],
        input=value,
        env=deployment.env({"LOCKGATE_SECRETS_KEY": SECRETS_KEY}),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


async def add(url: str, key: str, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """The agent adds a source, accepting its own call where it waits (mode `model`)."""
    async with mcp_client(url, key, "legacy") as client:
        answer = await client.call_tool(tool, arguments)
        shown = structured(answer)
        if shown.get("status") == "waiting_for_interaction":
            decided = await client.call_tool(
                "resume", {"executionId": shown["executionId"], "action": "accept"}
            )
            shown = structured(await settle(client, structured(decided)["executionId"]))
        if answer.is_error and "error" not in shown:
            shown["error"] = {"message": text_of(answer)}
        return shown


async def execute(url: str, key: str, code: str) -> dict[str, Any]:
    async with mcp_client(url, key, "2026-07-28") as client:
        return structured(await client.call_tool("execute", {"code": code}))


def caught(call: str) -> str:
    return f"try:\n    out = {call}\nexcept Exception as exc:\n    out = str(exc)\nout"


AUTHS: dict[str, dict[str, str]] = {
    "bearer": {"bearer": "items_token"},
    "basic": {"basic": "items_token"},
    "header": {"header": "X-Api-Key", "secret": "items_token"},
    "query": {"query": "api_key", "secret": "items_token"},
}


def test_a_principal_s_source_carries_none_of_the_operator_s_secrets(
    deployment: Deployment, listener: Listener
) -> None:
    # Loopback is allowed here, so a call would reach the listener: what it carries is the
    # question.
    server = start(deployment, LOCKGATE_SOURCE_ALLOWED_NETWORKS="127.0.0.1/32")
    bob = create_key_directly(deployment.database_url, "bob")
    store_secret(deployment, "items_token", GLOBAL_CANARY)
    document = json.dumps(listener.document())
    auths = {
        **AUTHS,
        "oauth": {"oauth_token_url": f"{listener.url}/token", "secret": "items_token"},
    }
    for kind, auth in auths.items():
        added = run(
            add(
                server.url,
                bob,
                "add_openapi_source",
                {"name": f"s_{kind}", "document": document, "auth": auth},
            )
        )
        assert added["status"] == "completed", added
        done = run(execute(server.url, bob, caught(f"tools.s_{kind}.list_items()")))
        assert "not configured" in str(done["result"]), done
        assert "--principal" in str(done["result"]), done  # says how to give bob one
    graphql = run(
        add(
            server.url,
            bob,
            "add_graphql_source",
            {"name": "gql", "endpoint": f"{listener.url}/graphql", "auth": AUTHS["bearer"]},
        )
    )
    assert "not configured" in json.dumps(graphql), graphql
    for canary in (ENV_CANARY, GLOBAL_CANARY):
        assert not listener.saw(canary), [r.text() for r in listener.received]

    # A secret the operator stores for bob is the one bob's source carries.
    store_secret(deployment, "items_token", BOBS_OWN, "--principal", "bob")
    done = run(execute(server.url, bob, "tools.s_header.list_items()"))
    assert done["status"] == "completed", done
    assert listener.received[-1].headers["x-api-key"] == BOBS_OWN
    assert not listener.saw(GLOBAL_CANARY) and not listener.saw(ENV_CANARY)


def test_a_principal_s_source_reaches_no_private_address(
    deployment: Deployment, listener: Listener
) -> None:
    server = start(deployment)  # no network allowed beyond public addresses
    bob = create_key_directly(deployment.database_url, "bob")
    port = listener.port
    inline = json.dumps(listener.document())
    private = [
        f"http://127.0.0.1:{port}",
        f"http://localhost:{port}",
        f"http://2130706433:{port}",
        f"http://[::ffff:127.0.0.1]:{port}",
        f"http://[::1]:{port}",
        "http://169.254.169.254",
        "http://[fd00:ec2::254]",
        "http://10.0.0.1",
        server.base_url,  # the server's own /metrics, for one
    ]
    attempts: list[tuple[str, dict[str, Any]]] = [
        *(
            ("add_openapi_source", {"name": "s", "document": inline, "base_url": u})
            for u in private
        ),
        ("add_openapi_source", {"name": "s", "document": f"http://127.0.0.1:{port}/openapi.json"}),
        ("add_graphql_source", {"name": "g", "endpoint": f"http://localhost:{port}/graphql"}),
        ("add_mcp_source", {"name": "m", "url": f"http://127.0.0.1:{port}/mcp"}),
        (
            "add_openapi_source",
            {
                "name": "s",
                "document": json.dumps(listener.document("https://api.example")),
                "auth": {"oauth_token_url": f"http://127.0.0.1:{port}/token", "secret": "t"},
            },
        ),
    ]
    for tool, arguments in attempts:
        answer = run(add(server.url, bob, tool, arguments))
        # Refused before anyone is asked: no execution waits, the reason is in words.
        assert answer.get("status") != "waiting_for_interaction", (tool, arguments, answer)
        assert REACH_REFUSED in json.dumps(answer), (tool, arguments, answer)
    assert listener.received == []
    # ... and nothing bob's agent can run reaches the server's own metrics either.
    metrics = httpx2.get(f"{server.base_url}/metrics", timeout=30)
    assert metrics.status_code == 200  # it is there: bob just cannot reach it


def test_a_redirect_into_another_address_is_refused_at_connect(
    deployment: Deployment, listener: Listener
) -> None:
    with listening("127.0.0.2") as internal:
        # Only the attacker's host is allowed; the internal service is one address over.
        server = start(deployment, LOCKGATE_SOURCE_ALLOWED_NETWORKS="127.0.0.1/32")
        bob = create_key_directly(deployment.database_url, "bob")
        document = json.dumps(listener.document())
        assert (
            run(add(server.url, bob, "add_openapi_source", {"name": "mine", "document": document}))[
                "status"
            ]
            == "completed"
        )
        hop = f"tools.mine.hop(to='{internal.url}/admin/secrets')"
        done = run(execute(server.url, bob, caught(hop)))
        assert REACH_REFUSED in str(done["result"]), done
        assert "127.0.0.2" in str(done["result"])
        direct = run(
            add(
                server.url,
                bob,
                "add_openapi_source",
                {"name": "inner", "document": document, "base_url": internal.url},
            )
        )
        assert REACH_REFUSED in json.dumps(direct), direct
        assert internal.received == []
        assert [r.path for r in listener.received] == ["/hop"]


def test_a_rule_for_one_principal_s_source_is_not_one_for_another_s(
    deployment: Deployment, listener: Listener
) -> None:
    # The operator approves alice's own crm at once: `alice:crm.*`. A rule for `crm.*` would
    # name only an operator's source called crm.
    server = start(
        deployment,
        LOCKGATE_SOURCE_ALLOWED_NETWORKS="127.0.0.1/32",
        LOCKGATE_POLICY="alice:crm.*=approve,crm.*=approve",
    )
    alice = create_key_directly(deployment.database_url, "alice")
    bob = create_key_directly(deployment.database_url, "bob")
    document = json.dumps(listener.document())
    for key in (alice, bob):
        added = run(
            add(server.url, key, "add_openapi_source", {"name": "crm", "document": document})
        )
        assert added["status"] == "completed", added
    write = 'tools.crm.create_item(body={"name": "x"})'
    alices = run(execute(server.url, alice, write))
    assert alices["status"] == "completed", alices
    bobs = run(execute(server.url, bob, write))
    assert bobs["status"] == "waiting_for_interaction", bobs
    assert [r.method for r in listener.received if r.path == "/items"] == ["POST"]


def test_a_principal_s_document_is_bounded_by_its_setting(
    deployment: Deployment, listener: Listener
) -> None:
    server = start(
        deployment,
        LOCKGATE_SOURCE_ALLOWED_NETWORKS="127.0.0.1/32",
        LOCKGATE_MAX_SOURCE_DOCUMENT_BYTES="4096",
    )
    bob = create_key_directly(deployment.database_url, "bob")
    small = run(
        add(
            server.url,
            bob,
            "add_openapi_source",
            {"name": "small", "document": f"{listener.url}/padded-document?pad=10"},
        )
    )
    assert small["status"] == "completed", small
    # Fetched past the bound: refused, naming the setting (never the operator's 64 MiB).
    fetched = run(
        add(
            server.url,
            bob,
            "add_openapi_source",
            {"name": "fetched", "document": f"{listener.url}/padded-document?pad=8000"},
        )
    )
    assert "LOCKGATE_MAX_SOURCE_DOCUMENT_BYTES" in json.dumps(fetched), fetched
    # The document URL's query reached the host (it is what padded the document).
    assert [r.query for r in listener.received] == ["pad=10", "pad=8000"]
    # Given inline, within a call's bound but past the source's once settled: refused too.
    padded = {**listener.document(), "x-pad": "p" * 8000}
    inline = run(
        add(
            server.url,
            bob,
            "add_openapi_source",
            {"name": "inline", "document": json.dumps(padded)},
        )
    )
    assert "LOCKGATE_MAX_SOURCE_DOCUMENT_BYTES" in json.dumps(inline), inline
    listed = run(execute(server.url, bob, "tools.lockgate.list_sources()"))
    assert [s["name"] for s in listed["result"] if s["scope"] == "own"] == ["small"], listed
