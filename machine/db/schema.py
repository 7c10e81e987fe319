"""The tables. One per aggregate; every lifecycle row carries `status` and `version`.

Statuses are stored as the spec's enum values (plain strings, no database enum type), so a
new state in the spec needs no type migration; the store refuses statuses the spec does not
declare.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import JsonValue
from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    Index,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
    false,
    literal_column,
    text,
)
from sqlalchemy.sql.elements import ColumnElement
from sqlmodel import Field, SQLModel, col

from lockgate.machine.db.types import UTCDateTime
from lockgate.spec import EXECUTION

metadata = SQLModel.metadata

LIVE_EXECUTION_STATUSES = tuple(s.name for s in EXECUTION.states if not s.terminal)
_LIVE_EXECUTION_STATUSES = ", ".join(f"'{name}'" for name in LIVE_EXECUTION_STATUSES)
FINISHED_EXECUTION_STATUSES = tuple(s.name for s in EXECUTION.states if s.terminal)
_FINISHED_EXECUTION_STATUSES = ", ".join(f"'{name}'" for name in FINISHED_EXECUTION_STATUSES)


def _when(*, nullable: bool = False) -> Column[datetime]:
    return Column(UTCDateTime(), nullable=nullable)


def _json(*, nullable: bool = True) -> Column[JsonValue]:
    return Column(JSON(), nullable=nullable)


class Principal(SQLModel, table=True):
    __tablename__ = "principals"

    id: str = Field(primary_key=True, max_length=64)
    name: str = Field(max_length=200)
    created_at: datetime = Field(sa_column=_when())


class ApiKey(SQLModel, table=True):
    __tablename__ = "api_keys"

    id: str = Field(primary_key=True, max_length=64)
    principal_id: str = Field(foreign_key="principals.id", index=True, max_length=64)
    #: sha256 of the key: keys are 256-bit random, so a fast hash cannot be brute-forced.
    key_hash: str = Field(sa_column=Column(String(64), unique=True, nullable=False))
    #: The first characters, shown in listings so an operator can tell keys apart.
    prefix: str = Field(max_length=16)
    created_at: datetime = Field(sa_column=_when())
    revoked_at: datetime | None = Field(default=None, sa_column=_when(nullable=True))


class PolicyRuleRow(SQLModel, table=True):
    """One tool-policy rule an operator stored (`lockgate policy add`): global when
    `principal_id` is None, else that principal's. Rules are configuration, not lifecycle
    records: no status machine, written in transactions of their own (`PolicyQueries`)."""

    __tablename__ = "policy_rules"

    id: str = Field(primary_key=True, max_length=32)
    #: No foreign key: a rule may be written for a principal before its first API key.
    principal_id: str | None = Field(default=None, index=True, max_length=64)
    pattern: str = Field(max_length=300)
    #: An HTTP method or GraphQL operation type the rule is limited to, or None.
    condition: str | None = Field(default=None, max_length=16)
    decision: str = Field(max_length=32)
    created_at: datetime = Field(sa_column=_when())


class StoredSecret(SQLModel, table=True):
    """One secret of the secret store (`lockgate secrets set`): global when `principal_id`
    is None, else that principal's; usable by every source's tools, or only `source`'s.
    Only the encrypted value is stored (`machine/secret_store.py`), never the value."""

    __tablename__ = "secrets"

    id: str = Field(primary_key=True, max_length=32)
    principal_id: str | None = Field(default=None, index=True, max_length=64)
    name: str = Field(index=True, max_length=200)
    #: The one source whose tools may use it, or None for any.
    source: str | None = Field(default=None, max_length=200)
    #: A Fernet token of the value, under the first of LOCKGATE_SECRETS_KEY.
    ciphertext: bytes = Field(sa_column=Column(LargeBinary, nullable=False))
    created_at: datetime = Field(sa_column=_when())
    updated_at: datetime = Field(sa_column=_when())


class StoredSource(SQLModel, table=True):
    """One tool source added at run time (`lockgate sources add`, or agent code's
    `tools.lockgate.add_*_source` once approved): global when `principal_id` is None, else
    that principal's. `config` is the source's table as in the sources file, with its
    document or schema already fetched (the text itself), so every instance builds the same
    tools from it without fetching anything. Configuration, not a lifecycle record."""

    __tablename__ = "sources"

    id: str = Field(primary_key=True, max_length=32)
    principal_id: str | None = Field(default=None, index=True, max_length=64)
    name: str = Field(max_length=64)
    #: openapi, graphql or mcp.
    kind: str = Field(max_length=16)
    config: JsonValue = Field(sa_column=_json(nullable=False))
    created_at: datetime = Field(sa_column=_when())
    #: Added by the operator (`lockgate sources add`, global or for a principal), not by a
    #: principal's own code: only a source a principal added itself is held to what a
    #: principal may reach (its own secrets, public addresses).
    by_operator: bool = Field(
        default=False, sa_column=Column(Boolean, nullable=False, server_default=false())
    )


class Instance(SQLModel, table=True):
    __tablename__ = "instances"

    id: str = Field(primary_key=True, max_length=64)
    name: str = Field(max_length=200, index=True)
    #: Global, monotonically increasing across every start of every instance.
    incarnation: int = Field(unique=True)
    status: str = Field(max_length=32, index=True)
    version: int = 0
    host: str = Field(max_length=200)
    pid: int
    started_at: datetime = Field(sa_column=_when())
    lease_until: datetime = Field(sa_column=_when())


def _live_index(name: str, *columns: str) -> Index:
    """A partial index over live executions only (the statuses that are not terminal)."""
    live = f"status IN ({_LIVE_EXECUTION_STATUSES})"
    return Index(name, *columns, sqlite_where=text(live), postgresql_where=text(live))


def _finished_index(name: str, *columns: str) -> Index:
    """A partial index over finished executions only (the terminal statuses)."""
    done = f"status IN ({_FINISHED_EXECUTION_STATUSES})"
    return Index(name, *columns, sqlite_where=text(done), postgresql_where=text(done))


class Execution(SQLModel, table=True):
    __tablename__ = "executions"
    __table_args__ = (
        # The live index: recovery and the claim loop read non-terminal executions only, so
        # their cost grows with live work, never with history.
        _live_index("ix_executions_live", "status", "owner"),
        # Its companions for one principal's or one session's live work (the admission
        # limits on every `execute`, the session lease's counts): over the same rows, so
        # those reads cost what the principal or session has live, not its history.
        _live_index("ix_executions_live_principal", "principal_id", "status"),
        _live_index("ix_executions_live_session", "session_id"),
        Index("ix_executions_principal", "principal_id", "created_at"),
        # What a principal keeps, summed from the index alone (the storage budget's check
        # at every execute and before a call is journaled), never from the rows' blobs.
        Index("ix_executions_principal_bytes", "principal_id", "stored_bytes"),
        # The retention purge reads the oldest finished executions, never live ones.
        _finished_index("ix_executions_finished", "updated_at"),
        # One execution per client idempotency key and principal: the store itself refuses
        # a second, so two racing retries of one lost `execute` cannot both start one.
        Index(
            "ux_executions_idempotency_key",
            "principal_id",
            "idempotency_key",
            unique=True,
            sqlite_where=text("idempotency_key IS NOT NULL"),
            postgresql_where=text("idempotency_key IS NOT NULL"),
        ),
    )

    id: str = Field(primary_key=True, max_length=64)
    principal_id: str = Field(max_length=64)
    session_id: str | None = Field(default=None, max_length=128, index=True)
    #: "<session id>:<JSON-RPC id>" of the request that started it, so a lost answer to that
    #: request can say what became of the execution.
    origin_request: str | None = Field(default=None, max_length=300, index=True)
    #: The key a client gave `execute` so that re-issuing a lost call attaches to this
    #: execution instead of starting another (unique per principal; None without one).
    idempotency_key: str | None = Field(default=None, max_length=128)
    status: str = Field(max_length=32)
    version: int = 0
    #: The instance id holding it while running; None otherwise.
    owner: str | None = Field(default=None, max_length=64)
    code: str = Field(sa_column=Column(Text, nullable=False))
    #: The direct tool whose call started it: it answers as that tool, not as `execute`.
    direct_tool: str | None = Field(default=None, max_length=128)
    #: The `traceparent` of the span that started it (traces on): its later spans join it.
    trace_parent: str | None = Field(default=None, max_length=64)
    #: Sealed sandbox snapshot: the last checkpoint, or the pause point.
    snapshot: bytes | None = Field(default=None, sa_column=Column(LargeBinary, nullable=True))
    runtime_version: str | None = Field(default=None, max_length=32)
    #: Tool calls made so far (the sequence of the latest journal row).
    calls_made: int = 0
    #: Sequence of the tool call the stored snapshot is suspended at (or paused on).
    snapshot_call: int | None = None
    deadline: datetime | None = Field(default=None, sa_column=_when(nullable=True))
    logs: str = Field(default="", sa_column=Column(Text, nullable=False, server_default=""))
    outcome: JsonValue = Field(default=None, sa_column=_json())
    what_ran: JsonValue = Field(default=None, sa_column=_json())
    #: Bytes it keeps in the database, counted as they are written (`machine/storage.py`):
    #: its code, each journaled call's arguments and result, and once it finished, its
    #: result, logs and snapshot. What the principal's storage budget sums.
    stored_bytes: int = Field(
        default=0, sa_column=Column(BigInteger, nullable=False, server_default="0")
    )
    created_at: datetime = Field(sa_column=_when())
    updated_at: datetime = Field(sa_column=_when())


class ToolCall(SQLModel, table=True):
    __tablename__ = "tool_calls"

    #: "<execution id>:<sequence>" — also the idempotency key handed to the tool.
    id: str = Field(primary_key=True, max_length=100)
    execution_id: str = Field(foreign_key="executions.id", index=True, max_length=64)
    seq: int
    tool: str = Field(max_length=200)
    status: str = Field(max_length=32)
    version: int = 0
    idempotent: bool = False
    #: The validated arguments (dispatch needs them after a restart); never secrets.
    arguments: JsonValue = Field(default=None, sa_column=_json())
    #: Redacted, size-limited arguments, for the approver and the audit trail.
    arguments_preview: JsonValue = Field(default=None, sa_column=_json())
    #: accept | decline | cancel, once a person decided.
    decision: JsonValue = Field(default=None, sa_column=_json())
    decided_at: datetime | None = Field(default=None, sa_column=_when(nullable=True))
    result: JsonValue = Field(default=None, sa_column=_json())
    input: JsonValue = Field(default=None, sa_column=_json())  # machine.tools.questions
    attempts: int = 0
    created_at: datetime = Field(sa_column=_when())
    updated_at: datetime = Field(sa_column=_when())


class Session(SQLModel, table=True):
    __tablename__ = "sessions"

    id: str = Field(primary_key=True, max_length=128)
    principal_id: str = Field(max_length=64, index=True)
    status: str = Field(max_length=32, index=True)
    version: int = 0
    protocol_version: str = Field(max_length=32)
    client_info: JsonValue = Field(default=None, sa_column=_json())
    capabilities: JsonValue = Field(default=None, sa_column=_json())
    #: The least severe `notifications/message` level the client asked for (logging/setLevel);
    #: None: every level.
    log_level: str | None = Field(default=None, max_length=16)
    incarnation: int
    last_activity: datetime = Field(sa_column=_when())
    created_at: datetime = Field(sa_column=_when())


class OwedRequest(SQLModel, table=True):
    __tablename__ = "owed_requests"

    id: str = Field(primary_key=True, max_length=300)
    session_id: str = Field(max_length=128, index=True)
    #: The JSON-RPC id as JSON (a string or a number).
    request_id: JsonValue = Field(sa_column=_json(nullable=False))
    method: str = Field(
        default="", sa_column=Column(String(100), nullable=False, server_default="")
    )
    status: str = Field(max_length=32, index=True)
    version: int = 0
    incarnation: int
    execution_id: str | None = Field(default=None, max_length=64)
    created_at: datetime = Field(sa_column=_when())


class WebhookDelivery(SQLModel, table=True):
    """The outbox: one event owed to the operator's webhook endpoint (`webhook_delivery`).

    Its id is the event's `webhook-id`, derived from what it announces (a call's approval
    request, or its expiry warning), so the same event is never queued twice and a receiver
    dedupes a redelivery on it. The payload is the exact body POSTed, signed at each attempt.
    """

    __tablename__ = "webhook_deliveries"
    __table_args__ = (Index("ix_webhook_deliveries_due", "status", "next_attempt_at"),)

    id: str = Field(primary_key=True, max_length=120)
    kind: str = Field(max_length=32)
    principal_id: str = Field(max_length=64, index=True)
    execution_id: str = Field(max_length=64)
    call_seq: int
    payload: JsonValue = Field(sa_column=_json(nullable=False))
    status: str = Field(max_length=32)
    version: int = 0
    attempts: int = 0
    next_attempt_at: datetime = Field(sa_column=_when())
    claimed_by: str | None = Field(default=None, max_length=200)
    last_error: str | None = Field(default=None, max_length=500)
    delivered_at: datetime | None = Field(default=None, sa_column=_when(nullable=True))
    created_at: datetime = Field(sa_column=_when())


class Approver(SQLModel, table=True):
    """A person who may decide gated calls (`lockgate approvers add`), never an API key.

    Configuration, not a lifecycle record, like a key: added and removed in transactions of
    its own. Identified by where they sign in: an OpenID provider's issuer and the subject
    it names them by (an approver added by email only gets the subject of their first
    sign-in with that verified email), or `passkey` and a WebAuthn user handle of its own.
    """

    __tablename__ = "approvers"
    __table_args__ = (UniqueConstraint("issuer", "subject", name="uq_approvers_identity"),)

    id: str = Field(primary_key=True, max_length=32)
    name: str = Field(max_length=200)
    email: str | None = Field(default=None, max_length=320)
    #: `oidc` or `passkey`.
    sign_in: str = Field(max_length=16)
    #: The OpenID provider's issuer URL, or `passkey`.
    issuer: str = Field(max_length=500)
    #: The provider's subject (OIDC; None until the first sign-in of one added by email), or
    #: the WebAuthn user handle (base64url of 32 random bytes) for a passkey approver.
    subject: str | None = Field(default=None, max_length=255)
    created_at: datetime = Field(sa_column=_when())


class ApproverGrant(SQLModel, table=True):
    """Whose calls an approver may decide: one principal, or `*` for every principal."""

    __tablename__ = "approver_grants"

    approver_id: str = Field(primary_key=True, max_length=32)
    principal_id: str = Field(primary_key=True, max_length=64, index=True)


class Passkey(SQLModel, table=True):
    """A passkey an approver registered through an enrolment link (WebAuthn credential)."""

    __tablename__ = "passkeys"

    #: The credential id, base64url (up to 1,023 bytes by the WebAuthn spec).
    id: str = Field(primary_key=True, max_length=1400)
    approver_id: str = Field(max_length=32, index=True)
    public_key: bytes = Field(sa_column=Column(LargeBinary(), nullable=False))
    sign_count: int = 0
    transports: JsonValue = Field(default=None, sa_column=_json())
    created_at: datetime = Field(sa_column=_when())
    last_used_at: datetime | None = Field(default=None, sa_column=_when(nullable=True))


class Enrolment(SQLModel, table=True):
    """A one-time passkey enrolment link (`enrolment`). The link carries `<id>.<secret>`;
    the row keeps the secret's sha256 only, so a copy of the database opens no link."""

    __tablename__ = "enrolments"

    id: str = Field(primary_key=True, max_length=32)
    approver_id: str = Field(max_length=32, index=True)
    secret_hash: str = Field(max_length=64)
    status: str = Field(max_length=32)
    version: int = 0
    created_at: datetime = Field(sa_column=_when())
    expires_at: datetime = Field(sa_column=_when())
    used_at: datetime | None = Field(default=None, sa_column=_when(nullable=True))


class ApproverSession(SQLModel, table=True):
    """A person signed in (`approver_session`): the cookie carries `<id>.<secret>`, the row
    the secret's sha256 only."""

    __tablename__ = "approver_sessions"

    id: str = Field(primary_key=True, max_length=32)
    approver_id: str = Field(max_length=32, index=True)
    secret_hash: str = Field(max_length=64)
    #: How the person signed in: `oidc` or `passkey`.
    method: str = Field(max_length=16)
    status: str = Field(max_length=32, index=True)
    version: int = 0
    created_at: datetime = Field(sa_column=_when())
    expires_at: datetime = Field(sa_column=_when())
    ended_at: datetime | None = Field(default=None, sa_column=_when(nullable=True))


class SignInChallenge(SQLModel, table=True):
    """One sign-in in progress: an OpenID Connect request's state (with its PKCE verifier
    and nonce) or a WebAuthn challenge. Single use: taken by deleting it (a nonce, not a
    lifecycle: it has one step, and a crash before that delete commits leaves it to expire
    unused, which repeats nothing)."""

    __tablename__ = "sign_in_challenges"

    id: str = Field(primary_key=True, max_length=64)
    kind: str = Field(max_length=32)
    data: JsonValue = Field(sa_column=_json(nullable=False))
    created_at: datetime = Field(sa_column=_when())
    expires_at: datetime = Field(sa_column=_when())


class TransitionLog(SQLModel, table=True):
    """Every committed transition, appended in the transition's own transaction.

    The audit trail of what happened to each record, and what the simulator checks
    against the spec ("every persisted (from, to) is an edge"). Statuses only: no data.
    """

    __tablename__ = "transition_log"

    id: int | None = Field(default=None, primary_key=True)
    machine: str = Field(max_length=32)
    record_id: str = Field(max_length=200, index=True)
    event: str = Field(max_length=64)
    source: str = Field(max_length=32)
    dest: str = Field(max_length=32)
    version: int
    at: datetime = Field(sa_column=_when())
    #: The transaction that committed it (one id per commit): joint steps share one.
    txn: str | None = Field(default=None, max_length=32)
    #: The records the transaction was fenced by, `machine:id:version` (comma-separated):
    #: what lets a trace be checked against the model's fences.
    fence: str | None = Field(default=None, max_length=600)


def _status_in(statuses: tuple[str, ...]) -> ColumnElement[bool]:
    """`executions.status IN ('a', 'b', ...)`, the statuses written into the statement's
    text as in the partial indexes' own conditions above (constants of the spec, never
    input): SQLite uses a partial index only when the query's text implies its condition,
    which `status IN (?, ?)` with bound values never does. The same text at every execution,
    so the statement is compiled once (`driver_statements`)."""
    return col(Execution.status).in_([literal_column(f"'{name}'") for name in statuses])


def finished_executions() -> ColumnElement[bool]:
    """The finished index's own predicate (`_status_in`)."""
    return _status_in(FINISHED_EXECUTION_STATUSES)


def live_executions() -> ColumnElement[bool]:
    """The live index's own predicate: every query for live work includes it, so the
    database can use the partial index (`_status_in`)."""
    return _status_in(LIVE_EXECUTION_STATUSES)
