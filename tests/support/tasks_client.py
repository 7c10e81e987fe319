"""A small client side of the tasks extension (`io.modelcontextprotocol/tasks`), which the
SDK clients do not implement: 2026-07-28 JSON-RPC requests over HTTP that declare the
extension, with the `Mcp-Name` header set to the task id on tasks/* as it requires."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx2

from tests.support.raw_mcp import ACCEPT, MODERN, rpc_body

TASKS = "io.modelcontextprotocol/tasks"


class TasksClient:
    def __init__(self, http: httpx2.Client, url: str, key: str, *, declare: bool = True) -> None:
        self.http, self.url, self.key, self.declare = http, url, key, declare
        self._ids = 0

    def request(self, method: str, params: dict[str, Any], name: str | None = None) -> Any:
        """The JSON-RPC response (its `result` or its `error`)."""
        self._ids += 1
        capabilities: dict[str, Any] = {"elicitation": {"form": {}}}
        if self.declare:
            capabilities["extensions"] = {TASKS: {}}
        meta = {
            "io.modelcontextprotocol/protocolVersion": MODERN,
            "io.modelcontextprotocol/clientCapabilities": capabilities,
            "io.modelcontextprotocol/clientInfo": {"name": "tasks-test", "version": "1"},
        }
        headers = {
            "Authorization": f"Bearer {self.key}",
            **ACCEPT,
            "MCP-Protocol-Version": MODERN,
            "Mcp-Method": method,
        }
        if name is not None:
            headers["Mcp-Name"] = name
        response = self.http.post(
            self.url,
            headers=headers,
            json={
                "jsonrpc": "2.0",
                "id": self._ids,
                "method": method,
                "params": {**params, "_meta": meta},
            },
        )
        body = rpc_body(response)  # a JSON-RPC error may come with an HTTP error status
        assert response.status_code == 200 or "error" in body, response.text
        return body

    def execute(self, code: str) -> Any:
        return self.request(
            "tools/call", {"name": "execute", "arguments": {"code": code}}, name="execute"
        )

    def get(self, task_id: str) -> Any:
        return self.request("tasks/get", {"taskId": task_id}, name=task_id)

    def update(self, task_id: str, responses: dict[str, Any]) -> Any:
        return self.request(
            "tasks/update", {"taskId": task_id, "inputResponses": responses}, name=task_id
        )

    def cancel(self, task_id: str) -> Any:
        return self.request("tasks/cancel", {"taskId": task_id}, name=task_id)


def acked(answer: Any) -> bool:
    """An empty acknowledgement (the SDK stamps its serverInfo on every 2026 result)."""
    result = answer.get("result", {})
    return result.get("resultType") == "complete" and set(result) <= {"resultType", "_meta"}


def poll(client: TasksClient, task_id: str, until: Callable[[dict[str, Any]], bool]) -> Any:
    """tasks/get until `until` holds (each answer is read from the database)."""
    for _ in range(600):
        answer = client.get(task_id)
        assert "result" in answer, answer
        if until(answer["result"]):
            return answer["result"]
    raise AssertionError(f"task {task_id} never got there: {answer}")
