"""What a tool is given when the engine calls it, and what the code gets back when it fails:
the execution's principal and its call's key in the context, a missing secret's message, and
an unexpected exception's type, never its message, in the result and in the log; a positional
argument refused before anything is journaled; a pause that records its own call."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

import pytest
from pydantic import JsonValue

from lockgate.machine.dispatcher import ARGUMENTS_PREVIEW_BYTES
from lockgate.machine.engine import Action
from lockgate.machine.faults import Faults, InjectedCrash
from lockgate.machine.policy import PolicyDecision
from lockgate.machine.tools.registry import Tool, ToolContext, ToolSpec
from lockgate.machine.values import json_size
from lockgate.spec import CrashPoint, ExecutionStatus
from tests.support.engine_records import WRITE_THEN_READ, MakeRuntime, restart, writes

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
    assert seen["look"].idempotency_key == f"{done.id}:1"  # the call's id: same on a replay


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


def test_a_positional_argument_is_refused_with_the_rule(make_runtime: MakeRuntime) -> None:
    rt = make_runtime()
    code = 'try:\n    tools.notes.read("k")\nexcept TypeError as e:\n    got = str(e)\ngot'
    done = rt.engine.execute("alice", code)
    assert done.status is ExecutionStatus.COMPLETED, done.error
    assert isinstance(done.result, str)
    assert "got 1 positional argument(s)" in done.result, done.result
    assert done.calls == []  # nothing was requested that could run: no journal row


def test_a_pause_without_per_call_checkpoints_still_names_its_call_and_resumes(
    make_runtime: MakeRuntime,
) -> None:
    # With checkpoint_every_call off, the checkpoint before a call keeps the old snapshot:
    # only the pause itself records which call the saved state waits on.
    rt = make_runtime(checkpoint_every_call=False)
    code = 'print("before")\n' + WRITE_THEN_READ
    paused = rt.engine.execute("alice", code)
    assert paused.status is ExecutionStatus.WAITING_FOR_INTERACTION
    assert paused.pending is not None and paused.pending.seq == 1
    assert paused.pending.tool == "notes.write"
    later = restart(make_runtime, checkpoint_every_call=False)
    done = later.engine.resume(paused.id, "alice", Action.ACCEPT)
    assert done.status is ExecutionStatus.COMPLETED, done.error
    assert done.result == {"key": "k", "text": "v"}
    assert done.logs == "before\n"


def test_every_sandbox_step_is_counted_against_the_executions_principal(
    make_runtime: MakeRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The fair share of sandbox workers is kept per principal: a resume counted against
    # nobody would let one principal's long loops take every worker.
    rt = make_runtime()
    slots = rt.sandbox.slots
    counted: list[str] = []
    acquire = slots.acquire

    def recording(principal: str) -> AbstractContextManager[None]:
        counted.append(principal)
        return acquire(principal)

    monkeypatch.setattr(slots, "acquire", recording)
    paused = rt.engine.execute("alice", "tools.notes.list()\n" + WRITE_THEN_READ)
    rt.engine.resume(paused.id, "alice", Action.ACCEPT)
    assert len(counted) == 4  # the start, and a resume after each of the three calls
    assert set(counted) == {"alice"}


def _write_of(size: int) -> str:
    """Code whose paused write's arguments are exactly `size` bytes of compact JSON."""
    overhead = len('{"key":"k","text":""}')
    text = "x" * (size - overhead)
    return f'tools.notes.write(key="k", text="{text}")\ntools.notes.read(key="k")'


def test_an_approval_shows_the_arguments_whole_up_to_the_preview_limit(
    make_runtime: MakeRuntime,
) -> None:
    rt = make_runtime()
    at_limit = rt.engine.execute("alice", _write_of(ARGUMENTS_PREVIEW_BYTES))
    assert at_limit.pending is not None
    assert json_size(at_limit.pending.arguments_preview) == ARGUMENTS_PREVIEW_BYTES
    assert at_limit.pending.arguments_preview == {
        "key": "k",
        "text": "x" * (ARGUMENTS_PREVIEW_BYTES - len('{"key":"k","text":""}')),
    }
    past = rt.engine.execute("alice", _write_of(ARGUMENTS_PREVIEW_BYTES + 1))
    assert past.pending is not None
    preview = past.pending.arguments_preview
    assert isinstance(preview, dict) and preview["truncated"] is True
    assert preview["original_bytes"] == ARGUMENTS_PREVIEW_BYTES + 1
    assert json_size(preview) <= ARGUMENTS_PREVIEW_BYTES
    # The call itself still gets every byte once approved.
    done = rt.engine.resume(past.id, "alice", Action.ACCEPT)
    assert done.status is ExecutionStatus.COMPLETED, done.error
    assert done.result == {
        "key": "k",
        "text": "x" * (ARGUMENTS_PREVIEW_BYTES + 1 - len('{"key":"k","text":""}')),
    }


def test_a_crash_after_a_resume_without_per_call_checkpoints_replays_from_the_pause(
    make_runtime: MakeRuntime,
) -> None:
    # Without per-call checkpoints the saved state is the pause's, waiting on call 1; a
    # later call must not claim it (recovery would hand call 2's result to call 1).
    # (Call 2 is a delete the policy approves: sent intent first, it takes a checkpoint.)
    settings: dict[str, Any] = {"checkpoint_every_call": False, "policy": "notes.delete=approve"}
    rt = make_runtime(**settings)
    code = 'w = tools.notes.write(key="k", text="v")\nd = tools.notes.delete(key="k")\n[w, d]'
    paused = rt.engine.execute("alice", code)
    assert paused.pending is not None and paused.pending.seq == 1
    point = CrashPoint.parse("tool_call:succeed:dispatched->succeeded:after_commit")
    crashing = restart(make_runtime, faults=Faults([point], skip=1), **settings)
    with pytest.raises(InjectedCrash):
        crashing.engine.resume(paused.id, "alice", Action.ACCEPT)
    later = restart(make_runtime, **settings)
    done = later.engine.view(paused.id)
    assert done.status is ExecutionStatus.COMPLETED, done.error
    assert done.result == [{"key": "k", "written": True}, {"key": "k", "deleted": True}]
    assert len(writes(later)) == 2  # neither the write nor the delete was made again


class _Bounded:
    """A write that needs a person's approval and takes a count between 1 and 10."""

    spec = ToolSpec(
        source="bounded",
        name="put",
        description="a gated write with a bounded argument",
        parameters={
            "type": "object",
            "properties": {"count": {"type": "integer", "minimum": 1, "maximum": 10}},
            "required": ["count"],
            "additionalProperties": False,
        },
    )

    def call(self, arguments: dict[str, JsonValue], context: ToolContext) -> JsonValue:
        raise AssertionError("a call breaking its schema must never reach the tool")


class BoundedSource:
    name = "bounded"

    def tools(self) -> Sequence[Tool]:
        return [_Bounded()]


def test_an_argument_breaking_a_rule_fails_at_the_call_and_never_asks_for_approval(
    make_runtime: MakeRuntime,
) -> None:
    rt = make_runtime(sources=[BoundedSource()])
    code = "try:\n    tools.bounded.put(count=0)\nexcept TypeError as e:\n    got = str(e)\ngot"
    done = rt.engine.execute("alice", code)
    assert done.status is ExecutionStatus.COMPLETED, done.error  # no pause for a person
    assert isinstance(done.result, str)
    assert "argument 'count': 0 is less than the minimum of 1 (rule: minimum)" in done.result
    assert done.calls == []  # nothing journaled, nothing waiting
