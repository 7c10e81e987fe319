"""The scenario client over real interfaces, and what it reads of the deployment.

`RemoteClient` offers what a portable scenario's drive uses (execute, resume, answer, get, memory)
through MCP over HTTP with the official client, one 2025 session per call, and reads each
execution's status exactly as the server states it (`executionStatus`). A server that dies
mid-request is a `ProcessKilled`, which the run answers by restarting it, as a supervisor
would. The real-process drives poll the deployment's database here, as an operator would.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from pydantic import JsonValue

from lockgate.machine.db.audit_queries import AuditQueries
from lockgate.machine.db.execution_queries import ExecutionQueries
from lockgate.machine.db.schema import Execution
from lockgate.machine.engine import Action
from lockgate.machine.errors import LockgateError
from lockgate.machine.execution_errors import (
    ExecutionAlreadySettled,
    ExecutionExpired,
    ExecutionInterrupted,
    ExecutionNotFound,
)
from lockgate.simulation.inbox import Inbox
from lockgate.simulation.real_process import Deployment, ProcessKilled, ServerProcess, until
from lockgate.simulation.world import ScenarioFailed
from lockgate.spec import ExecutionStatus as E

#: The statuses an execution ends in, which the drives wait for.
SETTLED = (E.COMPLETED, E.INTERRUPTED, E.FAILED)


@dataclass(frozen=True)
class RemoteView:
    """What a client learns of an execution from the MCP answers."""

    id: str
    status: E
    result: JsonValue = None
    error: JsonValue = None
    what_ran: JsonValue = None


_ERRORS: dict[str, Callable[[str, dict[str, Any], str], LockgateError]] = {
    "execution_not_found": lambda eid, e, s: ExecutionNotFound(execution_id=eid),
    "execution_expired": lambda eid, e, s: ExecutionExpired(execution_id=eid, deadline=None),
    "execution_already_settled": lambda eid, e, s: ExecutionAlreadySettled(
        execution_id=eid, status=s, detail="answered remotely"
    ),
    "execution_interrupted": lambda eid, e, s: ExecutionInterrupted(
        execution_id=eid, what_ran=e.get("what_ran")
    ),
}


class RemoteClient:
    """The scenario client against a deployment (its memory outlives every restart)."""

    def __init__(self, deployment: Deployment) -> None:
        self.deployment = deployment
        self.server = deployment.start("sim-a")
        self.principal = "sim"
        self.memory: dict[str, Any] = {}
        self.inbox = Inbox()

    def remember(self, key: str, compute: Any) -> Any:
        if key not in self.memory:
            self.memory[key] = compute()
        return self.memory[key]

    def call(
        self, tool: str, arguments: dict[str, Any], server: ServerProcess | None = None
    ) -> dict[str, Any]:
        """One tool call on a new 2025 session of `server` (the client's current one)."""
        target = server or self.server

        async def call() -> dict[str, Any]:
            headers = {"Authorization": f"Bearer {self.deployment.key}"}
            async with httpx2.AsyncClient(headers=headers, timeout=90) as http:
                transport = streamable_http_client(f"{target.url}/mcp", http_client=http)
                async with Client(transport, mode="legacy") as client:
                    result = await client.call_tool(tool, arguments)
                    return dict(result.structured_content or {})

        try:
            return asyncio.run(call())
        except BaseException as exc:  # the server died mid-request: a transport failure
            if died(target):
                raise ProcessKilled(
                    f"{target.name} died ({target.proc.returncode})", target
                ) from exc
            raise

    def _view(
        self, tool: str, arguments: dict[str, Any], server: ServerProcess | None = None
    ) -> RemoteView:
        answer = self.call(tool, arguments, server)
        status = str(answer.get("status"))
        eid = str(answer.get("executionId", arguments.get("executionId", "")))
        exact = answer.get("executionStatus")
        error = answer.get("error")
        if status in _ERRORS:
            raise _ERRORS[status](eid, error if isinstance(error, dict) else {}, str(exact))
        if exact is None:
            raise ScenarioFailed(f"an answer without the execution's status: {answer}")
        return RemoteView(eid, E(str(exact)), answer.get("result"), error)

    def execute(self, code: str, server: ServerProcess | None = None) -> RemoteView:
        return self._view("execute", {"code": code}, server)

    def resume(
        self, execution_id: str, action: Action, server: ServerProcess | None = None
    ) -> RemoteView:
        return self._view("resume", {"executionId": execution_id, "action": str(action)}, server)

    def answer(
        self, execution_id: str, answers: dict[str, JsonValue], server: ServerProcess | None = None
    ) -> RemoteView:
        """Answers to what a paused call's tool asked, by question key (`resume`'s
        `answers`: the door of a client that can be asked nothing)."""
        return self._view("resume", {"executionId": execution_id, "answers": answers}, server)

    def get(self, execution_id: str, server: ServerProcess | None = None) -> RemoteView:
        """The execution as it is, its status exactly as the server states it (final
        outcomes that `resume` answers as errors included)."""
        try:
            return self._view("resume", {"executionId": execution_id}, server)
        except ExecutionInterrupted as exc:
            return RemoteView(execution_id, E.INTERRUPTED, what_ran=exc.what_ran)
        except ExecutionExpired:
            return RemoteView(execution_id, E.EXPIRED)
        except ExecutionAlreadySettled as exc:
            return RemoteView(execution_id, E(exc.status))

    # -- the deployment's database, read as an operator would --------------------------------

    def execution_row(self, execution_id: str) -> Execution | None:
        return ExecutionQueries(self.deployment.db).get(execution_id)

    def instance_status(self, name: str) -> str | None:
        rows = [row for row in AuditQueries(self.deployment.db).instances() if row.name == name]
        return max(rows, key=lambda r: r.incarnation).status if rows else None


def died(server: ServerProcess) -> bool:
    """Whether `server` exited (given a few seconds: a failed request comes before the exit
    is seen), which makes a transport failure the process's death."""
    try:
        server.proc.wait(timeout=5)
    except Exception:
        return False
    return True


#: A real-process drive: run from the top again after each crash, as the in-process ones are.
RemoteDrive = Callable[[RemoteClient], None]


def wait(client: RemoteClient, condition: Callable[[], bool], what: str) -> None:
    """`until`, noticing a server that died meanwhile (its maintenance loop reached the
    armed point while the client waited): the run restarts it, as its supervisor would."""

    def alive_and(condition: Callable[[], bool] = condition) -> bool:
        client.deployment.check_alive()
        return condition()

    until(alive_and, what)


def stored_status(client: RemoteClient, execution_id: str) -> str | None:
    """Polled in the database, as an operator would (polling through MCP would open a
    session per look, and the principal's request rate is bounded)."""
    row = client.execution_row(execution_id)
    return row.status if row is not None else None
