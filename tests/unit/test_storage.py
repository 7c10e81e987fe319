"""What executions keep, in process: the count an execution carries matches the bytes its
rows hold, and the retention purge takes old finished executions whole, a bounded number of
calls per round, never a live one."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from pydantic import JsonValue
from sqlmodel import col, func, select

from lockgate.machine import storage
from lockgate.machine.db.schema import Execution, ToolCall, TransitionLog
from lockgate.machine.journal_records import record_of
from lockgate.machine.runtime import Runtime
from lockgate.machine.storage import StorageBudget, purge_finished, size_of
from lockgate.spec import ExecutionStatus as E
from tests.support.engine_records import Clock, MakeRuntime, calls_of, row_of

TWO_CALLS = "tools.notes.list()\ntools.notes.list()\n'r' * 3000"


def kept_in_rows(runtime: Runtime, execution_id: str) -> int:
    """What the rows of a finished execution hold, measured the way the count is."""
    row = row_of(runtime, execution_id)
    own = sum(
        size_of(getattr(row, c)) for c in ("code", "outcome", "logs", "what_ran", "snapshot")
    )
    calls = sum(
        size_of(getattr(call, c))
        for call in calls_of(runtime, execution_id)
        for c in ("arguments", "arguments_preview", "decision", "result")
    )
    return own + calls


def test_a_finished_execution_counts_what_its_rows_hold(make_runtime: MakeRuntime) -> None:
    runtime = make_runtime()
    view = runtime.engine.execute("alice", TWO_CALLS)
    assert view.status == E.COMPLETED
    assert len(calls_of(runtime, view.id)) == 2
    row = row_of(runtime, view.id)
    assert row.stored_bytes == kept_in_rows(runtime, view.id)
    assert row.stored_bytes > 3000 + len(TWO_CALLS)
    assert runtime.engine.store.storage.stored_bytes("alice") == row.stored_bytes
    assert runtime.engine.store.storage.stored_bytes("bob") == 0


def test_a_paused_call_counts_its_arguments_before_anyone_decides(
    make_runtime: MakeRuntime,
) -> None:
    runtime = make_runtime(approval_mode="browser")
    code = "tools.notes.write(key='k', text='w' * 20000)"
    view = runtime.engine.execute("alice", code)
    assert view.status == E.WAITING_FOR_INTERACTION
    (call,) = calls_of(runtime, view.id)
    assert row_of(runtime, view.id).stored_bytes == len(code) + size_of(call.arguments) + (
        size_of(call.arguments_preview)
    )


def count(runtime: Runtime, model: type[Execution] | type[ToolCall] | type[TransitionLog]) -> int:
    with runtime.engine.store.session() as s:
        return int(s.exec(select(func.count()).select_from(model)).one())


def test_the_purge_takes_whole_old_finished_executions_a_bounded_number_a_round(
    make_runtime: MakeRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock()
    runtime = make_runtime(clock=clock, approval_mode="browser")
    finished = [runtime.engine.execute("alice", TWO_CALLS).id for _ in range(3)]
    waiting = runtime.engine.execute("alice", "tools.notes.write(key='k', text='v')").id
    before = runtime.engine.store.storage.stored_bytes("alice")
    retention = timedelta(days=1)

    # Within the retention period nothing goes. (Rows are stamped by the database's clock.)
    clock.now = datetime.now(UTC)
    assert purge_finished(runtime.engine.store, retention, clock).executions == 0

    clock.advance(retention + timedelta(seconds=1))
    # Three calls a round: one execution of two calls, never part of the next one.
    monkeypatch.setattr(storage, "PURGE_ROWS", 3)
    first = purge_finished(runtime.engine.store, retention, clock)
    assert (first.executions, first.calls) == (1, 2)
    assert count(runtime, Execution) == 3
    second = purge_finished(runtime.engine.store, retention, clock)
    third = purge_finished(runtime.engine.store, retention, clock)
    assert (second.executions, third.executions) == (1, 1)
    assert purge_finished(runtime.engine.store, retention, clock).executions == 0

    with runtime.engine.store.session() as s:
        assert [r.id for r in s.exec(select(Execution))] == [waiting]
        assert list(s.exec(select(ToolCall).where(col(ToolCall.execution_id).in_(finished)))) == []
        gone = [*finished, *(f"{e}:{n}" for e in finished for n in (1, 2))]
        logged = s.exec(select(TransitionLog).where(col(TransitionLog.record_id).in_(gone)))
        assert list(logged) == []
    left = runtime.engine.store.storage.stored_bytes("alice")
    assert left == row_of(runtime, waiting).stored_bytes < before


def test_a_call_meets_the_budget_read_afresh_for_large_arguments_and_each_second(
    make_runtime: MakeRuntime,
) -> None:
    runtime = make_runtime(approval_mode="browser")
    now = [100.0]
    paused = runtime.engine.execute("alice", "tools.notes.write(key='k', text='w' * 20000)")
    kept = row_of(runtime, paused.id).stored_bytes
    budget = StorageBudget(runtime.engine.store, kept + 10_000, clock=lambda: now[0])
    ex = record_of(row_of(runtime, paused.id))
    small: JsonValue = ["x" * 100]
    large: JsonValue = ["x" * 20_000]
    assert budget.refuses(ex, "tools.notes.write", small) is None  # read: kept, room left
    assert budget.refuses(ex, "tools.notes.write", large) is not None  # read afresh: over
    more = runtime.engine.execute("alice", "tools.notes.write(key='j', text='v' * 12000)")
    assert more.status == E.WAITING_FOR_INTERACTION  # admitted: under the budget then
    # Within the second, a small call meets the sum read before; after it, the new one.
    assert budget.refuses(ex, "tools.notes.write", small) is None
    now[0] += StorageBudget.FRESH_SECS
    refused = budget.refuses(ex, "tools.notes.write", small)
    assert refused is not None and "LOCKGATE_MAX_STORED_BYTES_PER_PRINCIPAL" in refused.message
