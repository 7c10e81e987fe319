"""The checks the generated tests run after every step, beyond the spec replay.

Every known execution must have answered what its program gives for the decisions recorded
on its calls (or ended expired, cancelled or interrupted, which any execution may), and
`simulation.invariants.check_all` must find nothing in what is persisted. `report` writes a
failure message with what the harness did and the persisted history of the records involved.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sqlalchemy import Engine
from sqlmodel import Session, col, select

from lockgate.machine.db.schema import Execution, ToolCall
from lockgate.machine.engine import Action
from lockgate.simulation.invariants import Violation, check_all, history
from lockgate.simulation.world import CANARY
from lockgate.spec import ExecutionStatus as E
from lockgate.spec import ToolCallStatus as C
from tests.support.lifecycle.client import Client
from tests.support.lifecycle.deployment import Deployment
from tests.support.lifecycle.programs import ALSO_LEGITIMATE, ANY


def _error_code(outcome: Mapping[str, object]) -> object:
    error = outcome.get("error")
    return error.get("code") if isinstance(error, dict) else None


def decisions(engine: Engine) -> dict[str, tuple[str, ...]]:
    """Per execution, the decisions recorded on its calls in call order ("answered" for a
    call that asked its user and got every answer)."""
    with Session(engine) as s:
        calls = list(s.exec(select(ToolCall).order_by(col(ToolCall.seq))))
    out: dict[str, list[str]] = {}
    for call in calls:
        decision = call.decision
        if call.input is not None and call.status not in (C.AWAITING_INPUT, C.WITHDRAWN, C.EXPIRED):
            out.setdefault(call.execution_id, []).append("answered")
        elif isinstance(decision, dict):
            action = decision.get("action")
            out.setdefault(call.execution_id, []).append(
                "accept" if action == Action.ACCEPT else "decline"
            )
    return {k: tuple(v) for k, v in out.items()}


def wrong_answers(engine: Engine, client: Client) -> list[str]:
    """Client-level problems, and every known execution whose stored answer is not what
    its program gives for the decisions recorded."""
    out = list(client.problems)
    decided = decisions(engine)
    with Session(engine) as s:
        rows = {r.id: r for r in s.exec(select(Execution))}
    for execution_id, program in client.executions.items():
        row = rows.get(execution_id)
        if row is None:
            out.append(f"{execution_id} ({program.name}) was never stored")
            continue
        status = E(row.status)
        if status in (E.PENDING, E.RUNNING) or status in ALSO_LEGITIMATE:
            continue
        made = decided.get(execution_id, ())
        expected = program.outcomes.get(made)
        outcome = row.outcome if isinstance(row.outcome, dict) else {}
        said = f"{execution_id} ({program.name}, decisions {made})"
        if expected is None:
            out.append(f"{said} is {status}; the program has no answer for those decisions")
        elif status != expected.status:
            out.append(f"{said} is {status}, expected {expected.status}: {outcome.get('error')}")
        elif expected.result is not ANY and outcome.get("result") != expected.result:
            out.append(f"{said} returned {outcome.get('result')!r}, not {expected.result!r}")
        elif expected.error_code is not ANY and _error_code(outcome) != expected.error_code:
            out.append(f"{said} failed with {outcome.get('error')!r}")
    return out


def violations(deployment: Deployment, client: Client) -> list[Violation]:
    """`simulation.invariants.check_all` on what is persisted (quiescent: nothing runs;
    a lost report may wait for its live session's next GET, a durable wait)."""
    return check_all(
        deployment.engine,
        deployment.world.notes.effects(),
        deployment.capture.lines,
        CANARY,
        quiescent=True,
        reports_may_wait=True,
        inbox=client.inbox,
    )


def report(deployment: Deployment, problems: Sequence[object], records: Sequence[str] = ()) -> str:
    """A failure message: the problems, what the harness did, and the records' history."""
    lines = [f"  {p}" for p in problems]
    lines += ["what the harness did (latest last):", *(f"  {t}" for t in deployment.trace[-40:])]
    if records:
        lines += [
            "persisted transitions:",
            *(f"  {h}" for h in history(deployment.engine, records)),
        ]
    return "\n".join(lines)
