"""What the approval API's tests share (tests/server/test_approval_api.py, the key's side, and
tests/server/test_approval_person_api.py, a person's): the app in approval mode `browser`, the
writes the notes tool made, the decisions committed, and the key's resume."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx2
import pytest
from sqlmodel import col, select

from lockgate.machine.db.schema import TransitionLog
from lockgate.machine.runtime import Runtime
from lockgate.machine.tools.spec import make_idempotency_key
from lockgate.spec.crash_points import CrashPoint
from tests.support.approval_app import BODY_LIMIT, JSON, Served, serve

#: A call whose code catches the refusal and returns its words.
CAUGHT = (
    'try:\n    tools.notes.write(key="k", text="v")\n    msg = "written"\n'
    "except PermissionError as e:\n    msg = str(e)\nmsg"
)
APPROVED = CrashPoint.parse("tool_call:approve:awaiting_approval->approved:before_commit")


@pytest.fixture(name="served")
def served_fixture(make_runtime: Callable[..., Runtime]) -> Iterator[Served]:
    """The app in approval mode `browser`: only a person accepts."""
    with serve(make_runtime, max_request_bytes=BODY_LIMIT, approval_mode="browser") as s:
        yield s


def writes_made(served: Served) -> list[str]:
    notes = served.runtime.sources[0]
    return [e["key"] for e in notes.effects() if not e["read"]]  # type: ignore[attr-defined]


def decisions(served: Served, execution_id: str) -> list[str]:
    """The decisions committed for the execution's calls (approve / decline events)."""
    with served.runtime.engine.store.session() as s:
        return [
            t.event
            for t in s.exec(
                select(TransitionLog)
                .where(
                    col(TransitionLog.record_id).startswith(f"{execution_id}:"),
                    col(TransitionLog.event).in_(["approve", "decline"]),
                )
                .order_by(col(TransitionLog.id))
            )
        ]


def decision_of(served: Served, execution_id: str, call: int = 1) -> dict[str, Any]:
    """The stored decision (with its audit record) of a call."""
    found = served.runtime.engine.store.tool_calls.get(make_idempotency_key(execution_id, call))
    assert found is not None and isinstance(found.decision, dict), found
    return found.decision


def key_resume(served: Served, execution_id: str, action: str, **headers: str) -> httpx2.Response:
    return served.post(
        f"/api/executions/{execution_id}/resume",
        headers={**JSON, **served.bearer(), **headers},
        json={"action": action},
    )
