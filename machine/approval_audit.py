"""Every decision on a gated call is an audit record: who decided (the door, the actor, the
person when one decided, the client), what exactly (the tool, a digest of the exact
arguments journaled for the call),
under which policy (a digest of the rules that applied to the execution's principal), when,
and until when the approval could have been given.

The record is the call's `decision`, written in the decision's own transaction (the write
path's `approve` or `decline` step), so no decision exists without its record and no record
without its decision. `lockgate audit export` reads them back as JSON lines.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from pydantic import JsonValue

from lockgate.machine import tracing
from lockgate.machine.policy import Policy


class Door(StrEnum):
    """How a decision reached the server."""

    #: The MCP `resume` tool (the model, in approval mode `model`; decline or cancel in any).
    RESUME = "resume"
    #: `POST /api/executions/{id}/resume` with the principal's API key.
    HTTP_API = "http_api"
    #: The approval page, by a signed-in approver.
    APPROVAL_PAGE = "approval_page"
    #: The approvals inbox, by a signed-in approver.
    INBOX = "inbox"
    #: The client's own prompt to its person (MCP elicitation, approval mode `native`).
    CLIENT_PROMPT = "client_prompt"
    #: `tasks/update` or `tasks/cancel` of the tasks extension (the client's person).
    TASK = "task_update"
    #: Code inside the server (tests, tools of the operator's own).
    SERVER = "server"


@dataclass(frozen=True)
class PersonRef:
    """A person as an audit record names them: where they signed in, who, and how."""

    issuer: str
    subject: str
    name: str
    email: str | None
    #: `oidc` or `passkey`.
    signed_in_with: str

    def as_json(self) -> dict[str, JsonValue]:
        return {
            "issuer": self.issuer,
            "subject": self.subject,
            "name": self.name,
            "email": self.email,
            "signedInWith": self.signed_in_with,
        }


@dataclass(frozen=True)
class Decider:
    """Who decided, through which door, with which client (its name and version); the
    signed-in person, when a person decided (None: the model, a client's prompt, the
    server)."""

    door: Door
    actor: str
    client: dict[str, JsonValue] | None = field(default=None)
    person: PersonRef | None = field(default=None)

    @classmethod
    def of_server(cls) -> Decider:
        return cls(Door.SERVER, "the server")

    @property
    def kind(self) -> str:
        """Who, in one word: `person` (signed in), `model` (the agent's own key, in approval
        mode `model`, or giving up its own call), `client` (the client's own prompt, trusted
        as its person's in mode `native`), or `server`."""
        if self.person is not None:
            return "person"
        return _KINDS.get(self.door, "server")


_KINDS = {
    Door.RESUME: "model",
    Door.HTTP_API: "model",
    Door.CLIENT_PROMPT: "client",
    Door.TASK: "client",
}


def arguments_digest(arguments: JsonValue) -> str:
    """sha256 of the arguments' canonical JSON: what a decision covered, exactly."""
    text = json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def policy_revision(policy: Policy) -> str:
    """A short digest of the rules in force: two decisions under the same rules share it."""
    return hashlib.sha256(policy.to_text().encode()).hexdigest()[:16]


def decision_record(
    action: str,
    content: JsonValue,
    decider: Decider,
    *,
    arguments: JsonValue,
    policy: Policy,
    decided_at: datetime,
    expires_at: datetime | None,
) -> dict[str, JsonValue]:
    """The call's `decision` as stored: the decision and its audit record, in one."""
    return {
        "action": action,
        "content": content,
        "door": decider.door.value,
        "by": decider.kind,
        "actor": decider.actor,
        "client": decider.client,
        "person": decider.person.as_json() if decider.person is not None else None,
        "argumentsDigest": arguments_digest(arguments),
        "policyRevision": policy_revision(policy),
        "decidedAt": decided_at.isoformat(),
        "expiresAt": expires_at.isoformat() if expires_at else None,
    }


def exported(
    *,
    execution_id: str,
    principal_id: str,
    seq: int,
    tool: str,
    decision: JsonValue,
    decided_at: datetime | None,
) -> dict[str, JsonValue]:
    """One line of `lockgate audit export` (a decision stored before audit records existed
    has only its action: the rest is null)."""
    record = decision if isinstance(decision, dict) else {}
    return {
        "executionId": execution_id,
        "principal": principal_id,
        "call": seq,
        "tool": f"tools.{tool}",
        "action": record.get("action"),
        "door": record.get("door"),
        "by": record.get("by"),
        "actor": record.get("actor"),
        "client": record.get("client"),
        "person": record.get("person"),
        "argumentsDigest": record.get("argumentsDigest"),
        "policyRevision": record.get("policyRevision"),
        "decidedAt": record.get("decidedAt") or (decided_at.isoformat() if decided_at else None),
        "expiresAt": record.get("expiresAt"),
    }


@contextmanager
def decision_span(
    trace_parent: str | None, execution_id: str, seq: int, tool: str, action: str, by: Decider
) -> Iterator[None]:
    """The decision's span: in the execution's trace (`trace_parent`, stored when it
    started), linked to the request that brought the decision."""
    with tracing.span(
        "lockgate.decision",
        parent=trace_parent,
        link_current=True,
        attributes=tracing.attributes_of(
            execution_id=execution_id, call=seq, tool=tool, action=action, door=str(by.door)
        ),
    ):
        yield
