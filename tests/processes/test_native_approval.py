"""The native door: on a 2025 session whose client declares elicitation, a paused call is
put to the client's person in the client's own prompt, within the `execute` request, and
the answer decides exactly that call. A client that cannot be asked, a dismissed prompt and
a server killed while the prompt is open all leave the execution paused for the other doors
(the page, where a signed-in approver decides; `resume` from any session, after a restart).

The servers run in the default approval mode, `native` (the test deployments otherwise run
in `model`, whose clients stand in for the person).
"""

from __future__ import annotations

import asyncio
import json
import signal
import threading
from typing import Any

import httpx2
import mcp_types as types
import pytest
from mcp.shared.exceptions import MCPError

from tests.support.people import approver_at, links_base
from tests.support.raw_mcp import RawMCP
from tests.support.servers import (
    Deployment,
    create_key_directly,
    mcp_client,
    pause,
    run,
    structured,
    text_of,
    write_code,
    writes_of,
)

pytest_plugins = ["tests.support.servers"]

pytestmark = pytest.mark.slow


class Person:
    """The client's prompt: records what it was shown and answers with `action` (and the
    form's `content`)."""

    def __init__(self, action: str, content: dict[str, Any] | None = None) -> None:
        self.action, self.content = action, content
        self.shown: list[str] = []

    async def __call__(self, context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        self.shown.append(params.message)
        return types.ElicitResult(action=self.action, content=self.content)  # type: ignore[arg-type]


def test_the_client_s_person_accepts_or_declines_within_the_request(
    deployment: Deployment,
) -> None:
    server = deployment.start(LOCKGATE_APPROVAL_MODE="native")
    key = create_key_directly(deployment.database_url, "alice")

    async def execute(person: Person, note: str, text: str = "v") -> dict[str, Any]:
        async with mcp_client(server.url, key, "legacy", elicitation_callback=person) as client:
            answer = await client.call_tool("execute", {"code": write_code(note, text)})
            assert not answer.is_error, structured(answer)
            return structured(answer)

    yes = Person("accept")
    done = run(execute(yes, "asked-yes"))
    assert done["status"] == "completed", done
    assert done["result"] == {"written": {"key": "asked-yes", "written": True}}
    [shown] = yes.shown
    assert "tools.notes.write" in shown and '"key": "asked-yes"' in shown and "alice" in shown
    assert len(writes_of(deployment, "asked-yes")) == 1
    [record] = deployment.audit_lines("alice")
    assert (record["door"], record["actor"]) == ("client_prompt", "the person at alice's client")
    # The client's prompt: trusted as its person's, but no signed-in person the server knows.
    assert record["by"] == "client" and record["person"] is None

    no = Person("decline")
    refused = run(execute(no, "asked-no"))
    assert refused["status"] == "completed", refused
    assert "declined by the approver" in refused["result"]["refused"]
    assert writes_of(deployment, "asked-no") == []

    # Arguments longer than a prompt holds are cut there, and the prompt says so and names
    # the page that shows them whole.
    long = Person("decline")
    cut = run(execute(long, "asked-long", "y" * 3000))
    assert "declined by the approver" in cut["result"]["refused"], cut
    [shown] = long.shown
    page = f"{links_base(server.base_url)}/approve/{cut['executionId']}/1"
    assert (
        "[CUT: the arguments are longer than this prompt shows; read them all at "
        f"{page} before you accept]"
    ) in shown, shown
    assert "y" * 3000 not in shown and len(shown) < 3000
    assert writes_of(deployment, "asked-long") == []

    # Dismissed: nobody decided; the call waits, with its page, for another door.
    later = run(execute(Person("cancel"), "asked-later"))
    assert later["status"] == "waiting_for_interaction", later
    assert later["interaction"]["approvalUrl"]

    # A client that cannot be asked (no elicitation) gets the page, as in browser mode.
    async def plain() -> dict[str, Any]:
        async with mcp_client(server.url, key, "legacy") as client:
            return await pause(client, "not-asked")

    assert run(plain())["interaction"]["approvalUrl"]


CALL = {"code": write_code("asked-then-killed"), "idempotencyKey": "native-killed-1"}


def test_a_prompt_open_when_the_server_dies_leaves_the_call_for_the_other_doors(
    deployment: Deployment,
) -> None:
    first = deployment.start(name="first", LOCKGATE_APPROVAL_MODE="native")
    key = create_key_directly(deployment.database_url, "alice")
    asked = threading.Event()

    killed = threading.Event()

    async def too_late(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.set()
        await asyncio.to_thread(killed.wait, 60)  # the person answers once the server is gone
        return types.ElicitResult(action="accept")

    async def ask() -> None:
        async with mcp_client(first.url, key, "legacy", elicitation_callback=too_late) as client:
            with pytest.raises(Exception):  # noqa: B017 - the server dies under the request
                await client.call_tool("execute", CALL)

    async def ask_and_kill() -> None:
        task = asyncio.create_task(ask())
        await asyncio.to_thread(asked.wait, 30)
        assert asked.is_set()
        assert await asyncio.to_thread(first.kill) == -signal.SIGKILL
        killed.set()
        await asyncio.wait_for(task, 60)

    run(ask_and_kill())
    assert writes_of(deployment, "asked-then-killed") == []

    second = deployment.start(name="second", LOCKGATE_APPROVAL_MODE="native")

    async def find_and_approve() -> dict[str, Any]:
        async with mcp_client(second.url, key, "2026-07-28") as client:
            # The lost answer is asked for again with the same key: the call still waits.
            waiting = structured(await client.call_tool("execute", CALL))
            assert waiting["status"] == "waiting_for_interaction", waiting
            url = waiting["interaction"]["approvalUrl"]
            # A person who approves alice's calls decides it on its page.
            with approver_at(deployment.database_url, second.base_url, ["alice"], "Ann") as ann:
                decided = await asyncio.to_thread(ann.approve, url)
                assert decided.status_code == 200, decided.text
            done = await client.call_tool("resume", {"executionId": waiting["executionId"]})
            return structured(done)

    done = run(find_and_approve())
    assert done["status"] == "completed", done
    assert len(writes_of(deployment, "asked-then-killed")) == 1
    [record] = deployment.audit_lines("alice")
    assert (record["action"], record["door"], record["actor"]) == ("accept", "approval_page", "Ann")
    assert record["by"] == "person" and record["person"]["name"] == "Ann"


# -- 2026-07-28: the person's answer comes with the client's retry (InputRequiredResult) --------


def test_a_2026_client_s_person_decides_through_input_required(deployment: Deployment) -> None:
    server = deployment.start(LOCKGATE_APPROVAL_MODE="native")
    key = create_key_directly(deployment.database_url, "alice")

    async def execute(person: Person, note: str) -> dict[str, Any]:
        # The SDK's client answers `input_required` with its elicitation callback and
        # retries on its own, as any 2026-07-28 client does.
        async with mcp_client(server.url, key, "2026-07-28", elicitation_callback=person) as client:
            answer = await client.call_tool("execute", {"code": write_code(note)})
            assert not answer.is_error, structured(answer)
            return structured(answer)

    yes = Person("accept")
    done = run(execute(yes, "mrtr-yes"))
    assert done["result"] == {"written": {"key": "mrtr-yes", "written": True}}, done
    [shown] = yes.shown
    assert "tools.notes.write" in shown and "mrtr-yes" in shown
    assert len(writes_of(deployment, "mrtr-yes")) == 1
    assert deployment.audit_lines("alice")[-1]["door"] == "client_prompt"

    no = run(execute(Person("decline"), "mrtr-no"))
    assert "declined by the approver" in no["result"]["refused"]
    # Dismissed: answered with the page, not asked again in a loop.
    later = run(execute(Person("cancel"), "mrtr-later"))
    assert later["status"] == "waiting_for_interaction" and later["interaction"]["approvalUrl"]
    assert writes_of(deployment, "mrtr-no") == [] and writes_of(deployment, "mrtr-later") == []


def test_the_retry_works_on_another_instance_after_a_restart_and_only_once(
    deployment: Deployment,
) -> None:
    first = deployment.start(name="first", LOCKGATE_APPROVAL_MODE="native")
    key = create_key_directly(deployment.database_url, "alice")
    call = {"code": write_code("mrtr-moved")}

    async def ask() -> types.InputRequiredResult:
        async with mcp_client(first.url, key, "2026-07-28", elicitation_callback=Person("x")) as c:
            asked = await c.session.call_tool("execute", call, allow_input_required=True)
            assert isinstance(asked, types.InputRequiredResult), asked
            return asked

    asked = run(ask())
    assert asked.request_state and asked.input_requests and "approval" in asked.input_requests
    assert first.kill() == -signal.SIGKILL
    second = deployment.start(name="second", LOCKGATE_APPROVAL_MODE="native")
    accept: types.InputResponses = {"approval": types.ElicitResult(action="accept")}

    async def retry(state: str, arguments: dict[str, Any] = call) -> Any:
        """The retry's answer, or the protocol error it got, in words."""
        async with mcp_client(second.url, key, "2026-07-28", elicitation_callback=Person("x")) as c:
            try:
                return await c.session.call_tool(
                    "execute", arguments, input_responses=accept, request_state=state
                )
            except MCPError as exc:
                return f"{exc.error.code}: {exc.error.message}"

    done = run(retry(asked.request_state))
    assert not done.is_error and structured(done)["status"] == "completed", structured(done)
    assert len(writes_of(deployment, "mrtr-moved")) == 1

    # Replayed: it decides nothing again, and answers what became of the execution; nothing
    # is made twice.
    replayed = run(retry(asked.request_state))
    assert not replayed.is_error, text_of(replayed)
    assert structured(replayed) == structured(done)
    # Tampered, or sent with another program: refused by the SDK's boundary (-32602).
    state = asked.request_state
    tampered = state[:-4] + ("AAAA" if not state.endswith("AAAA") else "BBBB")
    refused = "-32602: Invalid or expired requestState"
    assert run(retry(tampered)) == refused
    assert run(retry(state, {"code": "1"})) == refused
    assert len(writes_of(deployment, "mrtr-moved")) == 1


LOOP = (
    "out = []\n"
    "for i in range(4):\n"
    "    out.append(tools.notes.write(key=f'looped-{i}', text='x')['key'])\n"
    "out"
)


@pytest.mark.parametrize("protocol", ["legacy", "2026-07-28"])
def test_a_loop_approved_once_in_the_client_s_prompt(deployment: Deployment, protocol: str) -> None:
    server = deployment.start(LOCKGATE_APPROVAL_MODE="native")
    key = create_key_directly(deployment.database_url, "alice")
    person = Person("accept", {"alsoApproveNext": 3})

    async def execute() -> dict[str, Any]:
        async with mcp_client(server.url, key, protocol, elicitation_callback=person) as client:
            return structured(await client.call_tool("execute", {"code": LOOP}))

    done = run(execute())
    assert done["status"] == "completed", done
    assert done["result"] == [f"looped-{i}" for i in range(4)]
    assert len(person.shown) == 1  # one prompt for the four writes
    doors = [line["door"] for line in deployment.audit_lines("alice")]
    assert doors == ["client_prompt", "grant", "grant", "grant"]


# -- 2025, URL mode: the client sends its person to the call's page ---------------------------


def _data(line: str) -> dict[str, Any] | None:
    if not line.startswith("data:") or not line[5:].strip():
        return None
    parsed: dict[str, Any] = json.loads(line[5:])
    return parsed


def test_a_url_mode_client_sends_its_person_to_the_page_and_the_request_goes_on(
    deployment: Deployment,
) -> None:
    server = deployment.start(LOCKGATE_APPROVAL_MODE="native")
    key = create_key_directly(deployment.database_url, "alice")
    with httpx2.Client(timeout=60) as http:
        raw = RawMCP(http, server.url, key, "legacy")
        opened = raw.initialize({"elicitation": {"url": {}}}, "url-mode-client")
        assert opened.status_code == 200, opened.text
        call = {
            "jsonrpc": "2.0",
            "id": 7,
            "method": "tools/call",
            "params": {"name": "execute", "arguments": {"code": write_code("by-url")}},
        }
        seen: list[dict[str, Any]] = []
        with http.stream("POST", server.url, headers=raw.headers("tools/call"), json=call) as r:
            lines = r.iter_lines()
            asked = next(m for m in map(_data, lines) if m and m.get("method"))
            assert asked["method"] == "elicitation/create", asked
            params = asked["params"]
            assert params["mode"] == "url" and "/approve/" in params["url"], params
            assert "tools.notes.write" in params["message"]
            # The client's person agrees to open the page...
            agreed = http.post(
                server.url,
                headers=raw.headers("elicitation/create"),
                json={"jsonrpc": "2.0", "id": asked["id"], "result": {"action": "accept"}},
            )
            assert agreed.status_code == 202, agreed.text
            assert writes_of(deployment, "by-url") == []  # opening the page decides nothing
            # ...and, signed in as an approver of alice's calls, approves there.
            execution_id = params["elicitationId"].split(":")[0]
            assert params["url"].startswith(
                f"{links_base(server.base_url)}/approve/{execution_id}/"
            ), params
            with approver_at(deployment.database_url, server.base_url, ["alice"], "Ann") as ann:
                decided = ann.approve(params["url"])
                assert decided.status_code == 200, decided.text
            for message in map(_data, lines):
                if message is not None:
                    seen.append(message)
                    if message.get("id") == 7:
                        break
    complete = [m for m in seen if m.get("method") == "notifications/elicitation/complete"]
    assert [m["params"]["elicitationId"] for m in complete] == [params["elicitationId"]]
    [answer] = [m for m in seen if m.get("id") == 7]
    result = answer["result"]["structuredContent"]
    assert result["status"] == "completed", result
    assert result["result"] == {"written": {"key": "by-url", "written": True}}
    assert len(writes_of(deployment, "by-url")) == 1
    [record] = deployment.audit_lines("alice")
    assert (record["door"], record["actor"]) == ("approval_page", "Ann")
    assert record["by"] == "person" and record["person"]["name"] == "Ann"
