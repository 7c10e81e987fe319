"""The drives of stopping an instance: a drain that catches code running past its first call
and hands its execution back, and a graceful shutdown of an instance with work in hand.

`drain_mid_run` and the spinning code are shared with the property-based harness
(`tests/support/harness.py`); `spin_code` with the real-process drain drive.
"""

from __future__ import annotations

import threading
import time

from lockgate.machine.dispatcher import ExecutionRecord
from lockgate.machine.records import Change
from lockgate.machine.runtime import Runtime
from lockgate.machine.write_path import Step
from lockgate.simulation.invariants import MADE_AT_ONCE
from lockgate.simulation.scenario_steps import started
from lockgate.simulation.world import Client, ScenarioFailed, expect
from lockgate.spec import ExecutionStatus as E

#: Pure computation after one call, for a drain to catch running: the call is a read made
#: at once (its journal entry waits for the end), so the next owner goes on from the last
#: durable checkpoint, the start, makes the read again and runs the loop again. (With
#: retries off the read is journaled first and the next owner replays it from there.)
#: Half a second of it (Monty runs ~10 million iterations a second): ample time to see it
#: running, little to run it twice.
SPIN_ITERATIONS = 5_000_000


def spin_code(iterations: int) -> str:
    return f"tools.notes.list()\nn = 0\nfor i in range({iterations}):\n    n = n + 1\nn"


SPIN_CODE = spin_code(SPIN_ITERATIONS)
#: A drain must catch the code running well within this (the loop takes far less).
_SPIN_PATIENCE_SECS = 30.0


def drain_mid_run(runtime: Runtime, ex: ExecutionRecord) -> None:
    """SIGTERM while the code of `ex` (claimed by `runtime`, e.g. SPIN_CODE) runs past its
    first call: carry it on in a thread of its own (as the HTTP runner does), wait until the
    call succeeded and the code after it runs in the sandbox, then drain. An injected crash
    in the execution's thread (its process died) is raised here, in the driving thread."""
    called = threading.Event()

    def note_success(changes: tuple[Change, ...]) -> None:
        if any(c.machine == "tool_call" and c.event == "succeed" for c in changes):
            called.set()

    def note_made_at_once(step: Step) -> None:
        if step.record.machine == "tool_call" and step.event in MADE_AT_ONCE:
            called.set()

    failures: list[BaseException] = []

    def carry_on() -> None:
        try:
            runtime.engine.carry_on(ex)
        except BaseException as exc:  # an injected crash: re-raised by the driving thread
            failures.append(exc)

    runtime.engine.write.observers.append(note_success)
    runtime.engine.write.carry_observers.append(note_made_at_once)
    thread = threading.Thread(target=carry_on, name="drained-execution", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + _SPIN_PATIENCE_SECS
        # Polling the sandbox's own count (no hook inside a step exists); the deadline bounds
        # a broken engine, and a drive that ended first (a crash) ends the wait too.
        while thread.is_alive() and not (called.is_set() and runtime.sandbox.running()):
            if time.monotonic() > deadline:
                raise ScenarioFailed("the code never ran past its first call")
            time.sleep(0.001)
        if not failures:
            runtime.drain()
    finally:
        thread.join()
        runtime.engine.write.observers.remove(note_success)
        runtime.engine.write.carry_observers.remove(note_made_at_once)
    if failures:
        raise failures[0]


def drain_while_running(client: Client) -> None:
    """SIGTERM while code runs: the drain stops the code at once and hands its execution
    back (pending, released) instead of waiting for it; the next incarnation of the same
    instance runs it again from its checkpoint, to its result."""
    if not client.memory.get("draining"):
        client.memory["draining"] = True  # a crash from here on is the drain's
        runtime = client.runtime
        ex = runtime.engine.begin(client.principal, SPIN_CODE)
        client.memory["e.id"] = ex.id
        drain_mid_run(runtime, ex)
        runtime.maintain()  # the lease is renewed while draining
        runtime.close()
        client.runtime = client.world.boot()
    execution_id = client.memory.get("e.id")
    if execution_id is None:
        return  # the process died before the client learned the id: recovery's, swept
    final = client.get(execution_id)
    expect(
        final.status == E.COMPLETED and final.result == SPIN_ITERATIONS,
        f"the drained execution ended {final.status} with {final.result!r}",
    )


def graceful_shutdown(client: Client) -> None:
    started(client, "e", "tools.notes.list()")
    if not client.memory.get("closed"):
        client.runtime.maintain()
        client.runtime.drain()
        client.runtime.maintain()  # the lease is renewed while draining
        client.runtime.close()
        client.memory["closed"] = True
