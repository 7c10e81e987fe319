"""Direct tools as tasks (`io.modelcontextprotocol/tasks`, the flavour Claude Code speaks on
2026-07-28): a direct call from a request that declares the extension answers a durable task
where its tool allows one and the call does not finish at once. The suite's
tasks-mrtr-input flow (confirm_delete, tasks/get input_required, tasks/update) across a
SIGKILL and restart; a tool that requires a task, one that forbids it, and a fault that is a
JSON-RPC error (`failed`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx2

from tests.support.direct_servers import direct_settings, sqlite_deployment_fixture  # noqa: F401
from tests.support.server_deployment import Deployment
from tests.support.tasks_client import TasksClient, acked, poll


def _settings(folder: Path, effects: Path) -> dict[str, str]:
    # `native`: the person answers in the client (Claude Code's own prompt), as a task's
    # input request; the agent's key alone decides nothing.
    return direct_settings(folder, effects, LOCKGATE_APPROVAL_MODE="native")


def _call(client: TasksClient, tool: str, arguments: dict[str, Any]) -> Any:
    return client.request("tools/call", {"name": tool, "arguments": arguments}, name=tool)


def test_a_direct_call_waiting_for_approval_is_a_task_that_survives_a_sigkill(
    deployment: Deployment, tmp_path: Path
) -> None:
    effects = tmp_path / "effects"
    settings = _settings(tmp_path, effects)
    server = deployment.start(**settings)
    [key] = server.printed_keys()
    with httpx2.Client(timeout=30) as http:
        client = TasksClient(http, server.url, key)
        created = _call(client, "confirm_delete", {"filename": "mrtr-resume.txt"})["result"]
        assert created["resultType"] == "task", created
        task_id = created["taskId"]
        waiting = poll(client, task_id, lambda t: t["status"] != "working")
        assert waiting["status"] == "input_required", waiting
        [(request_key, request)] = waiting["inputRequests"].items()
        assert request["method"] == "elicitation/create"
        assert "confirm_delete" in request["params"]["message"]

        server.kill()
        again = deployment.start_at(server.port, **settings)
        client = TasksClient(http, again.url, key)
        # The restarted server asks the same question under the same key.
        still = client.get(task_id)["result"]
        assert (still["status"], list(still["inputRequests"])) == ("input_required", [request_key])
        assert not effects.exists()  # nothing deleted before the person accepted

        answer = {request_key: {"action": "accept", "content": {"confirm": True}}}
        assert acked(client.update(task_id, answer))
        done = poll(client, task_id, lambda t: t["status"] not in ("working", "input_required"))
    assert done["status"] == "completed", done
    # The direct tool's own answer, not execute's.
    assert done["result"]["content"] == [{"type": "text", "text": "Deleted mrtr-resume.txt."}]
    assert not done["result"].get("isError")
    [line] = effects.read_text().splitlines()
    assert line == f"{task_id}:1 mrtr-resume.txt"


def test_what_a_tool_says_of_tasks_decides_how_its_call_answers(
    deployment: Deployment, tmp_path: Path
) -> None:
    server = deployment.start(**_settings(tmp_path, tmp_path / "effects"))
    [key] = server.printed_keys()
    with httpx2.Client(timeout=30) as http:
        client = TasksClient(http, server.url, key)
        # Forbidden: always the result, even to a client that takes tasks.
        greeted = _call(client, "greet", {"name": "ada"})["result"]
        assert greeted["resultType"] == "complete"
        assert greeted["content"] == [{"type": "text", "text": "Hello, ada!"}]
        # Optional and quick: the result at once (the immediate-result shortcut).
        quick = _call(client, "slow_compute", {"seconds": 0, "label": "now"})["result"]
        assert quick["resultType"] == "complete", quick
        # Required: a task, whose tool error is a completed task with isError...
        failing = _call(client, "failing_job", {})["result"]
        assert failing["resultType"] == "task", failing
        done = poll(client, failing["taskId"], lambda t: t["status"] != "working")
        assert done["status"] == "completed" and done["result"]["isError"], done
        assert done["result"]["content"][0]["text"] == (
            "This tool intentionally returns an error for testing"
        )
        # ...and whose fault is a JSON-RPC internal error: failed, with no result.
        crashed = _call(client, "protocol_error_job", {})["result"]
        failed = poll(client, crashed["taskId"], lambda t: t["status"] != "working")
        assert failed["status"] == "failed" and "result" not in failed, failed
        assert failed["error"]["code"] == -32603
        assert "RuntimeError" in failed["error"]["message"]
        assert "the job crashed" not in failed["error"]["message"]  # a fault's words stay in

        # A client that takes no tasks cannot call a tool that needs one: -32021.
        plain = TasksClient(http, server.url, key, declare=False)
        refused = _call(plain, "failing_job", {})
        assert refused["error"]["code"] == -32021, refused
        assert (
            "io.modelcontextprotocol/tasks"
            in refused["error"]["data"]["requiredCapabilities"]["extensions"]
        )
        # Another principal's task is as unknown as a made-up one.
        other = deployment.create_key("mallory").secret
        stranger = TasksClient(http, server.url, other)
        assert stranger.get(failing["taskId"])["error"]["code"] == -32602
