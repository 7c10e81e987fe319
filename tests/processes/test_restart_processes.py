"""The durable engine across REAL processes, one instance at a time: started with subprocess,
killed with SIGKILL, and restarted.

Each test drives `python -m tests.support.procs.engine_process` (configured through environment
variables only, like a deployment; see `tests.support.engine_processes`) against one database,
SQLite file and PostgreSQL alike, and checks the database, the processes' answers and the notes
tool's on-disk effect log (`effects.jsonl`, written by the tool itself, so it counts effects
that really happened). Crashes are real: `LOCKGATE_CRASH_AT` (with `LOCKGATE_FAULT_INJECTION`
on) makes the process SIGKILL itself at a named crash point of the write path, or the test
SIGKILLs a process that holds. Covered: a pause survives SIGKILL (a, g), a crash mid-dispatch
of a non-idempotent (b) and of an idempotent call (c), a crash between calls (d), and
conservative recovery (e). Several instances on one PostgreSQL database (f) are
tests/processes/test_restart_several_instances.py.

Nothing here sleeps to hide a race: every wait polls a condition with a deadline.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.engine_processes import DISPATCH, LIST_ONCE, Db, Procs, effects_of
from tests.support.polling import wait_for

pytest_plugins = ["tests.support.engine_processes"]

pytestmark = pytest.mark.slow

WRITE_THEN_READ = 'tools.notes.write(key="k", text="v")\ntools.notes.read(key="k")'
LIST_TWICE = (
    "print('first')\na = tools.notes.list()\nprint('second')\nb = tools.notes.list()\n[a, b]"
)

SUCCEED = "tool_call:succeed:dispatched->succeeded"
READ_MADE = "tool_call:succeed_at_least_once:requested->succeeded"
TWO_WRITES = (
    "print('first')\na = tools.notes.write(key='a', text='1')\n"
    "print('second')\nb = tools.notes.write(key='b', text='2')\n[a, b]"
)
WRITES_APPROVED = {"LOCKGATE_POLICY": "notes.write=approve"}
LIST_NEEDS_APPROVAL = {"LOCKGATE_POLICY": "notes.list=require_approval"}
RETRIES_OFF = {"LOCKGATE_CONSERVATIVE_RECOVERY": "true"}


def assert_paused_on_write(view: dict[str, Any]) -> str:
    assert view["status"] == "waiting_for_interaction", view
    pending = view["pending"]
    assert pending["seq"] == 1
    assert pending["tool"] == "notes.write"
    assert pending["arguments_preview"] == {"key": "k", "text": "v"}
    assert view["calls"] == [{"seq": 1, "tool": "notes.write", "status": "awaiting_approval"}]
    execution_id: str = view["id"]
    return execution_id


# -- a, g: a pause survives SIGKILL -----------------------------------------------------------


def test_pause_survives_sigkill_of_a_live_instance(procs: Procs, db: Db) -> None:
    holder = procs.start("execute", "--hold", WRITE_THEN_READ)
    paused = holder.read_line()
    execution_id = assert_paused_on_write(paused)

    # The holder is a live instance: its lease is being renewed by its heartbeat thread.
    first = db.instance_of(holder.pid)
    wait_for(
        lambda: db.instance(first.id).lease_until > first.lease_until,
        "the holding process to renew its lease",
    )
    holder.sigkill()

    # (g) Nothing is stranded: a fresh process (another instance) sees the pause as it was.
    seen = procs.run("get", execution_id, "alice", LOCKGATE_INSTANCE_NAME="g")
    assert assert_paused_on_write(seen) == execution_id
    assert seen["pending"] == paused["pending"]
    assert procs.effects() == [], "no call may run before the approval"

    # (a) A new process under the same name declares the killed incarnation dead at once and
    # finishes the execution from its stored snapshot.
    resumed = procs.start("resume", execution_id, "alice", "accept")
    [view] = procs.finish([resumed])
    assert view["status"] == "completed", view
    assert view["result"] == {"key": "k", "text": "v"}
    assert [c["status"] for c in view["calls"]] == ["succeeded", "succeeded"]
    assert db.instance(first.id).status == "dead"

    writes = effects_of(procs, "notes.write")
    assert len(writes) == 1, writes
    assert writes[0]["idempotency_key"] == f"{execution_id}:1"
    assert writes[0]["pid"] == resumed.pid
    assert [e["tool"] for e in procs.effects()] == ["notes.write", "notes.read"]

    # A repeated decision answers with the same settled outcome and runs nothing again.
    again = procs.run("resume", execution_id, "alice", "accept")
    assert again["status"] == "completed"
    assert again["result"] == {"key": "k", "text": "v"}
    assert len(procs.effects()) == 2


# -- b: a crash mid-dispatch of a non-idempotent call ----------------------------------------


def test_crash_after_a_write_ran_ends_interrupted_and_never_repeats_it(
    procs: Procs, db: Db
) -> None:
    execution_id = assert_paused_on_write(procs.run("execute", WRITE_THEN_READ))
    crashed = procs.crash(
        "resume", execution_id, "alice", "accept", crash_at=f"{DISPATCH}:after_effect"
    )

    # The intent was committed, the write ran, the result never was.
    assert db.execution(execution_id).status == "running"
    assert [c.status for c in db.calls(execution_id)] == ["dispatched"]
    writes = effects_of(procs, "notes.write")
    assert [w["pid"] for w in writes] == [crashed.pid]

    report = procs.run("recover")
    assert report["interrupted"] == [execution_id]
    assert report["requeued"] == []
    assert db.instance_of(crashed.pid).id in report["declared_dead"]

    in_doubt = {"seq": 1, "tool": "notes.write"}
    # Two more processes, at once (neither changes anything): a read, and a decision.
    view, refused = procs.finish(
        [
            procs.start("get", execution_id, "alice", LOCKGATE_INSTANCE_NAME="g"),
            procs.start("resume", execution_id, "alice", "accept", LOCKGATE_INSTANCE_NAME="r"),
        ]
    )
    assert view["status"] == "interrupted", view
    assert view["what_ran"] == {
        "calls": [{**in_doubt, "status": "in_doubt"}],
        "in_doubt": [in_doubt],
    }
    assert view["calls"] == [{**in_doubt, "status": "in_doubt"}]
    assert view["result"] is None

    assert refused["error"]["code"] == "interrupted", refused
    assert refused["error"]["what_ran"]["in_doubt"] == [in_doubt]

    # Exactly once: the write that ran before the crash, and never again.
    assert effects_of(procs, "notes.write") == writes
    assert effects_of(procs, "notes.read") == []
    assert "redispatch" not in db.events(f"{execution_id}:1")


# -- c: a crash mid-dispatch of an idempotent call --------------------------------------------


@pytest.mark.parametrize(
    ("phase", "dispatches"),
    [
        # The intent was committed, the effect never happened: it runs once, on recovery.
        ("after_commit", 1),
        # The effect happened, its result was lost: at-least-once for an idempotent tool,
        # the second call carrying the same idempotency key.
        ("after_effect", 2),
    ],
)
def test_crash_mid_dispatch_of_an_idempotent_call_is_retried(
    procs: Procs, db: Db, phase: str, dispatches: int
) -> None:
    # A read that needed approval is sent intent first (one the policy approves is made at
    # once: see the next test).
    paused = procs.run("execute", LIST_ONCE, **LIST_NEEDS_APPROVAL)
    execution_id = paused["id"]
    point = f"{DISPATCH}:{phase}"
    resume = ("resume", execution_id, "alice", "accept")
    crashed = procs.crash(*resume, crash_at=point, **LIST_NEEDS_APPROVAL)
    assert db.execution(execution_id).status == "running"
    assert [c.status for c in db.calls(execution_id)] == ["dispatched"]

    # The boot round recovers, then runs the pending work.
    report = procs.run("recover", **LIST_NEEDS_APPROVAL)
    assert report["requeued"] == [execution_id]
    assert report["interrupted"] == []

    row = db.execution(execution_id)
    assert row.status == "completed", row
    assert row.outcome == {"result": {"keys": [], "done": True}}
    [call] = db.calls(execution_id)
    assert call.status == "succeeded"
    assert call.attempts == 2
    assert db.events(call.id).count("redispatch") == 1

    lists = effects_of(procs, "notes.list")
    assert len(lists) == dispatches, lists
    assert {e["idempotency_key"] for e in lists} == {f"{execution_id}:1"}
    assert lists[-1]["pid"] != crashed.pid


# -- d: a crash between two calls goes on from the checkpoint ---------------------------------


def test_reads_made_at_once_are_made_again_after_a_kill(procs: Procs, db: Db) -> None:
    """Reads the policy approves are made at once, their journal entries riding with the
    next durable commit: a process killed after the first read ran leaves nothing of it,
    and recovery runs the code from its last checkpoint (the start), reading again."""
    crashed = procs.crash("execute", LIST_TWICE, crash_at=f"{READ_MADE}:after_effect")
    execution_id = db.only_execution().id
    at_crash = db.execution(execution_id)
    assert (at_crash.status, at_crash.snapshot_call, at_crash.logs) == ("running", None, "")
    assert db.calls(execution_id) == []

    recovering = procs.start("recover")
    [report] = procs.finish([recovering])
    assert report["requeued"] == [execution_id]
    row = db.execution(execution_id)
    assert row.status == "completed", row
    assert row.outcome == {"result": [[], []]}
    assert row.logs == "first\nsecond\n"
    lists = effects_of(procs, "notes.list")
    keys = [f"{execution_id}:1", f"{execution_id}:1", f"{execution_id}:2"]
    assert [e["idempotency_key"] for e in lists] == keys
    assert [e["pid"] for e in lists] == [crashed.pid, recovering.pid, recovering.pid]
    assert db.events(execution_id) == ["start", "requeue", "start", "complete"]


def test_crash_between_calls_goes_on_without_redoing_the_first(procs: Procs, db: Db) -> None:
    """Recovery goes on from the checkpoint at call 1, not from the top (a replay that
    answers call 1 from the journal would give the same result and the same effects): the
    line printed before the checkpoint is in the logs once, and only the recovering process
    ran anything after the crash. (Writes the policy approves: journaled intent first.)"""
    crashed = procs.crash(
        "execute", TWO_WRITES, crash_at=f"{SUCCEED}:after_commit", **WRITES_APPROVED
    )
    execution_id = db.only_execution().id
    assert [c.status for c in db.calls(execution_id)] == ["succeeded"]
    at_crash = db.execution(execution_id)
    assert (at_crash.status, at_crash.snapshot_call, at_crash.logs) == ("running", 1, "first\n")

    recovering = procs.start("recover", **WRITES_APPROVED)
    [report] = procs.finish([recovering])
    assert report["requeued"] == [execution_id]

    row = db.execution(execution_id)
    assert row.status == "completed", row
    assert row.outcome == {"result": [{"key": "a", "written": True}, {"key": "b", "written": True}]}
    assert row.logs == "first\nsecond\n"
    assert [c.status for c in db.calls(execution_id)] == ["succeeded", "succeeded"]
    written = effects_of(procs, "notes.write")
    assert [e["idempotency_key"] for e in written] == [f"{execution_id}:1", f"{execution_id}:2"]
    assert [e["pid"] for e in written] == [crashed.pid, recovering.pid]
    assert db.events(f"{execution_id}:1") == ["auto_approve", "dispatch", "succeed"]
    assert db.events(execution_id) == [
        *["start", "checkpoint"],  # the killed process, up to call 1
        *["requeue", "start", "checkpoint", "complete"],  # the recovering one, from call 1
    ]


# -- e: conservative recovery retries nothing -------------------------------------------------


def test_conservative_recovery_interrupts_even_an_idempotent_call(procs: Procs, db: Db) -> None:
    # Retries off from the start: the read is journaled intent first, like a write.
    procs.crash("execute", LIST_ONCE, crash_at=f"{DISPATCH}:after_commit", **RETRIES_OFF)
    execution_id = db.only_execution().id

    report = procs.run("recover", **RETRIES_OFF)
    assert report["interrupted"] == [execution_id]
    assert report["requeued"] == []

    row = db.execution(execution_id)
    assert row.status == "interrupted"
    in_doubt = {"seq": 1, "tool": "notes.list"}
    assert row.what_ran == {"calls": [{**in_doubt, "status": "in_doubt"}], "in_doubt": [in_doubt]}
    assert effects_of(procs, "notes.list") == [], "the call was never made, and never retried"
