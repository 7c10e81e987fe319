"""The real-process drives of the single-instance scenarios that cannot use their in-process
drive: an approval's deadline (or a tool's questions') passing in real time, a restart
between pause and decision, a graceful shutdown, a drain (SIGTERM) that catches code
running, and the leaky tools.

A restart here is what an operator does: SIGTERM, wait for the exit, start the server again
under the same name.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable

from lockgate.machine.db.audit_queries import AuditQueries
from lockgate.machine.engine import Action
from lockgate.machine.tools.notes import NotesSource
from lockgate.simulation.canary import LEAKING_CODE
from lockgate.simulation.desk import tag_answer, text_answer
from lockgate.simulation.remote_client import SETTLED, RemoteClient, stored_status, wait
from lockgate.simulation.scenario_drains import spin_code
from lockgate.simulation.scenario_questions import COMPOSE, answer
from lockgate.simulation.scenario_steps import WRITE_THEN_READ, decide, started
from lockgate.simulation.scenarios import by_name
from lockgate.simulation.world import expect
from lockgate.spec import ExecutionStatus as E


def approval_expires(client: RemoteClient) -> None:
    """A paused execution waits until its deadline (two seconds here), then expires; a late
    decision is refused."""
    view = started(client, "e", WRITE_THEN_READ)  # type: ignore[arg-type]
    row = client.execution_row(view.id)
    deadline = row.deadline if row is not None else None
    expect(deadline is not None, "a paused execution has no deadline")
    wait(client, lambda: stored_status(client, view.id) == E.EXPIRED, "the approval expires")
    expect(client.get(view.id).status == E.EXPIRED, "the expired execution is read otherwise")
    after = decide(client, "e.id", Action.ACCEPT)  # type: ignore[arg-type]
    expect(after is not None and after.status == E.EXPIRED, f"a late decision gave {after}")


def questions_expire(client: RemoteClient) -> None:
    """A tool's questions wait until the call's deadline (two seconds here), then expire
    with it; answers that come later are refused, and nothing is written."""
    view = started(client, "e", COMPOSE)  # type: ignore[arg-type]
    wait(client, lambda: stored_status(client, view.id) == E.EXPIRED, "the questions expire")
    late = {"text": text_answer("v"), "tag": tag_answer("t")}
    final = answer(client, view.id, late)  # type: ignore[arg-type]
    expect(final.status == E.EXPIRED, f"late answers gave {final.status}")


def resume_after_restart(client: RemoteClient) -> None:
    started(client, "e", WRITE_THEN_READ)  # type: ignore[arg-type]
    if not client.memory.get("restarted"):
        _graceful_restart(client)
        client.memory["restarted"] = True
    view = decide(client, "e.id", Action.ACCEPT)  # type: ignore[arg-type]
    expect(
        view is not None and view.status in (E.COMPLETED, E.INTERRUPTED), f"after restart: {view}"
    )


def _graceful_restart(client: RemoteClient) -> None:
    server = client.server
    status = client.deployment.stop(server)
    expect(status == 0, f"SIGTERM ended {server.name} with status {status}")
    client.server = client.deployment.start(server.name)


def graceful_shutdown(client: RemoteClient) -> None:
    started(client, "e", "tools.notes.list()")  # type: ignore[arg-type]
    if not client.memory.get("closed"):
        _graceful_restart(client)
        client.memory["closed"] = True


#: About three seconds of pure code after a call: long enough to SIGTERM it mid-run.
REMOTE_SPIN_ITERATIONS = 30_000_000
REMOTE_SPIN_CODE = spin_code(REMOTE_SPIN_ITERATIONS)
#: What a stop may take beyond the drain's bound (the app's shutdown, the interpreter's exit).
STOP_MARGIN_SECS = 3.0


def _spin_ids(client: RemoteClient) -> list[str]:
    executions = AuditQueries(client.deployment.db).executions()
    return [row.id for row in executions if row.code == REMOTE_SPIN_CODE]


def _spinning(client: RemoteClient) -> bool:
    """A spinning execution is past its first call (the code after it runs). The call is a
    read made at once, not journaled before the next durable commit: the tool's own log
    says it ran."""
    made = {
        str(e["idempotency_key"])
        for e in NotesSource(client.deployment.workdir / "notes").effects()
    }
    for row in AuditQueries(client.deployment.db).executions():
        spinning = row.code == REMOTE_SPIN_CODE and row.status == E.RUNNING
        if spinning and f"{row.id}:1" in made:
            return True
    return False


def drain_while_running(client: RemoteClient) -> None:
    """SIGTERM while code runs past its first call: the server exits 0 within its drain
    bound, its execution handed back; the server started again under the same name runs it
    to its result, which the client then reads."""
    if not client.memory.get("draining"):
        server = client.server

        def execute() -> None:
            # Cut off by the drain (-32010, or the connection closing): the invariants judge
            # the ledger; the client finds its execution by the code it sent.
            with contextlib.suppress(Exception):
                client.execute(REMOTE_SPIN_CODE, server)

        worker = threading.Thread(target=execute, name="spin", daemon=True)
        worker.start()
        try:
            wait(client, lambda: _spinning(client), "the code runs past its first call")
            client.memory["draining"] = True  # a death from here on is the drain's
            began = time.monotonic()
            status = client.deployment.stop(server)
            took = time.monotonic() - began
        finally:
            worker.join()
        bound = float(by_name("drain_while_running").real_process_settings["drain_timeout"])
        expect(status == 0, f"SIGTERM ended {server.name} with status {status}")
        expect(took < bound + STOP_MARGIN_SECS, f"the stop took {took:.1f} s (bound {bound:g} s)")
        client.server = client.deployment.start(server.name)
    for execution_id in _spin_ids(client):
        wait(client, _settles(client, execution_id), "the drained execution settles")
        final = client.get(execution_id)
        expect(
            final.status == E.COMPLETED and final.result == REMOTE_SPIN_ITERATIONS,
            f"the drained execution ended {final.status} with {final.result!r}",
        )


def _settles(client: RemoteClient, execution_id: str) -> Callable[[], bool]:
    return lambda: stored_status(client, execution_id) in SETTLED


def leaky_tools(client: RemoteClient) -> None:
    view = started(client, "e", LEAKING_CODE)  # type: ignore[arg-type]
    final = client.get(view.id)
    expect(final.status in (E.COMPLETED, E.INTERRUPTED), f"leaky tools ended {final.status}")
