"""The durable engine and secrets, in process, on SQLite and PostgreSQL (every test runs on
both): a careless tool returns and raises its secret, and the canary never reaches a row, a
snapshot or a log, through a crash and recovery included.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from pydantic import JsonValue

from lockgate.machine.db.audit_queries import AuditQueries
from lockgate.machine.engine import Action
from lockgate.machine.faults import Faults, InjectedCrash
from lockgate.machine.policy import PolicyDecision
from lockgate.machine.runtime import Runtime
from lockgate.machine.tools.registry import Tool, ToolContext, ToolFailed, ToolSpec
from lockgate.spec import CrashPoint, ExecutionStatus
from tests.support.canary import CANARY
from tests.support.engine_records import WRITE_THEN_READ, MakeRuntime, restart


class LeakySource:
    """A careless tool that returns and raises its secret: redaction must catch both."""

    name = "leaky"

    def tools(self) -> Sequence[Tool]:
        return [_Leaky("echo"), _Leaky("boom")]


class _Leaky:
    def __init__(self, name: str) -> None:
        self.name = name

    @property
    def spec(self) -> ToolSpec:
        return ToolSpec(
            source="leaky",
            name=self.name,
            description="leaks its token",
            idempotent=True,
            default_policy=PolicyDecision.APPROVE,
            secrets=("notes_token",),
        )

    def call(self, arguments: dict[str, JsonValue], context: ToolContext) -> JsonValue:
        token = context.secrets["notes_token"]
        if self.name == "boom":
            raise ToolFailed(f"upstream rejected token {token}")
        return {"token": token, "note": f"auth={token}"}


def test_the_canary_secret_never_reaches_a_row_a_snapshot_or_a_log(
    make_runtime: MakeRuntime, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level("DEBUG")
    notes = None
    rt = make_runtime()
    notes = rt.sources[0]
    rt2 = make_runtime(sources=[notes, LeakySource()])
    code = (
        "r = tools.leaky.echo()\nprint(r)\n"
        "try:\n    tools.leaky.boom()\nexcept Exception as e:\n    print(e)\n" + WRITE_THEN_READ
    )
    paused = rt2.engine.execute("alice", code)
    done = rt2.engine.resume(paused.id, "alice", Action.ACCEPT)
    assert done.status is ExecutionStatus.COMPLETED
    assert "[REDACTED]" in done.logs
    # And through a crash and recovery.
    # (The echo is made at once: the crash comes after it ran, before its journal entry.)
    point = CrashPoint.parse("tool_call:succeed_at_least_once:requested->succeeded:after_effect")
    crashing = make_runtime(sources=[notes, LeakySource()], faults=Faults([point]))
    with pytest.raises(InjectedCrash):
        crashing.engine.execute("alice", "tools.leaky.echo()\n" + WRITE_THEN_READ)
    restart(make_runtime, sources=[notes, LeakySource()])
    dump = database_dump(rt2)
    assert "REDACTED" in dump  # the dump really holds the redacted results
    assert CANARY not in dump
    assert CANARY not in caplog.text
    out, err = capfd.readouterr()
    assert CANARY not in out and CANARY not in err


def database_dump(rt: Runtime) -> str:
    """Every row of every table, as text (bytes decoded loosely so snapshots are searched)."""
    return "\n".join(text for _, text in AuditQueries(rt.engine.store.engine).stored_text())
