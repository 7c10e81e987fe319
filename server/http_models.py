"""The HTTP API's bodies, as pydantic models: what a request sends and what an answer holds.

The request models are what the routes validate (`server/approval_page.py`,
`server/sign_in_routes.py`); the answer models describe, in `/openapi.json`, the JSON the
routes build (`public_view`, `CallShown.as_json`, the inbox's listing). The routes answer
with that JSON as it is built, not through these models: the document is checked against
the answers by tests/server/test_http_api_document.py, which fuzzes a running server with it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, field_validator

from lockgate.spec import ExecutionStatus

# -- refusals ---------------------------------------------------------------------------------


class ProblemDetail(BaseModel):
    code: str = Field(
        description="A stable code: `invalid_input`, `unauthorized`, `sign_in_required`, "
        "`forbidden`, `not_found`, `expired`, `already_settled`, `interrupted`, "
        "`limit_reached`, `method_not_allowed`, `enrolment_unknown`, `enrolment_used`, "
        "`enrolment_expired`, `sign_in_refused`, ...",
        examples=["not_found"],
    )
    message: str = Field(description="What happened, in words a person and a model can read.")
    hint: str | None = Field(default=None, description="What to do next, when there is more.")


class Problem(BaseModel):
    """Every refusal: a stable code and what to do next; never a stack trace."""

    error: ProblemDetail


# -- requests -----------------------------------------------------------------------------


class ResumeBody(BaseModel):
    """The principal's decision on its own execution's call."""

    model_config = ConfigDict(extra="forbid")
    action: Literal["accept", "decline", "cancel"] = Field(
        description="`accept` only in approval mode `model`; `decline` and `cancel` always."
    )
    content: JsonValue = Field(
        default=None, description='With an accept, a grant: `{"grant": {"calls": N}}`.'
    )


class CallsGrant(BaseModel):
    """The next `calls` calls of the same tool in this execution, decided at once."""

    model_config = ConfigDict(extra="forbid")
    calls: int = Field(
        ge=1, description="Up to the execution's call limit (LOCKGATE_MAX_CALLS, this server's)."
    )

    @field_validator("calls", mode="before")
    @classmethod
    def _not_a_boolean(cls, value: object) -> object:
        # JSON Schema's integer is any whole number (`3.0` too), never `true`; pydantic
        # would read `true` as 1.
        if isinstance(value, bool):
            raise ValueError("calls is a number of calls, not a boolean")
        return value


class UntilEndGrant(BaseModel):
    """Every later call of the same tool in this execution."""

    model_config = ConfigDict(extra="forbid")
    untilEnd: Literal[True]


class PersonDecisionBody(BaseModel):
    """A signed-in person's decision on one call, as its page or the inbox sends it."""

    model_config = ConfigDict(extra="forbid")
    action: Literal["accept", "decline"]
    #: The digest of the call as the page showed it (sha256, hex).
    digest: str | None = Field(
        default=None,
        min_length=64,
        max_length=64,
        description="The `digest` of the call as it was shown (required to accept).",
    )
    #: For code that calls the tool in a loop: `{"calls": N}` or `{"untilEnd": true}`.
    grant: CallsGrant | UntilEndGrant | None = Field(
        default=None, description="With an accept, for a tool called in a loop."
    )
    #: Where the person decided, for the audit record.
    door: Literal["page", "inbox"] = "page"


class PasskeyAnswer(BaseModel):
    """A passkey ceremony's answer: the challenge the options named, and the authenticator's
    credential (WebAuthn's JSON, as the browser's `toJSON()` gives it)."""

    model_config = ConfigDict(extra="allow")
    challenge: JsonValue = Field(default=None, description="The `challenge` of the options.")
    credential: JsonValue = Field(default=None, description="The authenticator's answer.")


class NoFields(BaseModel):
    """An empty object: `{}`."""

    model_config = ConfigDict(extra="allow")


# -- answers ------------------------------------------------------------------------------


class ExecutionOut(BaseModel):
    """An execution as its principal's key reads it: no more of its code than an excerpt."""

    executionId: str
    status: ExecutionStatus
    requestedBy: str = Field(description="The principal whose execution it is.")
    code: str = Field(description="The code, up to 2,000 characters.")
    tool: str | None = Field(description="The call it waits on (`tools.<name>`), if any.")
    argsPreview: JsonValue = Field(description="That call's arguments, shortened.")
    expiresAt: datetime | None = Field(description="When the waiting call expires.")
    result: JsonValue
    error: JsonValue


class ExecutionRunning(BaseModel):
    """The code goes on after the decision, past the answer's wait: read it again later."""

    executionId: str
    status: Literal["running"]


class CallOut(BaseModel):
    """A call exactly as a person is shown it: every argument, the whole code, the digest a
    decision names."""

    executionId: str
    call: int
    requestedBy: str
    tool: str
    arguments: JsonValue
    code: str
    waiting: bool = Field(description="Whether it still waits for a decision.")
    expiresAt: datetime | None
    digest: str = Field(description="sha256 of what is shown; an accept must name it.")


class InboxCall(BaseModel):
    """A waiting call in the inbox; shown whole (arguments, code, digest) when short enough,
    otherwise decided on its page."""

    executionId: str
    call: int
    requestedBy: str
    tool: str
    arguments: JsonValue = Field(default=None, description="Absent unless `shownWhole`.")
    code: str | None = Field(default=None, description="Absent unless `shownWhole`.")
    waiting: bool
    expiresAt: datetime | None
    digest: str | None = Field(default=None, description="Absent unless `shownWhole`.")
    shownWhole: bool
    pageUrl: str
    decideUrl: str


class DecidedCall(BaseModel):
    """A decision made lately, as `lockgate audit export` writes it."""

    executionId: str
    principal: str
    call: int
    tool: str
    action: str | None
    door: str | None
    by: str | None
    actor: str | None
    client: JsonValue
    person: JsonValue
    argumentsDigest: str | None
    policyRevision: str | None
    decidedAt: str | None
    expiresAt: str | None


class Inbox(BaseModel):
    approver: str
    principals: list[str] | Literal["*"] = Field(
        description='The principals the person approves for (`"*"`: every one).'
    )
    waiting: list[InboxCall]
    decided: list[DecidedCall]


class PasskeyOptions(BaseModel):
    challenge: str = Field(description="Name it in the answer.")
    publicKey: dict[str, JsonValue] = Field(
        description="WebAuthn's options, for `navigator.credentials`."
    )


class SignedInAnswer(BaseModel):
    signedIn: Literal[True]


class EnrolledAnswer(BaseModel):
    signedIn: Literal[True]
    next: str = Field(description="Where to go now.")


class SignedOutAnswer(BaseModel):
    signedOut: Literal[True]


class Health(BaseModel):
    status: Literal["ok"]


class Readiness(BaseModel):
    status: Literal["ready", "recovering", "fenced"] = Field(
        description="`recovering` until boot recovery finished; `fenced` when another "
        "instance took over this one's work."
    )
    instance: str | None = Field(default=None, description="This instance's id, when ready.")
