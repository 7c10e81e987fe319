"""What a tool is given when the engine calls it, and what the code gets back when it fails:
the execution's principal and its call's key in the context, a missing secret's message, and
an unexpected exception's type, never its message, in the result and in the log."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from pydantic import JsonValue

from lockgate.machine.policy import PolicyDecision
from lockgate.machine.tools.registry import Tool, ToolContext, ToolSpec
from lockgate.spec import ExecutionStatus
from tests.support.engine_records import MakeRuntime

#: What each tool saw of its context, by tool name.
Seen = dict[str, ToolContext]


def _spec(name: str, secrets: tuple[str, ...] = ()) -> ToolSpec:
    return ToolSpec(
        source="probe",
        name=name,
        description="records its context",
        idempotent=True,
        default_policy=PolicyDecision.APPROVE,
        secrets=secrets,
    )


class _Probe:
    def __init__(self, name: str, seen: Seen, *, secrets: tuple[str, ...] = ()) -> None:
        self.spec = _spec(name, secrets)
        self._seen = seen

    def call(self, arguments: dict[str, JsonValue], context: ToolContext) -> JsonValue:
        self._seen[self.spec.name] = context
        if self.spec.name == "crash":
            raise KeyError("the upstream said something private")
        return "ok"


class ProbeSource:
    name = "probe"

    def __init__(self, seen: Seen) -> None:
        self._seen = seen

    def tools(self) -> Sequence[Tool]:
        return [
            _Probe("look", self._seen),
            _Probe("crash", self._seen),
            _Probe("locked", self._seen, secrets=("absent_token",)),
        ]


CATCH = "try:\n    tools.probe.{0}()\nexcept RuntimeError as e:\n    got = str(e)\ngot"


def test_a_tool_is_given_the_executions_principal(make_runtime: MakeRuntime) -> None:
    seen: Seen = {}
    rt = make_runtime(sources=[ProbeSource(seen)])
    done = rt.engine.execute("alice", "tools.probe.look()")
    assert done.status is ExecutionStatus.COMPLETED, done.error
    assert seen["look"].principal_id == "alice"
    assert seen["look"].idempotency_key  # the call's id, stable across a replay


def test_a_missing_secret_fails_the_call_with_its_name_before_the_tool_runs(
    make_runtime: MakeRuntime,
) -> None:
    seen: Seen = {}
    rt = make_runtime(sources=[ProbeSource(seen)])
    done = rt.engine.execute("alice", CATCH.format("locked"))
    assert done.status is ExecutionStatus.COMPLETED, done.error
    assert done.result == "tools.probe.locked failed: secret 'absent_token' not configured"
    assert "locked" not in seen


def test_an_unexpected_exception_reaches_the_code_and_the_log_as_its_type_only(
    make_runtime: MakeRuntime, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("WARNING")
    rt = make_runtime(sources=[ProbeSource({})])
    done = rt.engine.execute("alice", CATCH.format("crash"))
    assert done.status is ExecutionStatus.COMPLETED, done.error
    assert done.result == "tools.probe.crash failed: the tool failed unexpectedly (KeyError)"
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert "tool probe.crash raised KeyError" in warnings
    assert "private" not in caplog.text
