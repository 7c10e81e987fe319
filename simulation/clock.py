"""Scenarios where only the clock moves: the sweeps run at and around every boundary.

Each boundary is crossed in three steps (one microsecond before it, exactly at it, one
microsecond after it) with a maintenance round at each, and at each step the stored state
must be what the spec's rule says for that instant: an approval expires when its deadline is
reached (`deadline <= now`), an instance's lease holds while `lease_until > now`, a session
lives until it has been idle for the idle timeout and, with work in flight, until its cap.
A crash during one of those rounds restarts the scenario; the clock never runs backwards, so
a step already passed is not checked again.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta

from lockgate.machine.db.schema import Execution
from lockgate.machine.engine import Action
from lockgate.machine.execution_errors import ExecutionExpired
from lockgate.machine.runtime import Runtime
from lockgate.simulation.concurrency import STALLED_CODE, Held, instance
from lockgate.simulation.world import Client, ScenarioFailed, expect
from lockgate.spec import CrashPoint
from lockgate.spec import ExecutionStatus as E
from lockgate.spec.session_lease import Alarm, LeasePolicy, decide_session_alarm

TICK = timedelta(microseconds=1)
WRITE_THEN_READ = 'tools.notes.write(key="k", text="v")\ntools.notes.read(key="k")'


def around(client: Client, boundary: datetime) -> Iterator[tuple[str, bool]]:
    """Move the clock to just before, at, and just after `boundary`; yields (where, whether
    the boundary is reached) for each instant the clock could still be set to."""
    for where, at in (("before", boundary - TICK), ("at", boundary), ("after", boundary + TICK)):
        if client.world.clock.now > at:
            continue  # passed before a crash restarted the scenario
        client.world.clock.now = at
        yield where, at >= boundary


def _execution(runtime: Runtime, execution_id: str) -> Execution:
    row = runtime.engine.store.executions.get(execution_id)
    if row is None:
        raise ScenarioFailed(f"execution {execution_id} is gone")
    return row


def approval_deadline(client: Client) -> None:
    """A paused execution across its approval deadline: waiting before it, expired from it
    on (found by the maintenance sweep), and a late decision is refused."""
    a = client.runtime
    if "e" not in client.memory:
        client.memory["e"] = a.engine.execute(client.principal, WRITE_THEN_READ).id
    execution_id: str = client.memory["e"]
    deadline = _execution(a, execution_id).deadline
    if deadline is None:
        raise ScenarioFailed("a paused execution has no deadline")
    for where, reached in around(client, deadline):
        client.runtime.maintain()
        status = _execution(client.runtime, execution_id).status
        want = E.EXPIRED if reached else E.WAITING_FOR_INTERACTION
        expect(status == want, f"{where} its deadline the execution is {status}, not {want}")
    with contextlib.suppress(ExecutionExpired):
        client.runtime.engine.resume(execution_id, client.principal, Action.ACCEPT)
        raise ScenarioFailed("a decision past the deadline was accepted")


def instance_lease(client: Client) -> None:
    """a stalls with an execution running while b keeps heartbeating: before a's lease ends
    b leaves a and its work alone; from the instant it ends b declares a dead and recovers
    the execution; then a wakes and finds it was declared dead."""
    b = instance(client, "sim-b")
    if client.memory.get("lease.done"):
        return
    a = client.runtime
    gate = client.world.faults.gate(
        CrashPoint.parse("tool_call:dispatch:approved->dispatched:before_commit")
    )
    with Held(gate, lambda: a.engine.execute(client.principal, STALLED_CODE), "a") as held:
        if gate.wait_until_held():
            row = a.engine.store.instances.get(a.lease.id)
            assert row is not None
            for where, reached in around(client, row.lease_until):
                b.lease.heartbeat()
                b.maintain()
                mine = b.engine.store.instances.get(a.lease.id)
                running = [
                    e.id for e in b.engine.store.executions.running() if e.owner == a.lease.id
                ]
                assert mine is not None
                dead = mine.status == "dead"
                expect(dead == reached, f"{where} a's lease ends, a is {mine.status}")
                if not reached:
                    expect(bool(running), f"{where} a's lease ends, its work was taken")
            b.engine.run_pending()
    client.memory["lease.done"] = True
    a.maintain()
    if gate.held:
        expect(a.fenced.is_set(), "a kept working after it was declared dead")
    if held.result is not None:
        view = b.engine.get(held.result.id, client.principal)
        expect(view.status in (E.COMPLETED, E.INTERRUPTED), f"a's work ended {view.status}")


def _open(client: Client, key: str) -> str:
    sessions = client.runtime.sessions

    def open_session() -> str:
        session_id = uuid.uuid4().hex
        sessions.open(
            session_id, client.principal, "2025-11-25", {"name": "sim", "version": "1"}, {}
        )
        sessions.end_request(session_id)
        return session_id

    session_id: str = client.remember(key, open_session)
    return session_id


def _session_boundary(
    key: str, busy: bool, boundary: Callable[[LeasePolicy, datetime], datetime]
) -> Callable[[Client], None]:
    """A session across `boundary`: alive or destroyed at each instant exactly as the spec's
    lease rule (`decide_session_alarm`) says. With `busy`, a request of the current
    incarnation is owed, which extends the session past its idle timeout up to its cap (a
    crash makes that request stale, and the session then ends at its idle timeout)."""

    def drive(client: Client) -> None:
        session_id = _open(client, key)
        sessions = client.runtime.sessions
        ledger = client.runtime.ledger
        if busy and "owed" not in client.memory:
            sessions.begin_request(session_id)
            client.memory["owed"] = ledger.owe(session_id, f"{key}-1", "tools/call", None)
            client.memory["owed.incarnation"] = client.runtime.lease.incarnation
        row = sessions.get(session_id)
        assert row is not None
        policy = sessions.policy
        last = row.last_activity
        for where, _ in around(client, boundary(policy, last)):
            client.runtime.maintain()
            now = client.world.clock()
            owed_here = busy and client.memory["owed.incarnation"] == (
                client.runtime.lease.incarnation
            )
            rule = decide_session_alarm(now, last, 0, 0, int(owed_here), policy)
            current = client.runtime.sessions.get(session_id)
            status = "gone" if current is None else str(current.status)
            alive = status in ("active", "idle")
            expect(
                alive == (rule.alarm is not Alarm.DESTROY),
                f"{where} the boundary the session is {status}; the lease rule says {rule.alarm}",
            )
        if busy:
            # The request's handler finishes (its client reads no answer here).
            ledger.answered(client.memory["owed"], lambda: None)

    return drive


def _idle_end(policy: LeasePolicy, last: datetime) -> datetime:
    return last + policy.idle_timeout


def _cap_end(policy: LeasePolicy, last: datetime) -> datetime:
    return last + policy.cap


session_idle = _session_boundary("idle", False, _idle_end)
session_cap = _session_boundary("capped", True, _cap_end)
