"""The drives of recovery: a paused run resumed by a later incarnation, calls cut off mid-run
(idempotent or not, recovered conservatively or not), a second instance taking over a
lapsed lease, and a database as an earlier version left it at a crash.
"""

from __future__ import annotations

from datetime import timedelta

from lockgate.machine.db.schema import ToolCall
from lockgate.machine.dispatcher import ExecutionRecord
from lockgate.machine.engine import Action
from lockgate.machine.runtime import Runtime
from lockgate.machine.sandbox import MONTY_VERSION, Suspended
from lockgate.machine.tools.registry import make_idempotency_key
from lockgate.machine.write_path import Step
from lockgate.simulation.scenario_steps import WRITE_THEN_READ, decide, started
from lockgate.simulation.world import Client, expect
from lockgate.spec import ExecutionStatus as E
from lockgate.spec import ToolCallStatus as C

#: Two reads, the second of a note that does not exist (the code catches its error).
READS_ONE_FAILING = (
    "a = tools.notes.list()\n"
    "try:\n"
    "    tools.notes.read(key='missing')\n"
    "except Exception:\n"
    "    pass\n"
    "len(a)"
)


def resume_after_restart(client: Client) -> None:
    started(client, "e", WRITE_THEN_READ)
    if not client.memory.get("restarted"):
        client.runtime = client.world.boot()
        client.memory["restarted"] = True
    view = decide(client, "e.id", Action.ACCEPT)
    assert view is not None
    expect(view.status in (E.COMPLETED, E.INTERRUPTED), f"resumed after restart: {view}")


def in_doubt_idempotent(client: Client) -> None:
    """An idempotent call sent intent first (it needed approval): cut off mid-dispatch, it is
    called again with the same key and the run completes."""
    started(client, "e", "a = tools.notes.list()\nlen(a)")
    view = decide(client, "e.id", Action.ACCEPT)
    assert view is not None
    final = client.get(view.id)
    expect(final.status == E.COMPLETED, f"an idempotent call left the run {final.status}")


def in_doubt_non_idempotent(client: Client) -> None:
    """A write approved by policy: a crash mid-dispatch must end interrupted, never twice."""
    view = started(client, "e", 'tools.notes.write(key="w", text="once")\n"done"')
    final = client.get(view.id)
    expect(final.status in (E.COMPLETED, E.INTERRUPTED), f"write ended {final.status}")
    if final.status == E.INTERRUPTED:
        expect(bool(final.what_ran), "an interrupted execution does not say what ran")


def conservative_recovery(client: Client) -> None:
    """Retries off: every call is journaled intent first (reads too, one failing inside the
    code), and a run cut off mid-call ends interrupted."""
    view = started(client, "e", READS_ONE_FAILING)
    final = client.get(view.id)
    expect(final.status in (E.COMPLETED, E.INTERRUPTED), f"conservative: {final.status}")


def conservative_approval(client: Client) -> None:
    """Retries off, and a write a person approved: a crash after the approval and before
    the dispatch ends the run interrupted, the approved call withdrawn unsent."""
    started(client, "e", WRITE_THEN_READ)
    view = decide(client, "e.id", Action.ACCEPT)
    assert view is not None
    final = client.get(view.id)
    expect(final.status in (E.COMPLETED, E.INTERRUPTED), f"conservative: {final.status}")


def lease_takeover(client: Client) -> None:
    """Two instances: a's work is left alone while its lease holds, then taken over."""
    world = client.world
    other = client.memory.get("b")
    if other is None or other not in world.runtimes:
        other = world.boot(name="sim-b")
        client.memory["b"] = other
    view = started(client, "e", "tools.notes.list()\n'ok'")
    world.clock.advance(timedelta(seconds=60))  # a stops heartbeating: its lease lapses
    other.maintain()
    other.engine.run_pending()
    final = other.engine.get(view.id, client.principal)
    expect(final.status in (E.COMPLETED, E.INTERRUPTED, E.PENDING), f"takeover: {final}")


#: The code of the run an earlier version left behind: one read, then a constant.
EARLIER_CODE = "tools.notes.list()\n'ok'"


def left_by_an_earlier_version(client: Client) -> None:
    """A database an earlier version left at a crash: a running execution checkpointed at
    its first call, whose row was committed on its own and rests in `requested` (this
    version commits a call's row with the policy's decision). The next incarnation takes it
    from there: with retries off recovery ends the run interrupted and withdraws the call;
    otherwise the requeued run decides the call now and completes."""
    if "e.id" not in client.memory:
        runtime = client.runtime
        ex = runtime.engine.begin(client.principal, client.code(EARLIER_CODE))
        client.memory["e.id"] = ex.id
        _checkpoint_as_an_earlier_version(runtime, ex, client.code(EARLIER_CODE))
        client.world.abandon(runtime)  # the crash that left it so
        client.runtime = client.world.boot()
    final = client.get(client.memory["e.id"])
    expect(final.status in (E.COMPLETED, E.INTERRUPTED), f"left by an earlier version: {final}")
    if final.status == E.COMPLETED:
        expect(final.result == "ok", f"it completed with {final.result!r}")


def _checkpoint_as_an_earlier_version(runtime: Runtime, ex: ExecutionRecord, code: str) -> None:
    """Commit the checkpoint at the run's first call with the call's row alone, in
    `requested`, as versions before the call's row committed with its decision did."""
    step = runtime.sandbox.start(code, principal=ex.typed.principal_id)
    expect(isinstance(step, Suspended), f"the code did not reach its call: {step}")
    assert isinstance(step, Suspended)
    now = runtime.engine.clock()
    row = ToolCall(
        id=make_idempotency_key(ex.id, 1),
        execution_id=ex.id,
        seq=1,
        tool=step.request.name.removeprefix("tools."),
        status=C.REQUESTED.value,
        idempotent=True,
        arguments={},
        arguments_preview={},
        created_at=now,
        updated_at=now,
    )
    runtime.engine.write.apply(
        Step(
            ex,
            "checkpoint",
            {"snapshot": step.snapshot},
            data={"calls_made": 1, "snapshot_call": 1, "runtime_version": MONTY_VERSION},
        ),
        inserts=[row],
    )
