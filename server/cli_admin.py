"""The operator's administration commands: `lockgate keys`, `lockgate policy` and
`lockgate secrets` (each opens the configured database; none starts a server).
`lockgate audit export` prints the decisions' audit records. `lockgate sources` is in
`server/cli_sources.py`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from lockgate.machine.settings import Settings


def fail(message: str, code: int) -> typer.Exit:
    """The message on stderr, and the exit with `code` to raise (for every command)."""
    typer.echo(message, err=True)
    return typer.Exit(code)


def configured_settings(**overrides: Any) -> Settings:
    """The settings from the environment (and `overrides`), for every command: a configuration
    that does not validate exits 2, each variable at fault named (never its value), instead of
    a validation traceback."""
    from pydantic import ValidationError

    from lockgate.machine.settings import Settings
    from lockgate.machine.settings_reference import invalid_configuration

    try:
        return Settings(**overrides)
    except ValidationError as exc:
        raise fail(invalid_configuration(exc), 2) from None


def _failed(exc: Any, code: int) -> typer.Exit:
    """A LockgateError in one line: what happened, then what to do."""
    return fail(exc.message + (f" {exc.hint}" if exc.hint else ""), code)


keys_app = typer.Typer(help="Manage API keys (one principal per name).", no_args_is_help=True)


def _keys() -> Any:
    from lockgate.machine.db.migrate import prepare_database
    from lockgate.machine.db.store import SqlStore
    from lockgate.server.keys import ApiKeys

    return ApiKeys(SqlStore(prepare_database(configured_settings())))


@keys_app.command("create")
def keys_create(
    principal: Annotated[str, typer.Argument(help="Who the key acts for, e.g. alice.")],
) -> None:
    """Create an API key for a principal (created if new). The key is shown only once."""
    from lockgate.machine.errors import LockgateError

    try:
        issued = _keys().create(principal)
    except LockgateError as exc:
        raise fail(exc.message, 2) from None
    typer.echo(
        f"key id:    {issued.id}\nprincipal: {issued.principal_id}\nkey:       "
        f"{issued.secret}\n(store it now: it is not shown again)"
    )


@keys_app.command("list")
def keys_list() -> None:
    """List API keys (ids and prefixes, never the keys)."""
    for key in _keys().list():
        state = f"revoked {key.revoked_at:%Y-%m-%d %H:%M}" if key.revoked_at else "active"
        typer.echo(f"{key.id}  {key.principal_id:<20} {key.prefix}…  {state}")


@keys_app.command("revoke")
def keys_revoke(key_id: Annotated[str, typer.Argument(help="The key id to revoke.")]) -> None:
    """Revoke an API key: requests with it get 401 from now on."""
    from lockgate.machine.errors import LockgateError

    try:
        key = _keys().revoke(key_id)
    except LockgateError as exc:
        raise _failed(exc, 1) from None
    typer.echo(f"revoked {key.id} ({key.principal_id})")


policy_app = typer.Typer(
    help="Manage stored tool-policy rules (global or per principal; most restrictive wins).",
    no_args_is_help=True,
)


def _policy_rules() -> Any:
    from lockgate.machine.db.migrate import prepare_database
    from lockgate.machine.db.store import SqlStore
    from lockgate.machine.policy import Policy
    from lockgate.server.policy_rules import PolicyRules

    settings = configured_settings()
    return PolicyRules(SqlStore(prepare_database(settings)), Policy.from_text(settings.policy))


_PrincipalOption = Annotated[
    str | None,
    typer.Option(help="Only this principal's calls (default: every principal's)."),
]


@policy_app.command("add")
def policy_add(
    pattern: Annotated[str, typer.Argument(help="'*', 'source.*' or 'source.tool'.")],
    decision: Annotated[str, typer.Argument(help="approve, require_approval or block.")],
    when: Annotated[
        str | None,
        typer.Option(
            "--when",
            help="Only calls making this HTTP method (DELETE) or GraphQL operation "
            "type (mutation).",
        ),
    ] = None,
    principal: _PrincipalOption = None,
) -> None:
    """Store a rule; every instance applies it within LOCKGATE_POLICY_REFRESH_SECS."""
    from lockgate.machine.errors import LockgateError

    try:
        stored = _policy_rules().add(pattern, decision, condition=when, principal=principal)
    except LockgateError as exc:
        raise _failed(exc, 2) from None
    verb = "added" if stored.added else "already stored as"
    typer.echo(f"{verb} {stored.id}  {_scope(stored.principal_id)}  {stored.rule}")


def _scope(principal: str | None) -> str:
    return f"{'(everyone)' if principal is None else principal:<20}"


@policy_app.command("list")
def policy_list(
    principal: Annotated[
        str | None,
        typer.Option(help="Only the rules that apply to this principal (global ones too)."),
    ] = None,
    tools: Annotated[
        bool,
        typer.Option(
            "--tools",
            help="Also list every tool with the decision its calls meet (for --principal, "
            "or under the configured and global rules).",
        ),
    ] = False,
) -> None:
    """List stored rules (and LOCKGATE_POLICY's), and with --tools the effective decisions."""
    rules = _policy_rules()
    for entry in rules.configured.rules:
        typer.echo(f"{'(config)':<12}  {_scope(None)}  {entry}")
    for stored in rules.listed(principal):
        typer.echo(f"{stored.id:<12}  {_scope(stored.principal_id)}  {stored.rule}")
    if tools:
        from lockgate.server.cli_sources import opened_catalog

        with opened_catalog() as catalog:
            registry = catalog.book.registry_for(principal)
            typer.echo(f"effective for {principal or 'every principal (no own rules)'}:")
            for name, decision in rules.effective(registry, principal):
                typer.echo(f"  {name:<40} {decision.value}")


@policy_app.command("remove")
def policy_remove(rule_id: Annotated[str, typer.Argument(help="The rule's id.")]) -> None:
    """Remove a stored rule (LOCKGATE_POLICY's are changed in the configuration)."""
    from lockgate.machine.errors import LockgateError

    try:
        stored = _policy_rules().remove(rule_id)
    except LockgateError as exc:
        raise _failed(exc, 1) from None
    typer.echo(f"removed {stored.id}  {_scope(stored.principal_id)}  {stored.rule}")


secrets_app = typer.Typer(
    help="Manage the secret store (values encrypted with LOCKGATE_SECRETS_KEY, never shown).",
    no_args_is_help=True,
)


def _secret_store() -> Any:
    from lockgate.machine.db.migrate import prepare_database
    from lockgate.machine.db.store import SqlStore
    from lockgate.machine.secret_store import SecretCipher, StoredSecrets

    settings = configured_settings()
    return StoredSecrets(
        SqlStore(prepare_database(settings)).secrets, SecretCipher.from_settings(settings)
    )


@secrets_app.command("key")
def secrets_key() -> None:
    """Print a new key for LOCKGATE_SECRETS_KEY (nothing is stored)."""
    from lockgate.machine.secret_store import new_key

    typer.echo(new_key())


@secrets_app.command("set")
def secrets_set(
    name: Annotated[str, typer.Argument(help="The secret's name, as sources name it.")],
    principal: Annotated[
        str | None, typer.Option(help="Only this principal's calls (default: everyone's).")
    ] = None,
    source: Annotated[
        str | None, typer.Option(help="Only this source's tools (default: any source's).")
    ] = None,
) -> None:
    """Store a secret; its value is read from standard input (never from the command line,
    where shell history and process listings would keep it)."""
    import sys

    from lockgate.machine.errors import LockgateError
    from lockgate.server.keys import check_principal

    value = sys.stdin.read().rstrip("\r\n")
    try:
        if principal is not None:
            check_principal(principal)
        new = _secret_store().set(name, value, principal=principal, source=source)
    except LockgateError as exc:
        raise _failed(exc, 2) from None
    scope = f"{principal or '(everyone)'}, {f'source {source}' if source else 'any source'}"
    typer.echo(f"{'stored' if new else 'replaced'} secret {name} ({scope})")


@secrets_app.command("list")
def secrets_list() -> None:
    """List stored secrets: names, scope and binding, never values."""
    for entry in _secret_store().listed():
        typer.echo(
            f"{entry.name:<24} {entry.principal_id or '(everyone)':<20} "
            f"{entry.source or '(any source)':<20} updated {entry.updated_at:%Y-%m-%d %H:%M}"
        )


@secrets_app.command("delete")
def secrets_delete(
    name: Annotated[str, typer.Argument(help="The secret's name.")],
    principal: Annotated[
        str | None, typer.Option(help="The principal's own secret (default: the global one).")
    ] = None,
) -> None:
    """Delete a stored secret."""
    if not _secret_store().delete(name, principal=principal):
        raise fail(
            f"no secret {name!r} is stored for {principal or 'everyone'}: "
            "`lockgate secrets list` shows what is.",
            1,
        )
    typer.echo(f"deleted secret {name} ({principal or '(everyone)'})")


@secrets_app.command("rotate")
def secrets_rotate() -> None:
    """Re-encrypt every stored value under the first key of LOCKGATE_SECRETS_KEY."""
    from lockgate.machine.errors import LockgateError

    try:
        count = _secret_store().rotate()
    except LockgateError as exc:
        raise _failed(exc, 2) from None
    typer.echo(f"re-encrypted {count} secrets under the first key")


audit_app = typer.Typer(help="Read the audit trail of decisions.", no_args_is_help=True)


@audit_app.command("export")
def audit_export(
    principal: Annotated[
        str | None, typer.Option(help="Only decisions on this principal's executions.")
    ] = None,
    since: Annotated[
        str | None, typer.Option(help="Only decisions at or after this ISO 8601 time.")
    ] = None,
) -> None:
    """Print every decision on a gated call as a JSON line, oldest first: who decided and
    through which door, the tool, a digest of the exact arguments, the policy revision."""
    import json
    from datetime import UTC, datetime

    from lockgate.machine.approval_audit import exported
    from lockgate.machine.db.migrate import prepare_database
    from lockgate.machine.db.store import SqlStore

    start: datetime | None = None
    if since is not None:
        try:
            start = datetime.fromisoformat(since)
        except ValueError:
            raise fail(f"--since takes an ISO 8601 time (got {since!r})", 2) from None
        start = start if start.tzinfo else start.replace(tzinfo=UTC)
    store = SqlStore(prepare_database(configured_settings()))
    try:
        for call, owner in store.audit_export.decided(principal_id=principal, since=start):
            line = exported(
                execution_id=call.execution_id,
                principal_id=owner,
                seq=call.seq,
                tool=call.tool,
                decision=call.decision,
                decided_at=call.decided_at,
            )
            typer.echo(json.dumps(line, ensure_ascii=False))
    finally:
        store.engine.dispose()
