"""Concurrency under crashes, made deterministic with gates.

A real race depends on timing; a simulated one must not. Each scenario here holds one
instance's thread at a chosen point of its write path (a `machine.faults.Gate`: as if that
process stalled there), makes the other instances do what they would meanwhile (let its
lease lapse, declare it dead, recover its work, decide), then opens the gate, and the held
thread goes on with what it read before the stall. The sweep crashes each of these runs at
every point they pass as well, so every interleaving here is also crashed.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from datetime import timedelta
from types import TracebackType
from typing import Any

from lockgate.machine.engine import Action
from lockgate.machine.errors import LockgateError
from lockgate.machine.faults import GATE_LIMIT_SECS, Gate, InjectedCrash
from lockgate.machine.runtime import Runtime
from lockgate.simulation.world import Client, ScenarioFailed
from lockgate.spec import CrashPoint
from lockgate.spec import ExecutionStatus as E

#: An auto-approved write (policy `notes.write=approve`, so it is not idempotent) and then an
#: idempotent read: a stall anywhere in it leaves something recovery must decide on.
STALLED_CODE = 'tools.notes.write(key="s", text="1")\nlen(tools.notes.list())'
WRITE_THEN_READ = 'tools.notes.write(key="k", text="v")\ntools.notes.read(key="k")'
SETTLED = (E.COMPLETED, E.INTERRUPTED, E.FAILED)


class Held:
    """A thread running `work` that the simulator expects to be held at `gate`.

    Leaving the block opens the gate and joins the thread. The thread's injected crash (its
    process died) is re-raised in the driving thread, so the sweep restarts as it would for
    any crash; any other unexpected exception is a failed scenario.
    """

    def __init__(self, gate: Gate, work: Callable[[], Any], name: str) -> None:
        self.gate, self.work = gate, work
        self.result: Any = None
        self.crash: InjectedCrash | None = None
        self.refused: LockgateError | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self) -> None:
        try:
            self.result = self.work()
        except InjectedCrash as crash:
            self.crash = crash
        except LockgateError as refused:  # an answer a client may get (already settled...)
            self.refused = refused
        except BaseException as exc:
            self.error = exc
        finally:
            self.gate.give_up()  # never leaves the driver waiting for an arrival

    def __enter__(self) -> Held:
        self.thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.gate.open()
        self.thread.join(GATE_LIMIT_SECS)
        if kind is not None:
            return  # the driver's own exception (its crash) wins
        if self.crash is not None:
            raise self.crash
        if self.error is not None:
            raise ScenarioFailed(
                f"{self.thread.name} failed with {type(self.error).__name__}: {self.error}"
            )


def instance(client: Client, name: str) -> Runtime:
    """Instance `name` of the client's world, booted once (again after a crash killed it)."""
    runtime: Runtime | None = client.memory.get(name)
    if runtime is None or runtime not in client.world.runtimes or runtime.fenced.is_set():
        runtime = client.world.boot(name=name)
        client.memory[name] = runtime
    return runtime


def _lapse(client: Client, stalled: Runtime, *awake: Runtime) -> None:
    """Time passes beyond the stalled instance's lease; the instances that are awake renew
    theirs on their next heartbeat, as their maintenance loops would."""
    client.world.clock.advance(stalled.settings.lease_ttl + timedelta(seconds=1))
    for runtime in awake:
        runtime.lease.heartbeat()


def _settled(client: Client, runtime: Runtime, key: str) -> None:
    execution_id = client.memory.get(key)
    if execution_id is None:
        return  # the stalled thread never answered: the whole-database checks cover it
    view = runtime.engine.get(execution_id, client.principal)
    if view.status not in SETTLED:
        raise ScenarioFailed(f"the stalled execution ended {view.status}")


def stalled_at(point_name: str) -> Callable[[Client], None]:
    """Instance a stalls at `point_name` while running code; its lease lapses; b declares it
    dead, recovers the execution and runs it; then a wakes up and goes on. a's writes must
    be refused (fenced), a's next heartbeat must tell it it is dead, and nothing is done
    twice that may not be."""
    point = CrashPoint.parse(point_name)

    def drive(client: Client) -> None:
        b = instance(client, "sim-b")
        if not client.memory.get("stall.done"):
            a = client.runtime
            gate = client.world.faults.gate(point)
            with Held(gate, lambda: a.engine.execute(client.principal, STALLED_CODE), "a") as held:
                if gate.wait_until_held():
                    _lapse(client, a, b)
                    b.maintain()
                    b.engine.run_pending()
            if held.result is not None:
                client.memory["e"] = held.result.id
            client.memory["stall.done"] = True
            client.memory["stall.held"] = gate.held
            a.maintain()  # its first heartbeat after the stall
            if gate.held and not a.fenced.is_set():
                raise ScenarioFailed("a kept working after it was declared dead")
        _settled(client, b, "e")

    return drive


def two_recoverers(client: Client) -> None:
    """a stalls mid-run; b and c both recover its work: b is held just before its requeue
    commits while c recovers and runs the execution; then b goes on. Exactly one requeue
    wins, the loser moves on, and the execution runs once."""
    b, c = instance(client, "sim-b"), instance(client, "sim-c")
    if not client.memory.get("stall.done"):
        a = client.runtime
        stall = client.world.faults.gate(
            CrashPoint.parse("tool_call:dispatch:approved->dispatched:before_commit")
        )
        with Held(stall, lambda: a.engine.execute(client.principal, STALLED_CODE), "a") as held:
            if stall.wait_until_held():
                _lapse(client, a, b, c)
                requeue = client.world.faults.gate(
                    CrashPoint.parse("execution:requeue:running->pending:before_commit")
                )
                with Held(requeue, b.maintain, "b recovering"):
                    if requeue.wait_until_held():
                        c.maintain()
                        c.engine.run_pending()
                b.engine.run_pending()
        if held.result is not None:
            client.memory["e"] = held.result.id
        client.memory["stall.done"] = True
        a.maintain()
    _settled(client, c, "e")


def woken_before_recovery_commits(client: Client) -> None:
    """a's write waits for a person; the person accepts on a, and a is held just before its
    dispatch commits (the accept committed: the call is approved, not yet sent); its lease
    lapses; b declares it dead, reads the journal and is held just before its requeue
    commits. Then a wakes: its execution has not moved, so its dispatch commits and the tool
    runs; a is held again before the call's success. Then b commits a requeue decided on an
    approved call that is now dispatched: fenced on the call it read, the commit conflicts
    and b moves on; a finishes its execution, and nothing runs twice. (Unfenced, the
    requeue lands over the dispatched call: the next owner finds a call in flight it never
    sent.) The real-process simulator found this window under load. (A new call cannot be
    caught so: its dispatch commits with its execution's checkpoint, which moves the
    execution itself.)"""
    b = instance(client, "sim-b")
    if not client.memory.get("stall.done"):
        a = client.runtime
        if "e" not in client.memory:
            client.memory["e"] = a.engine.execute(client.principal, WRITE_THEN_READ).id
        execution_id: str = client.memory["e"]
        faults = client.world.faults
        dispatch = faults.gate(
            CrashPoint.parse("tool_call:dispatch:approved->dispatched:before_commit")
        )
        succeed = faults.gate(
            CrashPoint.parse("tool_call:succeed:dispatched->succeeded:before_commit")
        )

        def run_a() -> object:
            try:
                return a.engine.resume(execution_id, client.principal, Action.ACCEPT)
            finally:
                succeed.give_up()  # a crashed (or was refused) before its success

        with Held(dispatch, run_a, "a"):
            if dispatch.wait_until_held():
                _lapse(client, a, b)
                requeue = faults.gate(
                    CrashPoint.parse("execution:requeue:running->pending:before_commit")
                )
                try:
                    with Held(requeue, b.maintain, "b recovering"):
                        if requeue.wait_until_held():
                            dispatch.open()
                            succeed.wait_until_held()
                finally:
                    # b's round is over (or b crashed): a goes on with what it read.
                    succeed.open()
        client.memory["stall.done"] = True
        a.maintain()  # its first heartbeat after the stall: it is dead
        b.maintain()  # the next round judges what a left
        b.engine.run_pending()
    _settled(client, b, "e")


def one_decision_twice(client: Client) -> None:
    """Two resumes of one paused execution with the same decision, on two instances: the
    first is held just before its approval commits while the second goes through; then the
    first goes on. The decision is consumed once and the write happens once."""
    b = instance(client, "sim-b")
    a = client.runtime
    if "e" not in client.memory:
        client.memory["e"] = a.engine.execute(client.principal, WRITE_THEN_READ).id
    execution_id: str = client.memory["e"]
    if not client.memory.get("decided"):
        gate = client.world.faults.gate(
            CrashPoint.parse("tool_call:approve:awaiting_approval->approved:before_commit")
        )

        def first() -> object:
            return a.engine.resume(execution_id, client.principal, Action.ACCEPT)

        with Held(gate, first, "first resume"):
            if gate.wait_until_held():
                # Already settled by a resume before a crash: a legitimate answer.
                with contextlib.suppress(LockgateError):
                    b.engine.resume(execution_id, client.principal, Action.ACCEPT)
        client.memory["decided"] = True
    view = b.engine.get(execution_id, client.principal)
    if view.status not in (E.COMPLETED, E.INTERRUPTED):
        raise ScenarioFailed(f"the execution decided twice ended {view.status}")
