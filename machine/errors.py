"""One root error type with stable codes.

Errors are part of the interface: every one carries a `code` clients and operators can rely
on, a message that says what happened and what to do next, and structured keyword-only
fields. None of them ever carries a secret or an internal detail (a stack, a SQL string).
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import JsonValue


class ErrorCode(StrEnum):
    ILLEGAL_TRANSITION = "illegal_transition"
    GUARD_REFUSED = "guard_refused"
    CONFLICT = "conflict"
    NOT_FOUND = "not_found"
    EXPIRED = "expired"
    FORBIDDEN = "forbidden"
    ALREADY_SETTLED = "already_settled"
    INTERRUPTED = "interrupted"
    RUNTIME_MISMATCH = "runtime_mismatch"
    INVALID_INPUT = "invalid_input"
    UNKNOWN_TOOL = "unknown_tool"
    INVALID_ARGUMENTS = "invalid_arguments"
    BLOCKED = "blocked"
    SNAPSHOT_CORRUPT = "snapshot_corrupt"
    LIMIT_REACHED = "limit_reached"
    IDEMPOTENCY_KEY_REUSED = "idempotency_key_reused"


class LockgateError(Exception):
    """The root of every error Lockgate raises on purpose."""

    code: ErrorCode

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def as_dict(self) -> dict[str, JsonValue]:
        out: dict[str, JsonValue] = {"code": str(self.code), "message": self.message}
        if self.hint:
            out["hint"] = self.hint
        return out


class IllegalTransition(LockgateError):
    """An event that the spec does not allow from the record's current state."""

    code = ErrorCode.ILLEGAL_TRANSITION

    def __init__(
        self, *, machine: str, record_id: str, event: str, source: str, dest: str | None = None
    ) -> None:
        self.machine, self.record_id, self.event = machine, record_id, event
        self.source, self.dest = source, dest
        target = f"to {dest!r} " if dest else ""
        super().__init__(
            f"{machine} {record_id}: {event!r} {target}is not a transition the spec declares "
            f"from {source!r}",
            hint="This is a bug in the caller: only the spec's edges may be written.",
        )


class GuardRefused(LockgateError):
    """The event is declared from this state, but none of its guards hold right now."""

    code = ErrorCode.GUARD_REFUSED

    def __init__(self, *, machine: str, record_id: str, event: str, source: str) -> None:
        self.machine, self.record_id, self.event, self.source = machine, record_id, event, source
        super().__init__(
            f"{machine} {record_id}: {event!r} from {source!r} is not allowed now "
            "(its guards do not hold)"
        )


class Conflict(LockgateError):
    """Another writer changed the record first (optimistic concurrency lost the race)."""

    code = ErrorCode.CONFLICT

    def __init__(self, *, machine: str, record_id: str, expected_version: int) -> None:
        self.machine, self.record_id = machine, record_id
        self.expected_version = expected_version
        super().__init__(
            f"{machine} {record_id} was changed by another writer (expected version "
            f"{expected_version})",
            hint="Read the record again and decide on its current state.",
        )


#: What a write raises when someone else moved the record first (another thread or
#: instance): the step it meant to take is moot, so callers that only keep state in step
#: (activity, ledger entries, leases) skip it rather than fail.
STALE_WRITE = (Conflict, GuardRefused, IllegalTransition)
