"""Loops without one prompt per call: an approval that also covers the next calls of the
same tool in the same execution.

A person accepting a call may add a grant to the decision (`content: {"grant": {"calls": N}}`,
or `{"grant": {"untilEnd": true}}` for every later call of that tool until the execution
ends). The grant is part of that one decision's record. Each later call of the tool that the
policy would have paused is then approved by the grant instead, while the grant has room:
it still gets its own journal entry, with its own record (door `grant`, the call it was
covered by, the digest of its own arguments). A grant never covers another tool, another
execution, or a call the policy blocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from pydantic import JsonValue

from lockgate.machine.approval_audit import arguments_digest, policy_revision
from lockgate.machine.errors import ErrorCode, LockgateError
from lockgate.machine.policy import Policy


class InvalidGrant(LockgateError):
    code = ErrorCode.INVALID_INPUT


@dataclass(frozen=True)
class Grant:
    #: The most later calls it covers (None: every one until the execution ends).
    calls: int | None


def grant_of(content: JsonValue, max_calls: int) -> Grant | None:
    """The grant a decision's content asks for, checked (None: no grant)."""
    if not isinstance(content, dict) or "grant" not in content:
        return None
    asked = content["grant"]
    usage = 'A grant is {"calls": N} (1 to the execution\'s call limit) or {"untilEnd": true}.'
    if not isinstance(asked, dict):
        raise InvalidGrant("the grant is not an object", hint=usage)
    if asked == {"untilEnd": True}:
        return Grant(None)
    calls = asked.get("calls")
    if set(asked) != {"calls"} or not isinstance(calls, int) or isinstance(calls, bool):
        raise InvalidGrant(f"the grant {asked!r} cannot be read", hint=usage)
    if not 1 <= calls <= max_calls:
        raise InvalidGrant(f"a grant covers 1 to {max_calls} calls, not {calls}", hint=usage)
    return Grant(calls)


def covering(
    decided: Sequence[tuple[int, JsonValue]],
    *,
    arguments: JsonValue,
    policy: Policy,
    now: datetime,
    max_calls: int,
) -> dict[str, JsonValue] | None:
    """The record of the decision that covers the next call of a tool, given the tool's
    decided calls in this execution (`(seq, decision)`, in call order), or None."""
    used: dict[int, int] = {}
    for _, decision in decided:
        if isinstance(decision, dict) and isinstance(decision.get("coveredBy"), int):
            by = int(decision["coveredBy"])  # type: ignore[arg-type]
            used[by] = used.get(by, 0) + 1
    for seq, decision in reversed(decided):
        if not isinstance(decision, dict) or decision.get("action") != "accept":
            continue
        try:
            grant = grant_of(decision.get("content"), max_calls)
        except InvalidGrant:
            continue
        if grant is None:
            continue
        if grant.calls is not None and used.get(seq, 0) >= grant.calls:
            return None  # the latest grant is used up
        return {
            "action": "accept",
            "content": None,
            "door": "grant",
            "by": "grant",
            "actor": f"the grant given with call {seq}",
            "client": None,
            # The person who gave the grant, as that decision's record names them.
            "person": decision.get("person"),
            "coveredBy": seq,
            "argumentsDigest": arguments_digest(arguments),
            "policyRevision": policy_revision(policy),
            "decidedAt": now.isoformat(),
            "expiresAt": None,
        }
    return None
