"""The tasks extension: `execute` from a 2026-07-28 request that declares
`io.modelcontextprotocol/tasks` answers a durable task, driven with tasks/get, tasks/update
and tasks/cancel from creation to completion through an approval, across a SIGKILL and on
another instance. Two principals: a task is nobody else's.
"""

from __future__ import annotations

import signal

import httpx2
import pytest

from lockgate.spec import ExecutionStatus
from lockgate.spec.task_status import TASK_STATUS, TaskStatus, unmapped
from tests.support.raw_mcp import RawMCP, rpc_body
from tests.support.servers import Deployment, create_key_directly, write_code, writes_of
from tests.support.tasks_client import TASKS, TasksClient, acked, poll

pytest_plugins = ["tests.support.servers"]


def test_every_execution_state_has_a_task_status() -> None:
    assert unmapped() == []
    assert TASK_STATUS[ExecutionStatus.WAITING_FOR_INTERACTION].status is TaskStatus.INPUT_REQUIRED
    # A failed execution is a tool call that completed with isError, not a JSON-RPC failure.
    assert TASK_STATUS[ExecutionStatus.FAILED].status is TaskStatus.COMPLETED


@pytest.mark.slow
def test_a_task_from_creation_to_completion_through_an_approval_across_a_restart(
    deployment: Deployment,
) -> None:
    first = deployment.start(name="first", LOCKGATE_APPROVAL_MODE="native")
    alice = create_key_directly(deployment.database_url, "alice")
    bob = create_key_directly(deployment.database_url, "bob")
    with httpx2.Client(timeout=30) as http:
        client = TasksClient(http, first.url, alice)
        created = client.execute(write_code("task-note"))["result"]
        assert created["resultType"] == "task", created
        task_id = created["taskId"]
        assert created["status"] in ("working", "input_required")
        assert created["ttlMs"] == 7 * 24 * 3600 * 1000 and created["createdAt"]

        waiting = poll(client, task_id, lambda t: t["status"] == "input_required")
        [(key, request)] = waiting["inputRequests"].items()
        assert key == "approval-1"
        assert request["method"] == "elicitation/create"
        assert "tools.notes.write" in request["params"]["message"]
        assert writes_of(deployment, "task-note") == []

        # Another principal cannot see it, and a client that did not declare the extension
        # is told so.
        other = TasksClient(http, first.url, bob).get(task_id)
        assert other["error"]["code"] == -32602, other
        assert other["error"]["message"] == "Failed to retrieve task: Task not found"
        undeclared = TasksClient(http, first.url, alice, declare=False).get(task_id)
        assert undeclared["error"]["code"] == -32021, undeclared
        assert undeclared["error"]["data"] == {"requiredCapabilities": {"extensions": {TASKS: {}}}}

    assert first.kill() == -signal.SIGKILL
    second = deployment.start(name="second", LOCKGATE_APPROVAL_MODE="native")
    with httpx2.Client(timeout=30) as http:
        client = TasksClient(http, second.url, alice)
        again = poll(client, task_id, lambda t: t["status"] == "input_required")
        assert list(again["inputRequests"]) == ["approval-1"]
        # An answer to a key that is not outstanding is ignored; the real one decides.
        assert acked(client.update(task_id, {"approval-9": {"action": "accept"}}))
        assert writes_of(deployment, "task-note") == []
        assert acked(client.update(task_id, {"approval-1": {"action": "accept"}}))
        done = poll(client, task_id, lambda t: t["status"] == "completed")
        assert done["result"]["structuredContent"]["result"] == {
            "written": {"key": "task-note", "written": True}
        }
        assert done["result"]["isError"] is False
        assert len(writes_of(deployment, "task-note")) == 1
        # Decided by the client's person (the client's own prompt, no signed-in approver).
        record = deployment.audit_lines("alice")[-1]
        assert (record["door"], record["actor"]) == ("task_update", "the person at alice's client")
        assert record["by"] == "client" and record["person"] is None

        # A repeated answer changes nothing.
        client.update(task_id, {"approval-1": {"action": "accept"}})
        assert len(writes_of(deployment, "task-note")) == 1

        # Cancelled while it waits: the code is told, nothing is written.
        cancelled = client.execute(write_code("task-cancelled"))["result"]
        poll(client, cancelled["taskId"], lambda t: t["status"] == "input_required")
        assert acked(client.cancel(cancelled["taskId"]))
        poll(client, cancelled["taskId"], lambda t: t["status"] != "input_required")
        assert writes_of(deployment, "task-cancelled") == []
        unknown = client.get("no-such-task")
        assert unknown["error"]["code"] == -32602


@pytest.mark.slow
def test_a_request_that_does_not_declare_tasks_gets_the_usual_answer(
    deployment: Deployment,
) -> None:
    server = deployment.start(LOCKGATE_APPROVAL_MODE="browser")
    alice = create_key_directly(deployment.database_url, "alice")
    with httpx2.Client(timeout=30) as http:
        plain = TasksClient(http, server.url, alice, declare=False).execute(write_code("plain"))
        assert plain["result"]["structuredContent"]["status"] == "waiting_for_interaction"
        # In browser mode a task waiting for the page stays working: nothing to ask.
        client = TasksClient(http, server.url, alice)
        task = client.execute(write_code("browser-task"))["result"]
        waiting = poll(
            client, task["taskId"], lambda t: "statusMessage" in t or t["status"] != "working"
        )
        assert waiting["status"] == "working" and "approval page" in waiting["statusMessage"]
        assert "inputRequests" not in waiting


def test_a_2025_session_that_declared_tasks_gets_the_tool_result(deployment: Deployment) -> None:
    """The MCP Inspector declares the extension at a 2025-11-25 initialize: on that protocol
    `tools/call` answers a CallToolResult, so `execute` answers one (it once answered a task
    the SDK refused to send, and the client saw "Handler returned an invalid result")."""
    server = deployment.start(LOCKGATE_APPROVAL_MODE="browser")
    alice = create_key_directly(deployment.database_url, "alice")
    with httpx2.Client(timeout=30) as http:
        raw = RawMCP(http, server.url, alice, "legacy")
        opened = raw.initialize({"extensions": {TASKS: {}}}, "declares-tasks")
        assert opened.status_code == 200, opened.text
        answer = rpc_body(raw.call_tool("execute", {"code": write_code("inspector-like")}))
        assert "error" not in answer, answer
        assert answer["result"]["structuredContent"]["status"] == "waiting_for_interaction"


@pytest.mark.slow
def test_a_task_s_loop_is_approved_once(deployment: Deployment) -> None:
    server = deployment.start(LOCKGATE_APPROVAL_MODE="native")
    alice = create_key_directly(deployment.database_url, "alice")
    loop = (
        "out = []\n"
        "for i in range(3):\n"
        "    out.append(tools.notes.write(key=f'task-loop-{i}', text='x')['key'])\n"
        "out"
    )
    with httpx2.Client(timeout=30) as http:
        client = TasksClient(http, server.url, alice)
        task_id = client.execute(loop)["result"]["taskId"]
        waiting = poll(client, task_id, lambda t: t["status"] == "input_required")
        form = waiting["inputRequests"]["approval-1"]["params"]["requestedSchema"]
        assert "alsoApproveNext" in form["properties"]
        answer = {"approval-1": {"action": "accept", "content": {"alsoApproveNext": 2}}}
        assert acked(client.update(task_id, answer))
        done = poll(client, task_id, lambda t: t["status"] == "completed")
        assert done["result"]["structuredContent"]["result"] == [f"task-loop-{i}" for i in range(3)]
