"""MCP 2025-11-25's tasks (the experimental `tasks` capability) on 2025 sessions, driven by
the official TypeScript SDK client's own tasks API (npm, pinned): a direct call that waits
for approval made a task, the server SIGKILLed and restarted, then `tasks/result` on a new
session asks the client's person (an elicitation naming the related task) and answers the
tool's result; `tasks/list`, `tasks/get`, `tasks/cancel`; a tool's task support enforced
(-32601); and 2026-07-28 does not speak these (tasks/result and tasks/list: -32601)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import httpx2
import pytest

from tests.support.direct_servers import direct_settings, sqlite_deployment_fixture  # noqa: F401
from tests.support.npm import NODE
from tests.support.server_deployment import Deployment
from tests.support.tasks_client import TasksClient
from tests.support.typescript_sdk import TS_CLIENT, ts_sdk_fixture  # noqa: F401  (fixture)


def _settings(folder: Path, effects: Path) -> dict[str, str]:
    return direct_settings(folder, effects, LOCKGATE_APPROVAL_MODE="native")  # its person decides


def ts_tasks(sdk: Path, url: str, key: str, step: str, argument: dict[str, Any]) -> list[Any]:
    """One step of tasks_2025.mjs: the events the TypeScript client saw."""
    done = subprocess.run(
        [str(NODE), str(TS_CLIENT / "tasks_2025.mjs"), url, key, step, json.dumps(argument)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "LOCKGATE_TS_SDK": str(sdk)},
    )
    events = [json.loads(x) for x in done.stdout.splitlines() if x.startswith("{")]
    assert done.returncode == 0 and events and events[0]["event"] == "connected", (
        f"{events}\n{done.stderr}"
    )
    # A 2025 session is told the server takes tasks of tools/call, lists and cancels them.
    assert events[0]["capabilities"]["tasks"] == {
        "list": {},
        "cancel": {},
        "requests": {"tools": {"call": {}}},
    }
    return events[1:]


@pytest.mark.slow
def test_a_2025_task_waits_for_approval_across_a_sigkill_and_asks_on_tasks_result(
    deployment: Deployment, tmp_path: Path, ts_sdk: Path
) -> None:
    effects = tmp_path / "effects"
    settings = _settings(tmp_path, effects)
    server = deployment.start(**settings)
    [key] = server.printed_keys()
    call = {"name": "confirm_delete", "arguments": {"filename": "old.log"}}

    [created] = ts_tasks(ts_sdk, server.url, key, "create", call)
    assert created["event"] == "created", created
    task = created["result"]["task"]
    assert task["status"] == "working" and task["ttl"] > 0, task
    task_id = task["taskId"]

    server.kill()
    again = deployment.start_at(server.port, **settings)
    [listed, newest] = ts_tasks(ts_sdk, again.url, key, "list", {})
    assert [t["taskId"] for t in listed["result"]["tasks"]] == [task_id]
    assert newest["result"]["status"] == "input_required", newest
    assert not effects.exists()

    *prompts, result = ts_tasks(ts_sdk, again.url, key, "result", {"taskId": task_id})
    [prompt] = prompts
    assert prompt["event"] == "prompt"
    assert prompt["params"]["_meta"]["io.modelcontextprotocol/related-task"] == {"taskId": task_id}
    assert "confirm_delete" in prompt["params"]["message"]
    assert result["event"] == "result", result
    answer = result["result"]
    assert answer["content"] == [{"type": "text", "text": "Deleted old.log."}], answer
    assert answer["_meta"]["io.modelcontextprotocol/related-task"] == {"taskId": task_id}
    [line] = effects.read_text().splitlines()
    assert line == f"{task_id}:1 old.log"

    # Ended: it cannot be cancelled any more (-32602).
    [refused] = ts_tasks(ts_sdk, again.url, key, "cancel", {"taskId": task_id})
    assert refused["event"] == "error" and refused["code"] == -32602, refused


@pytest.mark.slow
def test_the_sdk_s_task_stream_and_what_each_tool_allows(
    deployment: Deployment, tmp_path: Path, ts_sdk: Path
) -> None:
    server = deployment.start(**_settings(tmp_path, tmp_path / "effects"))
    [key] = server.printed_keys()
    # The SDK's callToolStream asks for a task where the listing allows one, polls, and
    # collects the result with tasks/result.
    streamed = ts_tasks(
        ts_sdk, server.url, key, "stream", {"name": "slow_compute", "arguments": {"seconds": 1}}
    )
    kinds = [event["event"] for event in streamed]
    assert kinds[0] == "taskCreated" and kinds[-1] == "result", streamed
    assert streamed[-1]["message"]["result"]["content"][0]["text"] == "computed  in 1 s"
    # A tool that forbids tasks, asked for one: -32601 in words.
    [forbidden] = ts_tasks(
        ts_sdk, server.url, key, "create", {"name": "greet", "arguments": {"name": "x"}}
    )
    assert forbidden["event"] == "error" and forbidden["code"] == -32601, forbidden
    assert "does not run as a task" in forbidden["message"]
    # A tool whose error answer ends its task `failed` (2025-11-25), the answer kept whole.
    [made] = ts_tasks(ts_sdk, server.url, key, "create", {"name": "failing_job", "arguments": {}})
    failed_id = made["result"]["task"]["taskId"]
    [result] = ts_tasks(ts_sdk, server.url, key, "result", {"taskId": failed_id})
    assert result["result"]["isError"] is True, result
    [_, newest] = ts_tasks(ts_sdk, server.url, key, "list", {})
    assert newest["result"]["taskId"] == failed_id
    assert newest["result"]["status"] == "failed", newest


def test_a_2026_request_does_not_speak_2025_s_tasks(deployment: Deployment, tmp_path: Path) -> None:
    server = deployment.start(**_settings(tmp_path, tmp_path / "effects"))
    [key] = server.printed_keys()
    with httpx2.Client(timeout=30) as http:
        client = TasksClient(http, server.url, key)
        for method, params in (("tasks/result", {"taskId": "x"}), ("tasks/list", {})):
            answer = client.request(method, params, name=params.get("taskId"))
            assert answer["error"]["code"] == -32601, (method, answer)
        # The 2025 `task` field on a 2026 call is ignored: the server decides.
        greeted = client.request(
            "tools/call",
            {"name": "greet", "arguments": {"name": "ada"}, "task": {"ttl": 1000}},
            name="greet",
        )["result"]
        assert greeted["resultType"] == "complete", greeted
        discovered = client.request("server/discover", {})["result"]
        assert "tasks" not in discovered["capabilities"], discovered
