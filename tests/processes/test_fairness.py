"""One principal cannot starve another, against a real `lockgate serve` on loopback.

The attack: one principal sends several CPU-bound executions at once. Before per-principal
bounds they took every sandbox worker, and another principal's one-line call waited for the
whole wait budget and came back `running`. Now one principal's code occupies at most
LOCKGATE_MAX_WORKERS_PER_PRINCIPAL workers, and execute/resume beyond its running or paused
limit is refused with `limit_reached`, a tool error naming the setting.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.servers import (
    MODERN,
    Deployment,
    LockgateServer,
    create_key_directly,
    make_deployment,
    mcp_client,
    pause,
    run,
    structured,
    text_of,
    unique_key,
)

#: The fixtures (`deployment`, ...) are registered once for the session.
pytest_plugins = ["tests.support.servers"]

pytestmark = pytest.mark.slow

#: Computes for far longer than any test here lasts (the time limit below never fires).
BUSY = "x = 0\nfor i in range(10**9):\n    x += i\nx"
LIST = "tools.notes.list()"
#: A short wait budget: bob's call must be answered within it, while alice's busy code, which
#: runs much longer, answers `running` once it has passed.
BUDGET_SECS = "2"
LIMITS = {
    "LOCKGATE_WAIT_BUDGET_SECS": BUDGET_SECS,
    "LOCKGATE_MAX_DURATION_SECS": "120",
    "LOCKGATE_SANDBOX_WORKERS": "4",
    "LOCKGATE_MAX_WORKERS_PER_PRINCIPAL": "2",
    "LOCKGATE_MAX_RUNNING_PER_PRINCIPAL": "4",
}


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (the server's sandbox workers)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(entry))
    return found


def kill_with_workers(server: LockgateServer) -> None:
    """SIGKILL the server, then the sandbox workers it left computing: nobody is left to
    read their answer, and they would burn CPU until their time limit."""
    workers = _children(server.pid) if server.exited() is None else []
    server.kill()
    for pid in workers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def refusal(result: Any, setting: str) -> dict[str, Any]:
    """A `limit_reached` tool error naming `setting`, with no execution behind it."""
    body = structured(result)
    assert result.is_error, body
    assert body["status"] == "error", body
    error = body["error"]
    assert error["code"] == "limit_reached", body
    assert error["setting"] == setting, body
    assert setting in error["message"] and setting in text_of(result), body
    assert "Traceback" not in text_of(result)
    return body


@pytest.fixture(name="sqlite_deployment")
def sqlite_deployment_fixture(tmp_path: Path) -> Iterator[Deployment]:
    """Fairness is per instance: the database kind does not matter, so SQLite only."""
    made = make_deployment(f"sqlite:///{tmp_path / 'lockgate.db'}", tmp_path)
    try:
        yield made
    finally:
        made.stop_all()


def test_a_busy_principal_cannot_starve_another(sqlite_deployment: Deployment) -> None:
    deployment = sqlite_deployment
    alice = create_key_directly(deployment.database_url, "alice")
    bob = create_key_directly(deployment.database_url, "bob")
    server = deployment.start(name="fair", **LIMITS)

    async def busy() -> Any:
        async with mcp_client(server.url, alice, "legacy") as client:
            return await client.call_tool("execute", {"code": BUSY})

    async def scenario() -> None:
        async with mcp_client(server.url, alice, "legacy") as mine:
            paused = await pause(mine, unique_key())  # waiting for approval: not running

            # Five at once from alice: four are admitted and go on computing past the
            # budget; the fifth is refused, naming the limit.
            answers = await asyncio.gather(*(busy() for _ in range(5)))
            statuses = sorted(structured(a)["status"] for a in answers)
            assert statuses == ["error", "running", "running", "running", "running"], statuses
            [refused] = [a for a in answers if a.is_error]
            body = refusal(refused, "LOCKGATE_MAX_RUNNING_PER_PRINCIPAL")
            assert "4 executions running" in body["error"]["message"]
            assert "executionId" not in body  # nothing was started
            running = [structured(a)["executionId"] for a in answers if not a.is_error]

            # Bob's one-liner is answered within the budget, not `running`.
            async with mcp_client(server.url, bob, MODERN) as his:
                result = await his.call_tool("execute", {"code": LIST})
            done = structured(result)
            assert not result.is_error, done
            assert done["status"] == "completed", done
            assert isinstance(done["result"], list)

            # A decision counts as running work too: refused, and nothing was decided.
            decided = await mine.call_tool(
                "resume", {"executionId": paused["executionId"], "action": "accept"}
            )
            refusal(decided, "LOCKGATE_MAX_RUNNING_PER_PRINCIPAL")
            still = structured(
                await mine.call_tool("resume", {"executionId": paused["executionId"]})
            )
            assert still["status"] == "waiting_for_interaction", still

            # Alice's four were computing all along (waiting costs one budget, side by side).
            later = await asyncio.gather(
                *(mine.call_tool("resume", {"executionId": eid}) for eid in running)
            )
            assert [structured(r)["status"] for r in later] == ["running"] * 4

    try:
        run(scenario())
    finally:
        kill_with_workers(server)


def test_the_paused_limit_refuses_new_executions(deployment: Deployment) -> None:
    alice = create_key_directly(deployment.database_url, "alice")
    bob = create_key_directly(deployment.database_url, "bob")
    server = deployment.start(name="paused", LOCKGATE_MAX_PAUSED_PER_PRINCIPAL="2")

    async def scenario() -> None:
        async with mcp_client(server.url, alice, "legacy") as mine:
            first = await pause(mine, unique_key())
            await pause(mine, unique_key())

            result = await mine.call_tool("execute", {"code": LIST})
            body = refusal(result, "LOCKGATE_MAX_PAUSED_PER_PRINCIPAL")
            assert "2 unfinished executions, waiting for approval" in body["error"]["message"]
            assert "resume" in text_of(result)  # says how to make room
            assert "executionId" not in body

            # Only alice is held back.
            async with mcp_client(server.url, bob, MODERN) as his:
                assert structured(await his.call_tool("execute", {"code": LIST}))["status"] == (
                    "completed"
                )

            # Settling one makes room again.
            declined = structured(
                await mine.call_tool(
                    "resume", {"executionId": first["executionId"], "action": "decline"}
                )
            )
            assert declined["status"] == "completed", declined
            assert "refused" in declined["result"]
            again = structured(await mine.call_tool("execute", {"code": LIST}))
            assert again["status"] == "completed", again

    run(scenario())
