"""The native door: on a 2025 session whose client declares elicitation, a paused call is
put to the client's person in the client's own prompt, within the `execute` request, and
the answer decides exactly that call. A client that cannot be asked, a dismissed prompt and
a server killed while the prompt is open all leave the execution paused for the other doors
(the page, `resume` from any session, after a restart).

The servers run in the default approval mode, `native` (the test deployments otherwise run
in `model`, whose clients stand in for the person).
"""

from __future__ import annotations

import asyncio
import signal
import threading
from typing import Any

import httpx2
import mcp_types as types
import pytest

from tests.support.servers import (
    Deployment,
    create_key_directly,
    mcp_client,
    pause,
    run,
    structured,
    write_code,
    writes_of,
)
from tests.test_approval_modes import audit_lines

pytest_plugins = ["tests.support.servers"]

pytestmark = pytest.mark.slow


class Person:
    """The client's prompt: records what it was shown and answers with `action`."""

    def __init__(self, action: str) -> None:
        self.action = action
        self.shown: list[str] = []

    async def __call__(self, context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        self.shown.append(params.message)
        return types.ElicitResult(action=self.action)  # type: ignore[arg-type]


def test_the_client_s_person_accepts_or_declines_within_the_request(
    deployment: Deployment,
) -> None:
    server = deployment.start(LOCKGATE_APPROVAL_MODE="native")
    key = create_key_directly(deployment.database_url, "alice")

    async def execute(person: Person, note: str) -> dict[str, Any]:
        async with mcp_client(server.url, key, "legacy", elicitation_callback=person) as client:
            answer = await client.call_tool("execute", {"code": write_code(note)})
            assert not answer.is_error, structured(answer)
            return structured(answer)

    yes = Person("accept")
    done = run(execute(yes, "asked-yes"))
    assert done["status"] == "completed", done
    assert done["result"] == {"written": {"key": "asked-yes", "written": True}}
    [shown] = yes.shown
    assert "tools.notes.write" in shown and '"key": "asked-yes"' in shown and "alice" in shown
    assert len(writes_of(deployment, "asked-yes")) == 1
    [record] = audit_lines(deployment, "alice")
    assert (record["door"], record["actor"]) == ("client_prompt", "the person at alice's client")

    no = Person("decline")
    refused = run(execute(no, "asked-no"))
    assert refused["status"] == "completed", refused
    assert "declined by the approver" in refused["result"]["refused"]
    assert writes_of(deployment, "asked-no") == []

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
            async with httpx2.AsyncClient(timeout=30) as http:
                decided = await http.post(
                    f"{second.base_url}/api/executions/{waiting['executionId']}/resume",
                    headers={"X-Approval-Token": url.rsplit("/", 1)[1], "Origin": second.base_url},
                    json={"action": "accept"},
                )
                assert decided.status_code == 200, decided.text
            done = await client.call_tool("resume", {"executionId": waiting["executionId"]})
            return structured(done)

    done = run(find_and_approve())
    assert done["status"] == "completed", done
    assert len(writes_of(deployment, "asked-then-killed")) == 1
    [record] = audit_lines(deployment, "alice")
    assert (record["action"], record["door"]) == ("accept", "approval_page")
