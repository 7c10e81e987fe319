"""The guard and effect names of the spec, made executable.

A guard reads `Facts` and answers yes or no; an effect turns `Facts` into the column updates
written in the transition's own transaction. The spec names them; this module is the only
place that says what they mean, and `spec.load(bindings=BINDINGS)` refuses a spec that names
one not bound here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from lockgate.spec.checks import Bindings


@dataclass(frozen=True)
class Facts:
    """What a transition's guards and effects may look at."""

    now: datetime
    #: The record's stored fields, as read in the same transaction.
    record: Mapping[str, object] = field(default_factory=dict)
    #: What the caller brings (a decision, a snapshot, the lease decision, ...).
    given: Mapping[str, object] = field(default_factory=dict)
    #: The operator's conservative recovery policy: every interrupted execution ends
    #: interrupted, and no call is ever retried after a crash.
    conservative: bool = False

    def require(self, key: str) -> object:
        if key not in self.given:
            raise KeyError(f"this transition needs the fact {key!r}")
        return self.given[key]


Guard = Callable[[Facts], bool]
Effect = Callable[[Facts], dict[str, object]]


def _deadline_passed(f: Facts) -> bool:
    # A tool call awaits approval under its execution's deadline, which the caller brings.
    deadline = f.given.get("deadline", f.record.get("deadline"))
    return isinstance(deadline, datetime) and f.now >= deadline


def _must_interrupt(f: Facts) -> bool:
    return f.conservative or bool(f.given.get("unsafe_in_doubt", False))


def _retry_allowed(f: Facts) -> bool:
    return bool(f.record.get("idempotent", False)) and not f.conservative


def _flag(name: str) -> Guard:
    def guard(f: Facts) -> bool:
        return bool(f.given.get(name, False))

    guard.__name__ = name
    return guard


def _lease_says_destroy(f: Facts) -> bool:
    return f.given.get("lease_decision") == "destroy"


def _copy(*keys: str) -> Effect:
    """An effect that stores facts the caller brought under the same column names."""

    def effect(f: Facts) -> dict[str, object]:
        return {key: f.require(key) for key in keys}

    return effect


def _set(**values: object) -> Effect:
    def effect(f: Facts) -> dict[str, object]:
        return dict(values)

    return effect


def _record_decision(f: Facts) -> dict[str, object]:
    return {"decision": f.require("decision"), "decided_at": f.now}


def _record_grant_cover(f: Facts) -> dict[str, object]:
    """A call an earlier grant covers records that decision; one the policy approved, none."""
    if "decision" not in f.given:
        return {}
    return {"decision": f.given["decision"], "decided_at": f.now}


def _store_questions(f: Facts) -> dict[str, object]:
    """The tool's new questions; the answers given in earlier rounds are kept (the call is
    made again with all of them)."""
    kept = f.record.get("input")
    answers = kept.get("answers", {}) if isinstance(kept, dict) else {}
    return {
        "input": {
            "asked": f.require("asked"),
            "answers": answers,
            "before_task": bool(f.given.get("before_task", False)),
        }
    }


def _store_answers(f: Facts) -> dict[str, object]:
    """The answers that arrived, added to those stored (checked by the caller)."""
    kept = f.record.get("input")
    stored = dict(kept) if isinstance(kept, dict) else {}
    answers = stored.get("answers")
    merged = {**(answers if isinstance(answers, dict) else {}), **dict(_mapping(f, "answers"))}
    return {"input": {**stored, "answers": merged}}


def _mapping(f: Facts, key: str) -> Mapping[str, object]:
    value = f.require(key)
    if not isinstance(value, Mapping):
        raise TypeError(f"the fact {key!r} must be a mapping")
    return value


def _delivery_due(f: Facts) -> bool:
    due = f.record.get("next_attempt_at")
    return isinstance(due, datetime) and f.now >= due


def _attempt(f: Facts) -> int:
    """The number of the attempt that just ended (the row counts finished ones)."""
    done = f.record.get("attempts", 0)
    return (done if isinstance(done, int) else 0) + 1


def _attempts_exhausted(f: Facts) -> bool:
    return _attempt(f) >= int(str(f.require("max_attempts")))


def _claim_attempt(f: Facts) -> dict[str, object]:
    # The claim lasts past the attempt's own bound: no other instance sends it meanwhile.
    return {"next_attempt_at": f.require("claimed_until"), "claimed_by": f.require("owner")}


def _record_delivery(f: Facts) -> dict[str, object]:
    return {"attempts": _attempt(f), "delivered_at": f.now, "last_error": None}


def _schedule_retry(f: Facts) -> dict[str, object]:
    return {
        "attempts": _attempt(f),
        "next_attempt_at": f.require("retry_at"),
        "last_error": f.require("error"),
        "claimed_by": None,
    }


def _record_failure(f: Facts) -> dict[str, object]:
    return {"attempts": _attempt(f), "last_error": f.require("error"), "claimed_by": None}


def _touch(f: Facts) -> dict[str, object]:
    return {"last_activity": f.now}


@dataclass(frozen=True)
class MachineBindings:
    guards: Mapping[str, Guard]
    effects: Mapping[str, Effect]

    def names(self) -> Bindings:
        return Bindings(frozenset(self.guards), frozenset(self.effects))


def _lifetime_over(f: Facts) -> bool:
    expires = f.record.get("expires_at")
    return isinstance(expires, datetime) and f.now >= expires


def _record_end(f: Facts) -> dict[str, object]:
    return {"ended_at": f.now}


def _record_use(f: Facts) -> dict[str, object]:
    return {"used_at": f.now}


BINDINGS: Mapping[str, MachineBindings] = {
    "execution": MachineBindings(
        guards={"deadline_passed": _deadline_passed, "must_interrupt": _must_interrupt},
        effects={
            "claim_owner": _copy("owner"),
            "release_owner": _set(owner=None),
            "store_snapshot": _copy("snapshot"),
            "set_deadline": _copy("deadline"),
            "store_outcome": _copy("outcome"),
            "record_what_ran": _copy("what_ran"),
        },
    ),
    "tool_call": MachineBindings(
        guards={
            "deadline_passed": _deadline_passed,
            "retry_allowed": _retry_allowed,
            "execution_ended": _flag("execution_ended"),
        },
        effects={
            "store_arguments_preview": _copy("arguments_preview"),
            "record_decision": _record_decision,
            "record_grant_cover": _record_grant_cover,
            "store_result": _copy("result"),
            "store_questions": _store_questions,
            "store_answers": _store_answers,
        },
    ),
    "session": MachineBindings(
        guards={"lease_says_destroy": _lease_says_destroy},
        effects={"touch": _touch, "record_log_level": _copy("log_level")},
    ),
    "owed_request": MachineBindings(
        guards={"session_ended": _flag("session_ended")},
        effects={},
    ),
    "instance": MachineBindings(
        guards={},
        effects={"extend_lease": _copy("lease_until"), "release_work": _set()},
    ),
    "webhook_delivery": MachineBindings(
        guards={"delivery_due": _delivery_due, "attempts_exhausted": _attempts_exhausted},
        effects={
            "claim_attempt": _claim_attempt,
            "record_delivery": _record_delivery,
            "schedule_retry": _schedule_retry,
            "record_failure": _record_failure,
        },
    ),
    "approver_session": MachineBindings(
        guards={"lifetime_over": _lifetime_over},
        effects={"record_end": _record_end},
    ),
    "enrolment": MachineBindings(
        guards={"lifetime_over": _lifetime_over},
        effects={"record_use": _record_use},
    ),
}


def binding_names() -> Mapping[str, Bindings]:
    return {name: b.names() for name, b in BINDINGS.items()}
