"""What the harness's client knows: the executions it started, its sessions, what it received.

The answer checks compare the database with this knowledge, so it is kept the way a client
would keep it: an execution's id is known once an answer returned it (or, when the answer
was cut off by a crash, once the client found it in its principal's list), and its program
is the code the client sent.
"""

from __future__ import annotations

from sqlmodel import Session, select

from lockgate.machine.db.schema import Execution, ToolCall
from lockgate.simulation.inbox import Inbox
from lockgate.spec import ExecutionStatus as E
from lockgate.spec import ToolCallStatus as C
from tests.support.lifecycle.deployment import Deployment
from tests.support.lifecycle.programs import PROGRAM_BY_CODE, Program


class Client:
    """The client's side of the deployment, and what it reads of its executions."""

    def __init__(self, deployment: Deployment) -> None:
        self.deployment = deployment
        #: Execution id -> what the client knows of it, in the order it learned them.
        self.executions: dict[str, Program] = {}
        #: Client answers no client should ever get.
        self.problems: list[str] = []
        #: The client's sessions (opened by its `initialize`), and what it received on them.
        self.sessions: list[str] = []
        self.inbox = Inbox()
        self._requests = 0

    def request_id(self) -> str:
        self._requests += 1
        return f"q{self._requests}"

    def statuses(self) -> dict[str, str]:
        with Session(self.deployment.engine) as s:
            rows = s.exec(select(Execution.id, Execution.status)).all()
        return {row[0]: row[1] for row in rows}

    def paused(self) -> list[str]:
        """The known executions waiting for a decision, in the order the client learned them."""
        stored = self.statuses()
        return [i for i in self.executions if stored.get(i) == E.WAITING_FOR_INTERACTION]

    def awaiting(self, status: C) -> list[str]:
        """The known paused executions whose call waits in `status`: a person's decision
        (`awaiting_approval`) or its user's answers (`awaiting_input`)."""
        with Session(self.deployment.engine) as s:
            waiting = set(
                s.exec(
                    select(Execution.id)
                    .join(ToolCall, ToolCall.execution_id == Execution.id)  # type: ignore[arg-type]
                    .where(ToolCall.seq == Execution.snapshot_call, ToolCall.status == status)
                ).all()
            )
        return [i for i in self.paused() if i in waiting]

    def discover(self) -> None:
        """Executions stored by an action cut off before the client got the id (it finds
        them in its principal's list); the program is known by its code."""
        with Session(self.deployment.engine) as s:
            rows = s.exec(select(Execution.id, Execution.code, Execution.created_at)).all()
        for execution_id, code, _ in sorted(rows, key=lambda r: (r[2], r[1])):
            program = PROGRAM_BY_CODE.get(code)
            if execution_id not in self.executions and program is not None:
                self.deployment.note(f"found {program.name} {execution_id}")
                self.executions[execution_id] = program

    def overdue(self, execution_id: str) -> bool:
        """Whether the execution's approval deadline has passed on the simulated clock."""
        with Session(self.deployment.engine) as s:
            row = s.get(Execution, execution_id)
        return (
            row is not None and row.deadline is not None and self.deployment.clock() >= row.deadline
        )
