"""What a client reads when acting on an execution or calling a tool goes wrong: every error's
stable code, its message and its hint, exactly, in one table.

A model sees only this text, so it is the interface: each message says what happened, each
hint what to do next, with the ids and settings to do it. The HTTP tests
(`test_server_bad_input.py`, `test_fairness.py`) show these reach the client unchanged; this
table pins the words themselves, fast.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from pydantic import JsonValue

from lockgate.machine.errors import Conflict, GuardRefused, IllegalTransition, LockgateError
from lockgate.machine.execution_errors import (
    ExecutionAlreadySettled,
    ExecutionExpired,
    ExecutionInterrupted,
    ExecutionNotFound,
    IdempotencyKeyReused,
    LimitReached,
)
from lockgate.machine.policy import InvalidPolicy, ToolBlocked
from lockgate.machine.sandbox import RuntimeMismatch, SnapshotCorrupt
from lockgate.machine.secrets import MissingSecret
from lockgate.machine.tools.errors import InvalidArguments, UnknownTool

REEXECUTE = "Run the code again with `execute` to start a new execution."

#: (what went wrong, how the error is made, what the client reads). Each error is made inside
#: its test, not at import: mutation testing links a test to the code it runs, and code run
#: while tests are collected is linked to none.
CASES: list[tuple[str, Callable[[], LockgateError], dict[str, JsonValue]]] = [
    (
        "an execution the key cannot see",
        lambda: ExecutionNotFound(execution_id="e1"),
        {
            "code": "not_found",
            "message": "No execution 'e1' exists for this API key.",
            "hint": "Check the executionId (an execution is seen only by the principal whose "
            f"key started it). {REEXECUTE}",
        },
    ),
    (
        "an execution past its approval deadline",
        lambda: ExecutionExpired(execution_id="e1", deadline="2026-06-01T12:00:00Z"),
        {
            "code": "expired",
            "message": "Execution 'e1' expired at 2026-06-01T12:00:00Z: no decision arrived "
            "before its approval deadline, and the pending tool call was not made.",
            "hint": REEXECUTE,
        },
    ),
    (
        "an expired execution whose deadline is not known",
        lambda: ExecutionExpired(execution_id="e1", deadline=None),
        {
            "code": "expired",
            "message": "Execution 'e1' expired: no decision arrived before its approval "
            "deadline, and the pending tool call was not made.",
            "hint": REEXECUTE,
        },
    ),
    (
        "a decision for an execution that is running on",
        lambda: ExecutionAlreadySettled(
            execution_id="e1", status="running", detail="it is not paused"
        ),
        {
            "code": "already_settled",
            "message": "Execution 'e1' is not waiting for a decision (it is not paused; it is "
            "running now).",
            "hint": "Fetch the execution to see its outcome, or wait for it to finish.",
        },
    ),
    (
        "a decision for an execution that has ended",
        lambda: ExecutionAlreadySettled(
            execution_id="e1",
            status="completed",
            detail="a decision was already recorded (accept)",
        ),
        {
            "code": "already_settled",
            "message": "Execution 'e1' is not waiting for a decision (a decision was already "
            "recorded (accept); it is completed now).",
            "hint": "Fetch the execution to see its outcome, or wait for it to finish. "
            + REEXECUTE,
        },
    ),
    (
        "an execution a crash interrupted with a call in doubt",
        lambda: ExecutionInterrupted(
            execution_id="e1", what_ran={"completed": ["notes.read"], "in_doubt": "notes.write"}
        ),
        {
            "code": "interrupted",
            "message": "Execution 'e1' was interrupted by a server crash at a point where "
            "going on could have repeated a tool call; see what_ran for the calls that "
            "completed and the call in doubt.",
            "hint": "Check whether the call in doubt took effect before running the code again.",
            "what_ran": {"completed": ["notes.read"], "in_doubt": "notes.write"},
        },
    ),
    (
        "an idempotency key sent again with other code",
        lambda: IdempotencyKeyReused(execution_id="e1"),
        {
            "code": "idempotency_key_reused",
            "message": "This idempotencyKey already started execution 'e1', with different "
            "code; nothing was started.",
            "hint": "To wait for that execution, call resume with executionId=e1. To run "
            "this code, send it with a new idempotencyKey (or none).",
        },
    ),
    (
        "a principal at its running limit",
        lambda: LimitReached.running(4),
        {
            "code": "limit_reached",
            "message": "You already have 4 executions running on this server (the limit, "
            "LOCKGATE_MAX_RUNNING_PER_PRINCIPAL). Nothing was started or decided.",
            "hint": "Wait for one to finish (call resume with its executionId and no action) "
            "and retry.",
            "setting": "LOCKGATE_MAX_RUNNING_PER_PRINCIPAL",
            "limit": 4,
        },
    ),
    (
        "a principal at its paused limit",
        lambda: LimitReached.paused(2),
        {
            "code": "limit_reached",
            "message": "You already have 2 unfinished executions, waiting for approval or "
            "running (the limit, LOCKGATE_MAX_PAUSED_PER_PRINCIPAL). The code was not started.",
            "hint": "Settle some of them first (have them approved, give them up with resume "
            "and action decline or cancel, or let them expire) and retry.",
            "setting": "LOCKGATE_MAX_PAUSED_PER_PRINCIPAL",
            "limit": 2,
        },
    ),
    (
        "a misspelt tool",
        lambda: UnknownTool(
            name="notes.writ",
            suggestions=["notes.write", "notes.read"],
            discovery_hint="Call describe_tools to list them.",
        ),
        {
            "code": "unknown_tool",
            "message": "there is no tool 'notes.writ'",
            "hint": "Did you mean notes.write, notes.read? Call describe_tools to list them.",
        },
    ),
    (
        "a tool with no near name",
        lambda: UnknownTool(
            name="x", suggestions=[], discovery_hint="Call describe_tools to list them."
        ),
        {
            "code": "unknown_tool",
            "message": "there is no tool 'x'",
            "hint": "Call describe_tools to list them.",
        },
    ),
    (
        "arguments that do not fit the tool",
        lambda: InvalidArguments(
            tool="notes.write",
            problems=["key: required", "text: must be a string"],
            usage="notes.write(key: str, text: str)",
        ),
        {
            "code": "invalid_arguments",
            "message": "tools.notes.write: key: required; text: must be a string",
            "hint": "notes.write(key: str, text: str)",
        },
    ),
    (
        "a tool the policy blocks",
        lambda: ToolBlocked(tool="notes.delete"),
        {
            "code": "blocked",
            "message": "tools.notes.delete is blocked by policy and was not called",
            "hint": "Use another tool, or ask an operator to change the tool policy.",
        },
    ),
    (
        "a policy an operator wrote wrong",
        lambda: InvalidPolicy("bad rule 'x'"),
        {
            "code": "invalid_input",
            "message": "bad rule 'x'",
            "hint": "Write rules as pattern=decision separated by commas, with patterns '*', "
            "'source.*' or 'source.name' (without the 'tools.' prefix), or for a source a "
            "principal added, 'principal:source.*' or 'principal:source.name', an optional "
            "[condition] "
            "after the pattern naming an HTTP method (GET, HEAD, OPTIONS, POST, PUT, PATCH, "
            "DELETE) or a GraphQL operation type (query, mutation, subscription), and decisions "
            "approve, require_approval, block; for example "
            "'notes.*=approve,notes.delete=block,github.*[DELETE]=block'.",
        },
    ),
    (
        "secrets a tool needs that are not configured",
        lambda: MissingSecret(["a", "b"]),
        {
            "code": "not_found",
            "message": "secrets 'a', 'b' not configured",
            "hint": "Configure the secret in the server's secret store and try again.",
        },
    ),
    (
        "a paused execution made by another sandbox runtime version",
        lambda: RuntimeMismatch(sealed_version="0.9.0", running_version="1.4.0"),
        {
            "code": "runtime_mismatch",
            "message": "this execution was paused by sandbox runtime (Monty) 0.9.0, but this "
            "server runs Monty 1.4.0: the paused execution cannot be resumed by this server "
            "version",
            "hint": "Re-execute the code from the start, or resume it on a server running "
            "Monty 0.9.0.",
        },
    ),
    (
        "a paused execution whose stored snapshot is damaged",
        lambda: SnapshotCorrupt("its checksum does not match"),
        {
            "code": "snapshot_corrupt",
            "message": "the stored snapshot of this paused execution is damaged (its checksum "
            "does not match); it cannot be resumed",
            "hint": "Re-execute the code from the start.",
        },
    ),
    (
        "a write the spec does not declare (a bug, refused by the store)",
        lambda: IllegalTransition(
            machine="execution", record_id="e1", event="resume", source="completed", dest="running"
        ),
        {
            "code": "illegal_transition",
            "message": "execution e1: 'resume' to 'running' is not a transition the spec "
            "declares from 'completed'",
            "hint": "This is a bug in the caller: only the spec's edges may be written.",
        },
    ),
    (
        "a step whose guards do not hold now",
        lambda: GuardRefused(machine="execution", record_id="e1", event="resume", source="x"),
        {
            "code": "guard_refused",
            "message": "execution e1: 'resume' from 'x' is not allowed now (its guards do not "
            "hold)",
        },
    ),
    (
        "a write another writer got to first",
        lambda: Conflict(machine="execution", record_id="e1", expected_version=3),
        {
            "code": "conflict",
            "message": "execution e1 was changed by another writer (expected version 3)",
            "hint": "Read the record again and decide on its current state.",
        },
    ),
]


@pytest.mark.parametrize(("case", "make", "reads"), CASES, ids=[c[0] for c in CASES])
def test_each_error_reads_as_written(
    case: str, make: Callable[[], LockgateError], reads: dict[str, JsonValue]
) -> None:
    error = make()
    assert error.as_dict() == reads
    # The exception's own text is the message (what a log or a traceback shows).
    assert str(error) == reads["message"]


def test_the_limits_name_what_an_operator_raises() -> None:
    running, paused = LimitReached.running(3), LimitReached.paused(5)
    assert (running.setting, running.limit) == ("LOCKGATE_MAX_RUNNING_PER_PRINCIPAL", 3)
    assert (paused.setting, paused.limit) == ("LOCKGATE_MAX_PAUSED_PER_PRINCIPAL", 5)


def test_errors_keep_the_ids_a_client_acts_on() -> None:
    assert ExecutionNotFound(execution_id="e7").execution_id == "e7"
    expired = ExecutionExpired(execution_id="e7", deadline="then")
    assert (expired.execution_id, expired.deadline) == ("e7", "then")
    settled = ExecutionAlreadySettled(execution_id="e7", status="failed", detail="d")
    assert (settled.execution_id, settled.status) == ("e7", "failed")
    interrupted = ExecutionInterrupted(execution_id="e7", what_ran=[1])
    assert (interrupted.execution_id, interrupted.what_ran) == ("e7", [1])
    assert IdempotencyKeyReused(execution_id="e7").execution_id == "e7"
    unknown = UnknownTool(name="n", suggestions=["a"], discovery_hint="h")
    assert (unknown.name, unknown.suggestions) == ("n", ("a",))
    assert ToolBlocked(tool="t").tool == "t"
    assert Conflict(machine="m", record_id="r", expected_version=3).expected_version == 3
    invalid = InvalidArguments(tool="t", problems=["p"], usage="u")
    assert (invalid.tool, invalid.problems) == ("t", ("p",))
