"""The drives of recovery: a paused run resumed by a later incarnation, calls cut off mid-run
(idempotent or not, recovered conservatively or not), and a second instance taking over a
lapsed lease.
"""

from __future__ import annotations

from datetime import timedelta

from lockgate.machine.engine import Action
from lockgate.simulation.scenario_steps import WRITE_THEN_READ, decide, started
from lockgate.simulation.world import Client, expect
from lockgate.spec import ExecutionStatus as E


def resume_after_restart(client: Client) -> None:
    started(client, "e", WRITE_THEN_READ)
    if not client.memory.get("restarted"):
        client.runtime = client.world.boot()
        client.memory["restarted"] = True
    view = decide(client, "e.id", Action.ACCEPT)
    assert view is not None
    expect(view.status in (E.COMPLETED, E.INTERRUPTED), f"resumed after restart: {view}")


def in_doubt_idempotent(client: Client) -> None:
    """An idempotent call: after any crash it is called again and the run completes."""
    view = started(client, "e", "a = tools.notes.list()\nlen(a)")
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
    view = started(client, "e", "a = tools.notes.list()\nb = tools.notes.list()\n'ok'")
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
