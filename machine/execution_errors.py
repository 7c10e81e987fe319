"""What can go wrong when a client acts on an execution: each case named, with a next step."""

from __future__ import annotations

from pydantic import JsonValue

from lockgate.machine.errors import ErrorCode, LockgateError

REEXECUTE = "Run the code again with `execute` to start a new execution."


class ExecutionNotFound(LockgateError):
    code = ErrorCode.NOT_FOUND

    def __init__(self, *, execution_id: str) -> None:
        self.execution_id = execution_id
        super().__init__(
            f"No execution {execution_id!r} exists for this API key.",
            hint="Check the executionId (an execution is seen only by the principal whose key "
            f"started it). {REEXECUTE}",
        )


class ExecutionExpired(LockgateError):
    code = ErrorCode.EXPIRED

    def __init__(self, *, execution_id: str, deadline: str | None) -> None:
        self.execution_id, self.deadline = execution_id, deadline
        when = f" at {deadline}" if deadline else ""
        super().__init__(
            f"Execution {execution_id!r} expired{when}: no decision arrived before its "
            "approval deadline, and the pending tool call was not made.",
            hint=REEXECUTE,
        )


class ExecutionAlreadySettled(LockgateError):
    code = ErrorCode.ALREADY_SETTLED

    def __init__(self, *, execution_id: str, status: str, detail: str) -> None:
        self.execution_id, self.status = execution_id, status
        super().__init__(
            f"Execution {execution_id!r} is not waiting for a decision ({detail}; it is "
            f"{status} now).",
            hint="Fetch the execution to see its outcome, or wait for it to finish."
            + ("" if status == "running" else f" {REEXECUTE}"),
        )


class ExecutionInterrupted(LockgateError):
    code = ErrorCode.INTERRUPTED

    def __init__(self, *, execution_id: str, what_ran: JsonValue) -> None:
        self.execution_id, self.what_ran = execution_id, what_ran
        # What cut it off, when it was not a crash (a call sent and its answer lost).
        cause = what_ran.get("cause") if isinstance(what_ran, dict) else None
        super().__init__(
            (
                f"Execution {execution_id!r} was interrupted: {cause.rstrip('.')}. Going on "
                "could have repeated that call"
                if isinstance(cause, str)
                else f"Execution {execution_id!r} was interrupted by a server crash at a point "
                "where going on could have repeated a tool call"
            )
            + "; see what_ran for the calls that completed and the call in doubt.",
            hint="Check whether the call in doubt took effect before running the code again.",
        )

    def as_dict(self) -> dict[str, JsonValue]:
        return {**super().as_dict(), "what_ran": self.what_ran}


class InvalidExecutionInput(LockgateError):
    code = ErrorCode.INVALID_INPUT


def code_too_long(length: int, limit: int) -> str:
    """What a client is told of code over the server's bound, wherever it is checked."""
    return f"The code is {length} characters long; the limit is {limit}. Send a shorter program."


class IdempotencyKeyReused(LockgateError):
    """`execute` named an idempotency key the principal already used for different code."""

    code = ErrorCode.IDEMPOTENCY_KEY_REUSED

    def __init__(self, *, execution_id: str) -> None:
        self.execution_id = execution_id
        super().__init__(
            f"This idempotencyKey already started execution {execution_id!r}, with different "
            "code; nothing was started.",
            hint=f"To wait for that execution, call resume with executionId={execution_id}. "
            "To run this code, send it with a new idempotencyKey (or none).",
        )


class LimitReached(LockgateError):
    """The principal is at one of its admission limits; nothing was started or decided.

    `setting` names the environment variable an operator raises to allow more, `limit` its
    value. Build it with `running` or `paused`."""

    code = ErrorCode.LIMIT_REACHED

    def __init__(self, message: str, *, hint: str, setting: str, limit: int) -> None:
        self.setting, self.limit = setting, limit
        super().__init__(message, hint=hint)

    @classmethod
    def running(cls, limit: int) -> LimitReached:
        setting = "LOCKGATE_MAX_RUNNING_PER_PRINCIPAL"
        return cls(
            f"You already have {limit} executions running on this server (the limit, "
            f"{setting}). Nothing was started or decided.",
            hint="Wait for one to finish (call resume with its executionId and no action) "
            "and retry.",
            setting=setting,
            limit=limit,
        )

    @classmethod
    def paused(cls, limit: int) -> LimitReached:
        setting = "LOCKGATE_MAX_PAUSED_PER_PRINCIPAL"
        return cls(
            f"You already have {limit} unfinished executions, waiting for approval or "
            f"running (the limit, {setting}). The code was not started.",
            hint="Settle some of them first (have them approved, give them up with resume "
            "and action decline or cancel, or let them expire) and retry.",
            setting=setting,
            limit=limit,
        )

    def as_dict(self) -> dict[str, JsonValue]:
        return {**super().as_dict(), "setting": self.setting, "limit": self.limit}
