"""What the in-process engine tests (tests/test_engine*.py) share: the type of the
`make_runtime` fixture, code that pauses for approval, the simulator's clock, a restart on
the same database, and readers of what the engine stored (execution rows, tool calls) and of
the notes tool's effects."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import JsonValue
from sqlmodel import select

from lockgate.machine.db.schema import Execution, ToolCall
from lockgate.machine.runtime import Runtime
from lockgate.machine.tools.notes import NotesSource
from lockgate.simulation.world import SimClock

MakeRuntime = Callable[..., Runtime]
WRITE_THEN_READ = 'tools.notes.write(key="k", text="v")\ntools.notes.read(key="k")'
#: Simulated time that moves only when a test says so (the simulator's own clock).
Clock = SimClock


def notes_of(runtime: Runtime) -> NotesSource:
    source = runtime.sources[0]
    assert isinstance(source, NotesSource)
    return source


def writes(runtime: Runtime) -> list[dict[str, JsonValue]]:
    return [e for e in notes_of(runtime).effects() if not e["read"]]


def calls_of(runtime: Runtime, execution_id: str) -> list[ToolCall]:
    with runtime.engine.store.session() as s:
        return list(s.exec(select(ToolCall).where(ToolCall.execution_id == execution_id)))


def row_of(runtime: Runtime, execution_id: str) -> Execution:
    with runtime.engine.store.session() as s:
        row = s.get(Execution, execution_id)
    assert row is not None
    return row


def restart(make_runtime: MakeRuntime, **settings: Any) -> Runtime:
    """A new incarnation on the same database: nothing is kept from the crashed one."""
    rt = make_runtime(**settings)
    rt.start(background=False)
    return rt


def caught(call: str) -> str:
    """Agent code that makes `call` and answers with what it raised, as `<type>: <message>`
    (or with the call's own result)."""
    handler = "except Exception as e:\n    got = type(e).__name__ + ': ' + str(e)"
    return f"try:\n    got = {call}\n{handler}\ngot"
