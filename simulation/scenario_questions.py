"""The drives of a call whose tool asks its user (`desk.compose`, `simulation.desk`): its
questions answered one at a time, the execution cancelled while it waits, or left until its
deadline passes. Crashed at every point, each must end as a client may see it: the note
written once with the answers given, or nothing written. The first two are portable (a
real client answers and cancels with `resume`); the deadline's real-process drive is
`simulation.remote_single.questions_expire`."""

from __future__ import annotations

import contextlib
from datetime import timedelta

from pydantic import JsonValue

from lockgate.machine.engine import Action
from lockgate.machine.execution_errors import (
    ExecutionAlreadySettled,
    ExecutionExpired,
    ExecutionInterrupted,
)
from lockgate.machine.views import ExecutionView
from lockgate.simulation.desk import tag_answer, text_answer
from lockgate.simulation.scenario_steps import started
from lockgate.simulation.world import Client, expect
from lockgate.spec import ExecutionStatus as E

COMPOSE = 'tools.desk.compose(key="k")'
SETTLED = (ExecutionAlreadySettled, ExecutionExpired, ExecutionInterrupted)


def answer(client: Client, execution_id: str, answers: dict[str, JsonValue]) -> ExecutionView:
    """Answer as a client retries: an answer the server already has is ignored, and one that
    comes after the execution moved on is told so (then its outcome is read)."""
    try:
        return client.answer(execution_id, answers)
    except SETTLED:
        return client.get(execution_id)


def tool_asks(client: Client) -> None:
    view = started(client, "e", COMPOSE)
    answer(client, view.id, {"text": text_answer("v")})  # one of two: it waits on
    final = answer(client, view.id, {"tag": tag_answer("t")})
    expect(final.status in (E.COMPLETED, E.INTERRUPTED), f"answered run ended {final.status}")
    if final.status == E.COMPLETED:
        # Both answers reached the tool, whatever crashed between them.
        expect(final.result == {"key": "k", "text": "v #t"}, f"wrong result {final.result!r}")


def tool_asks_cancelled(client: Client) -> None:
    view = started(client, "e", COMPOSE)
    with contextlib.suppress(*SETTLED):  # cancelled before the crash
        client.resume(view.id, Action.CANCEL)  # a client's cancel: nothing to approve
    final = client.get(view.id)
    expect(final.status in (E.CANCELLED, E.INTERRUPTED), f"cancelled run ended {final.status}")


def tool_asks_expired(client: Client) -> None:
    view = started(client, "e", COMPOSE)
    client.world.clock.advance(timedelta(days=2))
    client.runtime.engine.expire_due()
    final = answer(client, view.id, {"text": text_answer("v"), "tag": tag_answer("t")})
    expect(final.status in (E.EXPIRED, E.INTERRUPTED), f"unanswered run ended {final.status}")
