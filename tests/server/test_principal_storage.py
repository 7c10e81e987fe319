"""What one principal may keep in the database, on a real server over loopback: a budget of
stored bytes per principal (its calls refused in its code, then its executions refused, while
another principal goes on), and finished executions purged whole after the retention period,
which gives the budget back."""

from __future__ import annotations

import json
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from tests.support.polling import wait_for
from tests.support.servers import (
    Deployment,
    create_key_directly,
    mcp_client,
    run,
    structured,
    text_of,
)

pytest_plugins = ["tests.support.servers"]

pytestmark = pytest.mark.slow

BUDGET = "LOCKGATE_MAX_STORED_BYTES_PER_PRINCIPAL"


async def execute(url: str, key: str, code: str) -> dict[str, Any]:
    async with mcp_client(url, key, "2026-07-28") as client:
        answer = await client.call_tool("execute", {"code": code})
        shown = structured(answer)
        if answer.is_error and "error" not in shown:
            shown["error"] = {"message": text_of(answer)}
        return shown


def rows(database_url: str, sql: str, **params: object) -> int:
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(text(sql), params).scalar_one())
    finally:
        engine.dispose()


def test_a_principal_keeps_no_more_than_its_budget(deployment: Deployment) -> None:
    server = deployment.start(**{BUDGET: "100000", "LOCKGATE_APPROVAL_MODE": "browser"})
    alice = create_key_directly(deployment.database_url, "alice")
    bob = create_key_directly(deployment.database_url, "bob")

    # A paused write of 60 kB: its arguments are kept (and counted) while it waits.
    paused = run(execute(server.url, bob, "tools.notes.write(key='big', text='x' * 60000)"))
    assert paused["status"] == "waiting_for_interaction", paused

    # The next 60 kB would go past the budget: the call is not made, and the code hears why.
    over = run(execute(server.url, bob, "tools.notes.write(key='more', text='y' * 60000)"))
    assert over.get("executionStatus") == "failed", over
    assert BUDGET in json.dumps(over), over
    assert "was not called" in json.dumps(over)

    # A finished execution's result is kept too; at the budget nothing more is started.
    kept = run(execute(server.url, bob, "'z' * 50000"))
    assert kept["status"] == "completed", kept
    refused = run(execute(server.url, bob, "1 + 1"))
    assert refused.get("error", {}).get("code") == "limit_reached", refused
    message = refused["error"]["message"]
    assert BUDGET in message and "The code was not started" in message, refused

    # Alice's executions are hers alone to count.
    assert run(execute(server.url, alice, "'a' * 50000"))["status"] == "completed"
    assert run(execute(server.url, alice, "1 + 1"))["status"] == "completed"


def test_finished_executions_are_purged_and_give_the_budget_back(
    deployment: Deployment,
) -> None:
    server = deployment.start(
        **{
            BUDGET: "60000",
            "LOCKGATE_FINISHED_RETENTION": "2",
            "LOCKGATE_SWEEP_INTERVAL": "1",
            "LOCKGATE_HEARTBEAT_INTERVAL": "1",
            "LOCKGATE_APPROVAL_MODE": "browser",
        }
    )
    bob = create_key_directly(deployment.database_url, "bob")
    url = deployment.database_url

    waiting = run(execute(server.url, bob, "tools.notes.write(key='k', text='still here')"))
    assert waiting["status"] == "waiting_for_interaction", waiting
    done = run(execute(server.url, bob, "tools.notes.list()\n'r' * 60000"))
    assert done["status"] == "completed", done
    finished = done["executionId"]
    assert rows(url, "SELECT COUNT(*) FROM tool_calls WHERE execution_id = :e", e=finished) == 1
    refused = run(execute(server.url, bob, "1"))
    assert refused.get("error", {}).get("code") == "limit_reached", refused

    # Past the retention period the finished execution goes, whole: its row, its journal and
    # its transitions. The one still waiting for a person stays.
    wait_for(
        lambda: rows(url, "SELECT COUNT(*) FROM executions WHERE id = :e", e=finished) == 0,
        timeout=30,
        what="the finished execution purged",
    )
    assert rows(url, "SELECT COUNT(*) FROM tool_calls WHERE execution_id = :e", e=finished) == 0
    assert (
        rows(
            url,
            "SELECT COUNT(*) FROM transition_log WHERE record_id = :e OR record_id LIKE :calls",
            e=finished,
            calls=f"{finished}:%",
        )
        == 0
    )
    still = rows(url, "SELECT COUNT(*) FROM executions WHERE id = :e", e=waiting["executionId"])
    assert still == 1

    # With the result purged, bob is within his budget again.
    assert run(execute(server.url, bob, "1 + 1"))["status"] == "completed"
