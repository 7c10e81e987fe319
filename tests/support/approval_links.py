"""What the approval-link tests (tests/test_approval_tokens.py and
tests/test_approval_signing_keys.py) share: tool calls in one real MCP client session,
asking again how an execution is doing, the link rows of an execution, deciding with a link,
and every value the links table holds, as a reader of the database sees them."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import anyio
import httpx2
from sqlalchemy import text
from sqlmodel import select

from lockgate.machine.db.schema import ApprovalToken
from tests.support.approval_app import JSON, Served


async def _mcp_calls(url: str, key: str, calls: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    from mcp.client import Client
    from mcp.client.streamable_http import streamable_http_client

    answers: list[Any] = []
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=30.0) as http,
        Client(streamable_http_client(f"{url}/mcp", http_client=http), mode="legacy") as client,
    ):
        for name, arguments in calls:
            result = await client.call_tool(name, arguments)
            assert not result.is_error, result
            assert result.structured_content is not None
            answers.append(dict(result.structured_content))
    return answers


def mcp_calls(served: Served, *calls: tuple[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Tool calls in one real MCP client session, as an agent's client makes them."""
    return anyio.run(_mcp_calls, served.url, served.key, list(calls))


def look_again(served: Served, execution_id: str) -> dict[str, Any]:
    """`resume` without an action: the client asks how the execution is doing."""
    [answer] = mcp_calls(served, ("resume", {"executionId": execution_id}))
    return answer


def tokens_of(served: Served, execution_id: str) -> list[ApprovalToken]:
    with served.runtime.engine.store.session() as s:
        return list(s.exec(select(ApprovalToken).where(ApprovalToken.execution_id == execution_id)))


def decide(served: Served, execution_id: str, token: str, action: str) -> httpx2.Response:
    return served.post(
        f"/api/executions/{execution_id}/resume",
        headers={**JSON, "X-Approval-Token": token, "Origin": served.url},
        json={"action": action},
    )


NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def stored_values(served: Served) -> list[str]:
    """Every value of every column of the links table, as a reader of the database (a
    leaked backup, a replica's user) sees them."""
    with served.runtime.engine.store.engine.connect() as conn:
        rows = conn.execute(text("SELECT * FROM approval_tokens")).mappings().all()
    found: list[str] = []
    for row in rows:
        for value in row.values():
            if value is None:
                continue
            found.append(str(value))
            if isinstance(value, datetime):
                found.append(value.isoformat())
    return list(dict.fromkeys(found))
