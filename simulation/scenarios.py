"""The scenario catalog: what clients do, written so it can start over after any crash.

A scenario's `drive` is run from the top again after each crash and restart, as a client
would retry: what it learned before the crash (an execution id) is in `client.memory`; what
it did not learn it does again. Drives never assert on the server's internals; they only
check that each answer is one a client may legitimately get. The invariants are checked by
the sweep, on what the database and the tools' logs hold afterwards.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from machine.dispatcher import ExecutionRecord
from machine.engine import Action
from machine.execution_errors import (
    ExecutionAlreadySettled,
    ExecutionExpired,
    ExecutionInterrupted,
)
from machine.records import Change
from machine.runtime import Runtime
from machine.sessions import request_key
from machine.views import ExecutionView
from simulation.canary import LEAKING_CODE
from simulation.clock import approval_deadline, instance_lease, session_cap, session_idle
from simulation.concurrency import (
    one_decision_twice,
    stalled_at,
    two_recoverers,
    woken_before_recovery_commits,
)
from simulation.inbox import Inbox, collect
from simulation.world import Client, ScenarioFailed, expect

__all__ = ["CATALOG", "Scenario", "ScenarioFailed", "by_name", "expect"]
from spec import ExecutionStatus as E

WRITE_THEN_READ = 'tools.notes.write(key="k", text="v")\ntools.notes.read(key="k")'
CATCH_DECLINE = (
    "try:\n    tools.notes.delete(key='k')\n    said = 'deleted'\n"
    "except PermissionError as e:\n    said = 'refused'\nsaid"
)

Drive = Callable[[Client], None]


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    drive: Drive
    #: Settings every incarnation of this scenario boots with.
    settings: dict[str, Any] = field(default_factory=dict)
    #: Drives only through execute/resume/get, so the same drive runs against real processes
    #: (the others have a real-process drive of their own in `simulation.remote`).
    portable: bool = True
    #: Settings the real-process servers add (real time must cross the scenario's bounds).
    real_process_settings: dict[str, str] = field(default_factory=dict)


def decide(client: Client, key: str, action: Action) -> ExecutionView | None:
    """Resume as a client does: retrying the same decision is safe; an answer that says the
    execution moved on (settled, expired, interrupted) is final."""
    execution_id = client.memory.get(key)
    if execution_id is None:
        return None
    try:
        return client.resume(execution_id, action)
    except ExecutionAlreadySettled:
        return client.get(execution_id)
    except (ExecutionExpired, ExecutionInterrupted):
        return client.get(execution_id)


def started(client: Client, key: str, code: str) -> ExecutionView:
    view: ExecutionView = client.remember(key, lambda: client.execute(code))
    client.memory[key + ".id"] = view.id
    return view


# -- the drives ------------------------------------------------------------------------------


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

    threads = [threading.Thread(target=resume) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]
    expect(len(answers) == 2, "a resume went unanswered")


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


#: Pure computation after one call, for a drain to catch running: the next owner goes on
#: from the checkpoint at the call (its result replayed from the journal) and runs the loop
#: again. Half a second of it (Monty runs ~10 million iterations a second): ample time to
#: see it running, little to run it twice.
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

    failures: list[BaseException] = []

    def carry_on() -> None:
        try:
            runtime.engine.carry_on(ex)
        except BaseException as exc:  # an injected crash: re-raised by the driving thread
            failures.append(exc)

    runtime.engine.write.observers.append(note_success)
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


# -- sessions and the owed-request ledger (driven as the HTTP session gate drives them) -----


def _session(client: Client) -> str:
    """A session opened by an `initialize` this client sent once."""
    sessions = client.runtime.sessions

    def open_session() -> str:
        session_id = uuid.uuid4().hex
        sessions.open(
            session_id, client.principal, "2025-11-25", {"name": "sim", "version": "1"}, {}
        )
        return session_id

    session_id: str = client.remember("session", open_session)
    if not client.memory.get("initialized"):
        sessions.end_request(session_id)  # the initialize exchange is over
        client.memory["initialized"] = True
    return session_id


def inbox_of(client: Client) -> Inbox:
    """What the client received on its sessions (its memory: it outlives every crash)."""
    inbox: Inbox = client.remember("inbox", Inbox)
    return inbox


def _collect_reports(client: Client, session_id: str, stream: str | None = None) -> None:
    """The client's collecting GET on its session after a restart: lost ids are reported
    to it, once (it acknowledges what it read when it opens the GET again)."""
    collect(inbox_of(client), client.runtime.sessions, session_id, stream)


def _request(client: Client, session_id: str, key: str, code: str) -> None:
    """One tools/call on the session: owed, run, answered (once; a retry after a crash is a
    new request id, as a client would send)."""
    if client.memory.get(key):
        return
    sessions = client.runtime.sessions
    attempt = client.memory.get(key + ".attempt", 0) + 1
    client.memory[key + ".attempt"] = attempt
    request_id = f"{key}-{attempt}"
    inbox_of(client).sent(request_id)
    sessions.begin_request(session_id)
    owed = sessions.owe(session_id, request_id, "tools/call", None)
    client.runtime.engine.execute(
        client.principal, code, session_id, request_key(session_id, request_id)
    )
    inbox_of(client).answer(request_id)  # the response is written: the client has it
    sessions.answered(owed)
    sessions.end_request(session_id)
    client.memory[key] = True


def session_requests(client: Client) -> None:
    session_id = _session(client)
    _collect_reports(client, session_id)
    _request(client, session_id, "r1", "tools.notes.list()")
    _request(client, session_id, "r2", "len(tools.notes.list())")
    _collect_reports(client, session_id)


def session_closed(client: Client) -> None:
    """DELETE while a request is in flight (active), then on an idle session."""
    session_id = _session(client)
    sessions = client.runtime.sessions
    if not client.memory.get("closed"):
        sessions.begin_request(session_id)
        sessions.close(session_id)
        client.memory["closed"] = True
    other = client.remember("other", lambda: _fresh_session(client))
    sessions.close(other)


def _fresh_session(client: Client) -> str:
    session_id = uuid.uuid4().hex
    sessions = client.runtime.sessions
    sessions.open(session_id, client.principal, "2025-11-25", {"name": "sim", "version": "1"}, {})
    sessions.end_request(session_id)
    return session_id


def stream_lost(client: Client) -> None:
    """A stream ends without the answer: the id is lost, and reported on the same stream."""
    session_id = _session(client)
    sessions = client.runtime.sessions
    inbox = inbox_of(client)
    if not client.memory.get("lost"):
        inbox.sent("s-1")
        sessions.begin_request(session_id)
        owed = sessions.owe(session_id, "s-1", "tools/call", None)
        sessions.lose(owed)
        row = sessions.get_owed(owed.id)
        assert row is not None
        inbox.lost(owed.id, sessions.lost_error(row))  # written on the request's own stream
        sessions.reported(owed)
        sessions.end_request(session_id)
        client.memory["lost"] = True
    _collect_reports(client, session_id)


def session_lease(client: Client) -> None:
    """Leases: an idle session is destroyed; one with a request in flight too, past the cap;
    a lost report nobody collects ends uncollected with its session."""
    idle = _session(client)
    busy = client.remember("busy", lambda: _fresh_session(client))
    sessions = client.runtime.sessions
    if not client.memory.get("busy.begun"):
        sessions.begin_request(busy)
        owed = sessions.owe(busy, "b-1", "tools/call", None)
        sessions.lose(owed)  # nobody will collect this one
        client.memory["busy.begun"] = True
    client.world.clock.advance(timedelta(minutes=20))  # past the idle timeout and the cap
    client.runtime.maintain()
    for session_id in (idle, busy):
        row = sessions.get(session_id)
        expect(
            row is not None and row.status == "expired", f"session {session_id} outlived its lease"
        )


_STALLS = (
    ("before_dispatch", "tool_call:dispatch:approved->dispatched:before_commit"),
    ("after_dispatch", "tool_call:dispatch:approved->dispatched:after_commit"),
    ("before_succeed", "tool_call:succeed:dispatched->succeeded:before_commit"),
    ("before_complete", "execution:complete:running->completed:before_commit"),
)
_WRITE_APPROVED = {"policy": "notes.write=approve"}

CATALOG: tuple[Scenario, ...] = (
    Scenario("plain", "A run with one auto-approved call.", plain),
    Scenario("several_calls", "Several calls, one failing inside the code.", several_calls),
    Scenario("failing_code", "Code that raises after a call.", failing_code),
    Scenario("leaky_tools", "Tools that leak their secret everywhere they can.", leaky_tools),
    Scenario("approval_accepted", "A write paused for approval, accepted.", approval_accepted),
    Scenario("approval_declined", "Declined; the code catches it.", approval_declined),
    Scenario("approval_cancelled", "Cancelled; the code catches it.", approval_cancelled),
    Scenario(
        "execution_cancelled",
        "A paused and a queued run cancelled.",
        execution_cancelled,
        portable=False,
    ),
    Scenario(
        "approval_expired",
        "Nobody decides before the deadline.",
        approval_expired,
        real_process_settings={"approval_ttl": "2"},
        portable=False,
    ),
    Scenario(
        "blocked_by_policy",
        "A call the policy blocks.",
        blocked_by_policy,
        settings={"policy": "notes.delete=block"},
    ),
    Scenario("duplicate_resume", "The same decision sent twice.", duplicate_resume),
    Scenario("concurrent_resume", "Two resumes at once.", concurrent_resume),
    Scenario(
        "resume_after_restart",
        "Resumed by a later incarnation.",
        resume_after_restart,
        portable=False,
    ),
    Scenario("in_doubt_idempotent", "A read-only call cut off.", in_doubt_idempotent),
    Scenario(
        "in_doubt_non_idempotent",
        "A write (approved by policy) cut off.",
        in_doubt_non_idempotent,
        settings={"policy": "notes.write=approve"},
    ),
    Scenario(
        "conservative_recovery",
        "Every cut-off run ends interrupted.",
        conservative_recovery,
        settings={"conservative_recovery": True},
    ),
    Scenario(
        "lease_takeover",
        "Two instances; a's lease lapses.",
        lease_takeover,
        # The real-process drive stalls a mid-write: the write must not wait for a person.
        real_process_settings={"policy": "notes.write=approve"},
        portable=False,
    ),
    Scenario(
        "graceful_shutdown", "An instance drains and stops.", graceful_shutdown, portable=False
    ),
    Scenario(
        "drain_while_running",
        "SIGTERM while code runs: handed back, run again by the next incarnation.",
        drain_while_running,
        portable=False,
        # Real time: a longer run to catch (its limit raised to match), a short drain bound.
        real_process_settings={"max_duration_secs": "30", "drain_timeout": "3"},
    ),
    *(
        Scenario(
            f"stalled_{where}",
            f"a stalls at {point}; b recovers its work; then a wakes up.",
            stalled_at(point),
            settings=_WRITE_APPROVED,
            portable=False,
        )
        for where, point in _STALLS
    ),
    Scenario(
        "two_recoverers",
        "b and c recover a's work at once (b held before its requeue commits).",
        two_recoverers,
        settings=_WRITE_APPROVED,
        portable=False,
    ),
    Scenario(
        "woken_before_recovery_commits",
        "a wakes and dispatches between b's read of the journal and b's requeue commit.",
        woken_before_recovery_commits,
        settings=_WRITE_APPROVED,
        portable=False,
    ),
    Scenario(
        "approval_deadline",
        "Only the clock moves: a paused run before, at and after its deadline.",
        approval_deadline,
        real_process_settings={"approval_ttl": "2"},
        portable=False,
    ),
    Scenario(
        "instance_lease",
        "Only the clock moves: a stalled instance before, at and after its lease ends.",
        instance_lease,
        settings=_WRITE_APPROVED,
        portable=False,
    ),
    Scenario(
        "session_idle",
        "Only the clock moves: an idle session before, at and after its idle timeout.",
        session_idle,
        real_process_settings={"session_idle_timeout": "2"},
        portable=False,
    ),
    Scenario(
        "session_cap",
        "Only the clock moves: a session with a request owed, at and around its cap.",
        session_cap,
        real_process_settings={
            "session_idle_timeout": "1",
            "session_lease": "1",
            "session_cap": "3",
        },
        portable=False,
    ),
    Scenario(
        "one_decision_twice",
        "Two resumes with one decision on two instances, the first held before it commits.",
        one_decision_twice,
        portable=False,
    ),
    Scenario(
        "session_requests",
        "Requests on a durable session: owed, answered; lost ones reported on the next GET.",
        session_requests,
        portable=False,
    ),
    Scenario(
        "session_closed", "DELETE on an active and an idle session.", session_closed, portable=False
    ),
    Scenario(
        "stream_lost",
        "A stream ends without its answer: -32010 on it.",
        stream_lost,
        portable=False,
    ),
    Scenario(
        "session_lease",
        "Idle and capped sessions expire; reports left uncollected.",
        session_lease,
        real_process_settings={"session_idle_timeout": "2", "session_cap": "3"},
        portable=False,
    ),
)


def by_name(name: str) -> Scenario:
    for scenario in CATALOG:
        if scenario.name == name:
            return scenario
    known = ", ".join(s.name for s in CATALOG)
    raise KeyError(f"no scenario {name!r}; known: {known}")
