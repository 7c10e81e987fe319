"""Approval links over real HTTP (the real app, uvicorn, SQLite and PostgreSQL).

A paused call has one link: every answer that shows it (the MCP `execute` and `resume`
answers, on any session) gives the same URL, backed by one token row, and the link expires
on the runtime's clock, like the call's deadline.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import httpx2
import pytest
from sqlmodel import select

from machine.db.schema import ApprovalToken
from machine.runtime import Runtime
from tests.test_approval_page import (
    JSON,
    PRINCIPAL,
    TWO_WRITES,
    Served,
    assert_clear_page,
    assert_problem,
    serve,
    texts,
    token_of,
)


@pytest.fixture
def served(make_runtime: Callable[..., Runtime]) -> Iterator[Served]:
    with serve(make_runtime) as s:
        yield s


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


# -- one link per paused call ----------------------------------------------------------------


def test_every_answer_showing_a_paused_call_gives_the_same_link(served: Served) -> None:
    [first] = mcp_calls(served, ("execute", {"code": TWO_WRITES}))
    assert first["status"] == "waiting_for_interaction", first
    execution_id = first["executionId"]
    url = first["interaction"]["approvalUrl"]
    # The client asks again, twice (`resume` without an action): the same link.
    [again] = mcp_calls(
        served, ("resume", {"executionId": execution_id}), ("resume", {"executionId": execution_id})
    )[-1:]
    assert again["interaction"]["approvalUrl"] == url
    # Another session of the same client, later: still the same link.
    assert look_again(served, execution_id)["interaction"]["approvalUrl"] == url
    token = token_of(url)
    # The page and the API read it any number of times without minting or using anything.
    for _ in range(2):
        page = served.get(url.removeprefix(served.url))
        assert page.status_code == 200
        assert f'"token": "{token}"' in texts(page.text).by_id["data"]
        read = served.get(f"/api/executions/{execution_id}", headers={"X-Approval-Token": token})
        assert read.status_code == 200, read.text
    [row] = tokens_of(served, execution_id)
    assert row.call_seq == 1 and row.used_at is None

    # Deciding with the link uses it; the next call gets a link of its own, just as stable.
    assert decide(served, execution_id, token, "accept").json()["status"] == (
        "waiting_for_interaction"
    )
    second = look_again(served, execution_id)["interaction"]["approvalUrl"]
    assert second != url
    assert look_again(served, execution_id)["interaction"]["approvalUrl"] == second
    rows = sorted(tokens_of(served, execution_id), key=lambda r: r.call_seq)
    assert [(r.call_seq, r.used_at is not None) for r in rows] == [(1, True), (2, False)]


def test_answers_shown_at_once_still_give_one_link(served: Served) -> None:
    """Several clients asking at the same moment: the link is unique per call, so whoever
    mints second hands out the first one's link."""
    view = served.pause()
    answers: list[str] = []
    start = threading.Barrier(4)

    def ask() -> None:
        start.wait()
        answers.append(look_again(served, view.id)["interaction"]["approvalUrl"])

    threads = [threading.Thread(target=ask) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(answers) == 4 and len(set(answers)) == 1
    assert len(tokens_of(served, view.id)) == 1


# -- the runtime's clock ----------------------------------------------------------------------


@dataclass
class Clock:
    """A clock the test moves: the runtime reads every time from it."""

    now: datetime

    def __call__(self) -> datetime:
        return self.now


def test_a_link_expires_on_the_runtime_clock(make_runtime: Callable[..., Runtime]) -> None:
    # A month behind the wall clock: by the wall clock the call's deadline is long past.
    clock = Clock(datetime.now(UTC) - timedelta(days=30))
    with serve(make_runtime, clock=clock, approval_ttl=timedelta(hours=1)) as served:
        [answer] = mcp_calls(served, ("execute", {"code": TWO_WRITES}))
        execution_id, url = answer["executionId"], answer["interaction"]["approvalUrl"]
        deadline = datetime.fromisoformat(answer["expiresAt"])
        assert deadline == clock.now + timedelta(hours=1)
        [row] = tokens_of(served, execution_id)
        assert row.created_at == clock.now and row.expires_at == deadline

        # Just before the deadline on the runtime's clock, the link works.
        clock.now = deadline - timedelta(seconds=1)
        assert served.get(url.removeprefix(served.url)).status_code == 200
        assert look_again(served, execution_id)["interaction"]["approvalUrl"] == url

        # At the deadline it has expired, whatever the wall clock says.
        clock.now = deadline
        assert_clear_page(served.get(url.removeprefix(served.url)), 410, "expired")
        assert_problem(decide(served, execution_id, token_of(url), "accept"), 410)
        # And the call expires on that same clock: link and call end together.
        assert served.runtime.engine.get(execution_id, PRINCIPAL).status == "expired"
