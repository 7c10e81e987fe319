"""Configuration, from environment variables (prefix `LOCKGATE_`) and an optional file.

`DATABASE_URL` is read without the prefix, as hosting platforms set it. The optional file is
`lockgate.env` in the working directory, with the same variables as `KEY=value` lines; the
environment wins over it. Every field has a
description; the reference table in docs/configuration.md is generated from this model.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, SecretStr, field_validator
from pydantic_settings import SettingsConfigDict

from lockgate.machine.errors import LockgateError
from lockgate.machine.settings_approvers import ApproverSettings
from lockgate.machine.settings_outbound import OutboundSettings
from lockgate.machine.settings_storage import StorageSettings
from lockgate.machine.settings_webhooks import WebhookSettings

#: The shortest accepted signing key: 32 random characters carry 128 bits or more (even
#: as hex digits), beyond guessing; a shorter one is more likely a password or a typo.
MIN_SIGNING_KEY_CHARS = 32
#: How an operator makes one (what the refusals say).
#: Addresses whose links say `localhost` (WebAuthn refuses an IP address as its party).
LOOPBACK_ADDRESSES = frozenset({"127.0.0.1", "::1", "localhost"})
MAKE_A_SIGNING_KEY = 'python -c "import secrets; print(secrets.token_urlsafe(32))"'


class Settings(ApproverSettings, WebhookSettings, OutboundSettings, StorageSettings):
    model_config = SettingsConfigDict(
        env_prefix="LOCKGATE_",
        # An optional file of the same variables (KEY=value lines); the environment wins.
        env_file="lockgate.env",
        env_file_encoding="utf-8",
        extra="ignore",
        frozen=True,
        # A refused value is never echoed in the error: it may be a signing key (or a
        # database password).
        hide_input_in_errors=True,
    )

    database_url: str = Field(
        default="sqlite:///./lockgate.db",
        validation_alias=AliasChoices("DATABASE_URL", "LOCKGATE_DATABASE_URL"),
        description="Where state lives: a SQLite file (default ./lockgate.db) or "
        "postgresql://user:pass@host/db for several instances.",
    )
    instance_name: str = Field(
        default="",
        description="A stable name for this instance; a restart under the same name recovers "
        "its previous incarnation's work at once instead of waiting for its lease. Default: "
        "host name and database.",
    )
    approval_ttl: timedelta = Field(
        default=timedelta(hours=24),
        description="How long a paused execution waits for a decision before it expires.",
    )
    task_ttl: timedelta = Field(
        default=timedelta(days=7),
        description="How long a task (tasks extension) can be read after it was created; past "
        "it, tasks/get answers that it expired. Keep it longer than LOCKGATE_APPROVAL_TTL.",
    )
    checkpoint_every_call: bool = Field(
        default=True,
        description="Store a sandbox snapshot at every tool call, so a crash goes on from the "
        "last call instead of failing the execution.",
    )
    conservative_recovery: bool = Field(
        default=False,
        description="After a crash, end every interrupted execution as interrupted and never "
        "call a tool again, even a read-only one (so every call, reads too, is journaled "
        "before it runs).",
    )
    fault_injection: bool = Field(
        default=False,
        description="For the simulator only: honour LOCKGATE_CRASH_AT (SIGKILL at those crash "
        "points), LOCKGATE_STOP_AT (SIGSTOP there) and LOCKGATE_FAULT_EVIDENCE (a file the "
        "server reports the points it passed to). Off, those variables are ignored.",
    )
    lease_ttl: timedelta = Field(
        default=timedelta(seconds=15),
        description="How long an instance's lease lasts without a heartbeat before another "
        "instance may recover its work.",
    )
    heartbeat_interval: timedelta = Field(
        default=timedelta(seconds=5),
        description="How often an instance renews its lease and looks for dead instances.",
    )
    sweep_interval: timedelta = Field(
        default=timedelta(seconds=30),
        description="How often expired approvals are swept (they also expire on access) and "
        "finished executions past LOCKGATE_FINISHED_RETENTION purged.",
    )
    drain_timeout: timedelta = Field(
        default=timedelta(seconds=8),
        gt=timedelta(0),
        description="How long a SIGTERM drain may take before the process exits (platforms "
        "SIGKILL about 30 s after SIGTERM). Running code is stopped at once and its execution "
        "handed back to the queue, to go on from its last checkpoint on the next instance; a "
        "tool call in flight is waited for up to this, then left to recovery.",
    )
    max_code_chars: int = Field(default=100_000, description="Largest accepted code.")
    max_result_bytes: int = Field(
        default=64 * 1024, description="Results and tool outputs larger than this are truncated."
    )
    max_log_chars: int = Field(default=64 * 1024, description="Logs longer than this are cut.")
    max_duration_secs: float = Field(
        default=30.0,
        description="Time agent code may run, in total across its tool calls (time spent "
        "waiting for tools or approvals does not count).",
    )
    max_memory_bytes: int = Field(
        default=256 * 1024 * 1024, description="Memory agent code may use."
    )
    max_recursion_depth: int = Field(default=200, description="Deepest call stack allowed.")
    max_calls: int = Field(default=1000, description="Tool calls one execution may make.")
    policy: str = Field(
        default="",
        description="Approval rules, most restrictive wins: e.g. "
        "'notes.*=approve,notes.delete=block,github.*[DELETE]=block'. Tools keep their "
        "default when no rule matches. Rules stored with `lockgate policy add` count too.",
    )
    policy_refresh_secs: float = Field(
        default=2.0,
        ge=0,
        description="How long an instance uses the stored policy rules it read before reading "
        "them again: a rule added on any instance applies everywhere within this time.",
    )
    approval_mode: Literal["model", "native", "browser"] = Field(
        default="native",
        description="Who accepts a gated call: `model` (the agent, with resume's accept: for "
        "clients that ask their user before each tool call), `native` (the client asks the "
        "person through MCP elicitation where it can; the approval page otherwise) or "
        "`browser` (the approval page only). In native and browser the model cannot accept "
        "its own call.",
    )
    approval_modes: str = Field(
        default="",
        description="Per-principal approval modes overriding LOCKGATE_APPROVAL_MODE, e.g. "
        "'ci=model,alice=browser'. A connection may ask for a stricter mode with "
        "?approval=<mode> on the MCP URL, never a looser one.",
    )
    sources_refresh_secs: float = Field(
        default=2.0,
        ge=0,
        description="How long an instance uses the stored sources it read for a principal "
        "before checking again: a source added or removed on any instance is served "
        "everywhere within this time.",
    )
    max_sources_per_principal: int = Field(
        default=20,
        ge=0,
        description="Sources one principal may add for itself (tools.lockgate.add_*_source); "
        "the operator's global ones do not count.",
    )
    max_call_argument_bytes: int = Field(
        default=256 * 1024,
        ge=1024,
        description="The largest arguments of one tool call, as JSON bytes, checked before "
        "the call is journaled (the code gets a ValueError beyond it): a person must be able "
        "to read all of what they approve.",
    )
    host: str = Field(
        default="127.0.0.1",
        description="Address `lockgate serve` binds. Any non-loopback address requires API keys "
        "to exist (`lockgate keys create`).",
    )
    port: int = Field(default=8000, ge=1, le=65535, description="Port `lockgate serve` binds.")
    workers: int = Field(
        default=0,
        ge=0,
        le=256,
        description="Server processes `lockgate serve` runs behind its one port, each an "
        "instance of its own (its own lease, sandboxes and connections; any of them serves any "
        "session). 0: one per CPU core this process may use. An in-memory SQLite database "
        "always runs one.",
    )
    event_loop: Literal["auto", "asyncio"] = Field(
        default="auto",
        description="The event loop and HTTP parser `lockgate serve` runs on. auto: uvloop and "
        "httptools (dependencies; bench case 3 measures what they bring); "
        "asyncio: the standard library's loop and the pure-Python h11, for a platform "
        "without uvloop or to rule it out.",
    )
    public_url: str = Field(
        default="",
        description="The URL clients and approvers reach this server at (approval and "
        "enrolment links are built from it; https makes the sign-in cookie Secure, and its "
        "host is the passkeys' relying party). Default: http://<host>:<port>, with "
        "`localhost` for a loopback address.",
    )
    secrets_key: SecretStr | None = Field(
        default=None,
        description="The key(s) the secret store's values are encrypted with, comma-separated, "
        "the same on every instance: the first encrypts, all decrypt (to rotate, put a new "
        "key first, run `lockgate secrets rotate`, then drop the old one). Make one with "
        "`lockgate secrets key`. Unset: no secret can be stored, and a server whose database "
        "holds secrets refuses to start.",
    )
    signing_keys: SecretStr | None = Field(
        default=None,
        description="The secrets that seal a 2026-07-28 client's input_required state (so "
        "its retry works on any instance, after any restart), comma-separated, each at least "
        "32 characters, the same on every instance: the first seals, all open (to rotate, "
        "put the new key first and drop the old one after LOCKGATE_APPROVAL_TTL). Unset: on "
        "SQLite, a key file next to the database file (`<database>.key`, mode 0600) is "
        "created and reused; on PostgreSQL, the server refuses to start.",
    )
    wait_budget_secs: float = Field(
        default=25.0,
        gt=0,
        description="How long execute/resume wait for the code before answering `running` "
        "(below common client timeouts); the execution goes on either way.",
    )
    max_request_bytes: int = Field(
        default=1024 * 1024, description="Largest HTTP request body accepted (413 beyond)."
    )
    allowed_hosts: str = Field(
        default="",
        description="Extra Host header values accepted on /mcp, comma-separated (e.g. "
        "'mcp.example.com,mcp.example.com:*'); loopback names are always accepted.",
    )
    session_idle_timeout: timedelta = Field(
        default=timedelta(minutes=5),
        description="An MCP session with nothing in flight is destroyed after this much "
        "inactivity (its executions are untouched).",
    )
    session_lease: timedelta = Field(
        default=timedelta(minutes=4),
        description="How long one extension keeps a session with work in flight alive.",
    )
    session_cap: timedelta = Field(
        default=timedelta(minutes=15),
        description="No session is kept longer than this after its last activity.",
    )
    session_memory_secs: float = Field(
        # Past both of an SDK client's reconnects (LOCKGATE_SSE_RETRY_MS apart, 20 s), so
        # a broken stream's replay is still here when the client comes back for it.
        default=120.0,
        gt=0,
        description="An MCP session with nothing in flight leaves this process's memory "
        "after this many seconds idle (its replay log with it); the session itself lives on "
        "in the database, and its next request brings it back.",
    )
    response_deadline_secs: float = Field(
        default=60.0,
        gt=0,
        description="A request not answered within this is answered with JSON-RPC error "
        "-32010 (request lost) saying what became of its execution.",
    )
    # The TypeScript and Python SDKs reconnect a broken stream twice, `retry` apart, then
    # give up (the TS call then times out at 60 s): 20 s covers a restart of up to ~35 s
    # (two attempts, 20 and 40 s after the break) and still answers within the TS timeout.
    sse_retry_ms: int = Field(
        default=20000,
        ge=100,
        description="Reconnection delay suggested to clients on SSE streams; a client that "
        "reconnects after a restart collects the -32010 report for what it lost. Clients "
        "try twice, this far apart, so a restart must be ready within about twice this.",
    )
    notes_dir: Path | None = Field(
        default=Path("lockgate-notes"),
        description="Where the built-in notes tool source (a demo and test tool) keeps its "
        "notes and its effect log.",
    )
    sources_file: Path | None = Field(
        default=None,
        description="A TOML file of the tool sources every principal gets (kept in version "
        "control): `[[openapi]]` tables with `name`, `document` (a path relative to the file, "
        "a URL, or the document itself) and an optional `base_url`. See 'Connect your API' "
        "in the docs (docs/sources.md).",
    )
    # -- per-principal bounds (sandbox) --
    sandbox_workers: int = Field(
        default=4,
        ge=1,
        description="Sandbox worker processes of this instance: at most this many "
        "executions' code runs at once (the others wait for a worker).",
    )
    max_workers_per_principal: int = Field(
        default=2,
        ge=1,
        description="Sandbox workers one principal's code may occupy at once; a freed "
        "worker goes to the waiting principal that holds the fewest, so no principal can "
        "starve another.",
    )
    max_running_per_principal: int = Field(
        default=4,
        ge=1,
        description="Executions of one principal in flight at once on this instance "
        "(execute and resume work); beyond it execute and resume are refused with "
        "`limit_reached`.",
    )
    max_paused_per_principal: int = Field(
        default=100,
        ge=1,
        description="Unfinished executions of one principal (waiting for approval, or running "
        "and so able to pause), across all instances, counted in the transaction that starts "
        "one; beyond it execute is refused with `limit_reached`.",
    )
    # -- per-principal bounds (HTTP) --
    max_sessions_per_principal: int = Field(
        default=100,
        ge=1,
        description="Live MCP sessions one principal may hold (across instances); a new "
        "session beyond it is refused with HTTP 429.",
    )
    max_requests_per_minute: int = Field(
        default=1200,
        ge=1,
        description="Requests one principal may send to /mcp and the approval API per minute, "
        "on each instance (HTTP 429 with Retry-After beyond).",
    )
    sse_replay_bytes_per_session: int = Field(
        default=1024 * 1024,
        ge=1024,
        description="Bytes of SSE events kept per session so a client whose stream broke can "
        "resume it (oldest dropped first).",
    )
    sse_replay_bytes_total: int = Field(
        default=64 * 1024 * 1024,
        ge=1024,
        description="Bytes of SSE events kept for resumption across all sessions of this "
        "process (oldest dropped first).",
    )
    key_recheck_secs: float = Field(
        default=5.0,
        gt=0,
        description="How often an open request or stream re-checks its API key; a revoked "
        "key's streams are closed within this.",
    )
    metrics_require_key: bool = Field(
        default=False,
        description="Require an API key (Authorization: Bearer) on /metrics. The metrics "
        "carry no principal, execution or session ids either way.",
    )
    log_format: Literal["auto", "text", "json"] = Field(
        default="auto",
        description="How `lockgate serve` writes its log on stderr: `json` (one object per "
        "line: ts, level, logger, message, execution and session ids), `text` (readable "
        "lines), or `auto`: text when stderr is a terminal, JSON otherwise.",
    )

    @field_validator(
        "approval_ttl",
        "task_ttl",
        "lease_ttl",
        "heartbeat_interval",
        "sweep_interval",
        "drain_timeout",
        "session_idle_timeout",
        "session_lease",
        "session_cap",
        "webhook_timeout",
        "webhook_retry_base",
        "approval_warning",
        "approver_session_ttl",
        "enrolment_ttl",
        "finished_retention",
        mode="before",
    )
    @classmethod
    def _seconds(cls, value: object) -> object:
        """Durations may be given as plain seconds ("15", "0.5") or ISO 8601 ("PT15S")."""
        if isinstance(value, str):
            try:
                return timedelta(seconds=float(value))
            except ValueError:
                return value
        return value

    @field_validator("signing_keys")
    @classmethod
    def _strong_keys(cls, value: SecretStr | None) -> SecretStr | None:
        """Each key long enough to be a key; an empty value is the same as unset (an
        environment variable set to nothing). The messages never show a key."""
        if value is None or not value.get_secret_value().strip():
            return None
        for n, key in enumerate(value.get_secret_value().split(","), start=1):
            length = len(key.strip())
            if length < MIN_SIGNING_KEY_CHARS:
                raise ValueError(
                    f"LOCKGATE_SIGNING_KEYS: key {n} has {length} characters, fewer than "
                    f"{MIN_SIGNING_KEY_CHARS} (make one with: {MAKE_A_SIGNING_KEY})"
                )
        return value

    @field_validator("approval_modes")
    @classmethod
    def _known_modes(cls, text: str) -> str:
        from lockgate.machine.approval_modes import parse_modes

        try:
            parse_modes(text)
        except LockgateError as exc:
            raise ValueError(f"{exc.message} ({exc.hint})") from None
        return text

    @field_validator("database_url")
    @classmethod
    def _known_scheme(cls, url: str) -> str:
        if not url.startswith(("sqlite:", "postgresql:", "postgresql+psycopg:", "postgres:")):
            raise ValueError("DATABASE_URL must be a sqlite:/// or postgresql:// URL")
        return url

    @property
    def is_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite:")

    @property
    def signing_secrets(self) -> tuple[bytes, ...]:
        """The configured signing keys, the sealing one first; () when unset."""
        if self.signing_keys is None:
            return ()
        return tuple(k.strip().encode() for k in self.signing_keys.get_secret_value().split(","))

    @property
    def base_url(self) -> str:
        """Where links point: the public URL, else this server's own address, named
        `localhost` when it is a loopback one (a passkey needs a host name, not an IP)."""
        if self.public_url:
            return self.public_url.rstrip("/")
        host = "localhost" if self.host in LOOPBACK_ADDRESSES else self.host
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"
