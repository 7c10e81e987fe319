"""What an execution costs in commits, counted on the transition log (SQLite and
PostgreSQL): the journal makes durable only what durability buys something for. A read the
policy approves has no commit of its own (its entry rides with the next durable step); a
write costs two (its intent, before it runs, then its result); the start and the end one
each; a pause one."""

from __future__ import annotations

from collections import defaultdict

from sqlmodel import col, select

from lockgate.machine.db.schema import TransitionLog
from lockgate.machine.dispatcher import MAX_CARRIED_CALLS
from lockgate.machine.runtime import Runtime
from lockgate.spec import ExecutionStatus
from tests.support.engine_records import WRITE_THEN_READ, MakeRuntime, row_of

#: Three reads, a write the policy approves, two reads.
READS_AROUND_A_WRITE = (
    "a = tools.notes.list()\nb = tools.notes.list()\nc = tools.notes.list()\n"
    "tools.notes.write(key='k', text='v')\n"
    "d = tools.notes.read(key='k')\ne = tools.notes.list()\n"
    "[len(a), d['text'], len(e)]"
)


def commits(runtime: Runtime, execution_id: str) -> list[list[str]]:
    """Each transaction that moved the execution or its calls, in order, as the records it
    moved (`e` for the execution, the call's sequence number otherwise) and their events."""
    with runtime.engine.store.session() as s:
        rows = s.exec(
            select(TransitionLog)
            .where(col(TransitionLog.record_id).startswith(execution_id))
            .order_by(col(TransitionLog.id))
        ).all()
    by_txn: dict[str, list[str]] = defaultdict(list)
    for row in rows:
        assert row.txn is not None
        who = "e" if row.record_id == execution_id else row.record_id.rsplit(":", 1)[1]
        by_txn[row.txn].append(f"{who}.{row.event}")
    return list(by_txn.values())


def test_reads_ride_with_the_next_durable_commit_and_a_write_costs_two(
    make_runtime: MakeRuntime,
) -> None:
    rt = make_runtime(policy="notes.write=approve")
    view = rt.engine.execute("alice", READS_AROUND_A_WRITE)
    assert view.status is ExecutionStatus.COMPLETED and view.result == [0, "v", 1]
    # R = 5 reads and W = 1 write: 2W + 2 = 4 commits.
    assert commits(rt, view.id) == [
        ["e.start"],
        [
            *["1.succeed_at_least_once", "2.succeed_at_least_once", "3.succeed_at_least_once"],
            *["e.checkpoint", "4.auto_approve", "4.dispatch"],
        ],
        ["4.succeed"],
        ["5.succeed_at_least_once", "6.succeed_at_least_once", "e.complete"],
    ]


def test_a_pause_costs_one_commit(make_runtime: MakeRuntime) -> None:
    rt = make_runtime()
    paused = rt.engine.execute("alice", "tools.notes.list()\n" + WRITE_THEN_READ)
    assert paused.status is ExecutionStatus.WAITING_FOR_INTERACTION
    assert commits(rt, paused.id) == [
        ["e.start"],
        ["1.succeed_at_least_once", "e.checkpoint", "2.request_approval", "e.pause"],
    ]


def test_with_retries_off_every_call_is_journaled_before_it_runs(
    make_runtime: MakeRuntime,
) -> None:
    rt = make_runtime(conservative_recovery=True)
    view = rt.engine.execute("alice", "tools.notes.list()\n'done'")
    assert view.status is ExecutionStatus.COMPLETED
    assert commits(rt, view.id) == [
        ["e.start"],
        ["e.checkpoint", "1.auto_approve", "1.dispatch"],
        ["1.succeed"],
        ["e.complete"],
    ]


def test_reads_made_at_once_wait_in_memory_at_most_a_bounded_number_at_a_time(
    make_runtime: MakeRuntime,
) -> None:
    """Each waiting entry holds a result: past `MAX_CARRIED_CALLS` they are committed, with
    a checkpoint that keeps the last snapshot, before the next read is made."""
    rt = make_runtime()
    reads = MAX_CARRIED_CALLS + 2
    view = rt.engine.execute("alice", f"for i in range({reads}):\n    tools.notes.list()\n'ok'")
    assert view.status is ExecutionStatus.COMPLETED and view.result == "ok"
    made = [f"{seq}.succeed_at_least_once" for seq in range(1, reads + 1)]
    assert commits(rt, view.id) == [
        ["e.start"],
        [*made[:MAX_CARRIED_CALLS], "e.checkpoint"],
        [*made[MAX_CARRIED_CALLS:], "e.complete"],
    ]
    row = row_of(rt, view.id)
    assert (row.snapshot, row.snapshot_call, row.calls_made) == (None, None, reads)
