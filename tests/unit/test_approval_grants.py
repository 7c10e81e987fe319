"""Loops without one prompt per call: an approval with a grant covers the next calls of the
same tool in the same execution, each still journaled and recorded on its own; nothing
else is covered (another tool, another execution, more calls than granted)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from lockgate.machine.approval_audit import arguments_digest
from lockgate.machine.approval_grants import InvalidGrant
from lockgate.machine.engine import Action
from lockgate.server.cli import app
from lockgate.spec import ExecutionStatus
from tests.support.engine_records import MakeRuntime

LOOP = """
done = []
for i in range(5):
    done.append(tools.notes.write(key=f"loop-{i}", text="x")["key"])
tools.notes.delete(key="loop-0")
done
"""


def written(rt: object, execution_id: str) -> list[tuple[int, str, str | None]]:
    calls = rt.engine.store.executions.calls(execution_id)  # type: ignore[attr-defined]
    return [
        (
            c.seq,
            c.status,
            c.decision.get("door") if isinstance(c.decision, dict) else None,
        )
        for c in calls
    ]


def test_a_grant_covers_the_next_calls_of_that_tool_and_no_more(
    make_runtime: MakeRuntime, database_url: str, tmp_path: Path
) -> None:
    rt = make_runtime()
    paused = rt.engine.execute("alice", LOOP)
    assert paused.status is ExecutionStatus.WAITING_FOR_INTERACTION
    # One decision: this call and the next 3 writes.
    view = rt.engine.resume(paused.id, "alice", Action.ACCEPT, {"grant": {"calls": 3}})
    assert view.status is ExecutionStatus.WAITING_FOR_INTERACTION
    assert view.pending is not None and view.pending.seq == 5  # the 5th write: past the grant
    view = rt.engine.resume(paused.id, "alice", Action.ACCEPT)
    # The delete is another tool: it waits for its own decision.
    assert view.pending is not None and view.pending.tool == "notes.delete"
    view = rt.engine.resume(paused.id, "alice", Action.ACCEPT)
    assert view.status is ExecutionStatus.COMPLETED, view.error
    assert view.result == [f"loop-{i}" for i in range(5)]
    assert written(rt, paused.id) == [
        (1, "succeeded", "server"),
        (2, "succeeded", "grant"),
        (3, "succeeded", "grant"),
        (4, "succeeded", "grant"),
        (5, "succeeded", "server"),
        (6, "succeeded", "server"),
    ]
    # Each covered call is recorded with its own arguments and the call it was covered by.
    third = rt.engine.store.tool_calls.get(f"{paused.id}:3")
    assert third is not None and isinstance(third.decision, dict)
    assert third.decision["coveredBy"] == 1
    assert third.decision["argumentsDigest"] == arguments_digest({"key": "loop-2", "text": "x"})
    exported = CliRunner().invoke(
        app, ["audit", "export"], env={"LOCKGATE_DATABASE_URL": database_url}
    )
    assert exported.output.count('"door": "grant"') == 3

    # A grant never reaches another execution.
    other = rt.engine.execute("alice", LOOP)
    assert other.status is ExecutionStatus.WAITING_FOR_INTERACTION
    assert other.pending is not None and other.pending.seq == 1


def test_until_the_end_and_unreadable_grants(make_runtime: MakeRuntime) -> None:
    rt = make_runtime()
    paused = rt.engine.execute("alice", LOOP)
    for bad in ({"grant": {"calls": 0}}, {"grant": {"calls": "all"}}, {"grant": [1]}):
        with pytest.raises(InvalidGrant):
            rt.engine.resume(paused.id, "alice", Action.ACCEPT, bad)  # type: ignore[arg-type]
    # Refused before anything was spent: the call still waits.
    assert rt.engine.view(paused.id).pending is not None
    view = rt.engine.resume(paused.id, "alice", Action.ACCEPT, {"grant": {"untilEnd": True}})
    assert view.pending is not None and view.pending.tool == "notes.delete"
