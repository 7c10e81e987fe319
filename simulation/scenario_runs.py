"""The drives of the executions and approvals: runs with calls, code that fails, tools that
leak, and a paused call accepted, declined, cancelled, left to expire or decided twice.

Each is driven in process on one instance; those marked portable in the catalog run the
same drive against real processes.
"""

from __future__ import annotations

import contextlib
import threading
from datetime import timedelta

from lockgate.machine.engine import Action
from lockgate.machine.execution_errors import ExecutionAlreadySettled
from lockgate.simulation.canary import LEAKING_CODE
from lockgate.simulation.scenario_steps import WRITE_THEN_READ, at_once, decide, started
from lockgate.simulation.world import Client, expect
from lockgate.spec import ExecutionStatus as E

CATCH_DECLINE = (
    "try:\n    tools.notes.delete(key='k')\n    said = 'deleted'\n"
    "except PermissionError as e:\n    said = 'refused'\nsaid"
)


def plain(client: Client) -> None:
    view = started(client, "e", 'print("hello")\nlen(tools.notes.list())')
    final = client.get(view.id)
    expect(final.status in (E.COMPLETED, E.INTERRUPTED), f"plain run ended {final.status}")


def several_calls(client: Client) -> None:
    code = (
        "a = tools.notes.list()\n"
        "try:\n    tools.notes.read(key='missing')\nexcept RuntimeError:\n    pass\n"
        "b = tools.notes.list()\n[a, b]"
    )
    view = started(client, "e", code)
    final = client.get(view.id)
    expect(final.status in (E.COMPLETED, E.INTERRUPTED), f"several calls ended {final.status}")
    if final.status == E.COMPLETED:
        expect(final.result == [[], []], f"wrong result {final.result!r}")


def failing_code(client: Client) -> None:
    view = started(client, "e", "tools.notes.list()\nraise ValueError('broken')")
    final = client.get(view.id)
    expect(final.status in (E.FAILED, E.INTERRUPTED), f"failing code ended {final.status}")


def leaky_tools(client: Client) -> None:
    """Tools that put their secret in a result, an error message and an exception: only the
    engine's scrubbing keeps it out of what is stored and logged."""
    view = started(client, "e", LEAKING_CODE)
    final = client.get(view.id)
    expect(final.status in (E.COMPLETED, E.INTERRUPTED), f"leaky tools ended {final.status}")
    if final.status == E.COMPLETED:
        expect(
            isinstance(final.result, list) and len(final.result) == 3,
            f"the leaky tools answered {final.result!r}",
        )


def approval_accepted(client: Client) -> None:
    started(client, "e", WRITE_THEN_READ)
    view = decide(client, "e.id", Action.ACCEPT)
    assert view is not None
    expect(view.status in (E.COMPLETED, E.INTERRUPTED), f"accepted run ended {view.status}")
    if view.status == E.COMPLETED:
        expect(view.result == {"key": "k", "text": "v"}, f"wrong result {view.result!r}")


def approval_declined(client: Client) -> None:
    started(client, "e", CATCH_DECLINE)
    view = decide(client, "e.id", Action.DECLINE)
    assert view is not None
    expect(view.status == E.COMPLETED and view.result == "refused", f"declined: {view}")


def approval_cancelled(client: Client) -> None:
    started(client, "e", CATCH_DECLINE)
    view = decide(client, "e.id", Action.CANCEL)
    assert view is not None
    expect(view.status == E.COMPLETED and view.result == "refused", f"cancelled: {view}")


def execution_cancelled(client: Client) -> None:
    """The principal cancels a paused execution, then a queued one."""
    paused = started(client, "e", WRITE_THEN_READ)
    engine = client.runtime.engine
    with contextlib.suppress(ExecutionAlreadySettled):  # cancelled before the crash
        engine.cancel(paused.id, client.principal)
    queued = client.remember("q", lambda: engine.submit(client.principal, "1"))
    # Already cancelled before the crash, or recovery's boot round ran it first.
    with contextlib.suppress(ExecutionAlreadySettled):
        engine.cancel(queued, client.principal)
    expect(client.get(paused.id).status == E.CANCELLED, "the paused execution is not cancelled")


def approval_expired(client: Client) -> None:
    started(client, "e", WRITE_THEN_READ)
    client.world.clock.advance(timedelta(days=2))
    client.runtime.engine.expire_due()
    view = decide(client, "e.id", Action.ACCEPT)
    assert view is not None
    expect(view.status == E.EXPIRED, f"an overdue approval ended {view.status}")


def blocked_by_policy(client: Client) -> None:
    code = "try:\n    tools.notes.delete(key='k')\nexcept PermissionError:\n    r = 'blocked'\nr"
    view = started(client, "e", code)
    final = client.get(view.id)
    expect(final.status == E.COMPLETED and final.result == "blocked", f"blocked: {final}")


def duplicate_resume(client: Client) -> None:
    started(client, "e", WRITE_THEN_READ)
    first = decide(client, "e.id", Action.ACCEPT)
    second = decide(client, "e.id", Action.ACCEPT)
    assert first is not None and second is not None
    expect(first.status == second.status, "the same decision gave two outcomes")


def concurrent_resume(client: Client) -> None:
    started(client, "e", WRITE_THEN_READ)
    barrier = threading.Barrier(2)
    answers: list[object] = []
    failures: list[BaseException] = []

    def resume() -> None:
        barrier.wait()
        try:
            answers.append(decide(client, "e.id", Action.ACCEPT))
        except BaseException as exc:  # an injected crash in a thread is the process's death
            failures.append(exc)

    at_once(resume, resume, failures=failures)
    expect(len(answers) == 2, "a resume went unanswered")
