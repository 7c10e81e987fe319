"""`lockgate approvers`: the people who decide gated calls, and their sign-ins.

A passkey approver's enrolment link is printed here, on the operator's terminal, and
nowhere else: never in an MCP answer, a log line, or a webhook. Whoever opens it first
registers the passkey, so hand it to the person the way you would hand them a password.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

import typer

from lockgate.server.cli_admin import _failed, configured_settings, fail

approvers_app = typer.Typer(
    help="Manage the people who approve gated calls (approvers), and their sign-ins.",
    no_args_is_help=True,
)


def _people() -> Any:
    from lockgate.machine.db.migrate import prepare_database
    from lockgate.machine.db.store import SqlStore
    from lockgate.machine.people import People
    from lockgate.machine.write_path import WritePath

    settings = configured_settings()
    store = SqlStore(prepare_database(settings))
    return People(
        store=store, write=WritePath(store), settings=settings, clock=lambda: datetime.now(UTC)
    )


def enrolment_text(base_url: str, token: str, expires_at: datetime) -> str:
    """How an enrolment link is shown to the operator (here and on a first start)."""
    return (
        f"Passkey enrolment link (works once, until {expires_at:%Y-%m-%d %H:%M} UTC; open it "
        f"in the approver's browser, at this address):\n  {base_url}/enrol/{token}"
    )


@approvers_app.command("add")
def approvers_add(
    name: Annotated[str, typer.Argument(help="The person's name, as audit records show it.")],
    principal: Annotated[
        list[str] | None,
        typer.Option("--principal", help="Whose calls they decide (repeatable)."),
    ] = None,
    all_principals: Annotated[
        bool, typer.Option("--all-principals", help="They decide every principal's calls.")
    ] = False,
    email: Annotated[str | None, typer.Option(help="Their email.")] = None,
    issuer: Annotated[
        str | None,
        typer.Option(
            help="The OpenID provider they sign in with (default: LOCKGATE_OIDC_ISSUER when "
            "--subject or --oidc is given). Without one, they sign in with a passkey."
        ),
    ] = None,
    subject: Annotated[
        str | None, typer.Option(help="The provider's id for them (its `sub` claim).")
    ] = None,
    oidc: Annotated[
        bool,
        typer.Option(
            "--oidc", help="They sign in with LOCKGATE_OIDC_ISSUER, matched by verified --email."
        ),
    ] = False,
) -> None:
    """Add an approver. A passkey approver gets a one-time enrolment link, printed here."""
    from lockgate.machine.errors import LockgateError

    people = _people()
    if issuer is None and (subject is not None or oidc):
        issuer = people.settings.oidc_issuer or None
        if issuer is None:
            raise fail("--subject and --oidc need --issuer, or LOCKGATE_OIDC_ISSUER set.", 2)
    principals = ["*"] if all_principals else list(principal or [])
    try:
        approver = people.add(
            name, principals=principals, email=email, issuer=issuer, subject=subject
        )
        link = people.issue_enrolment(approver.id) if issuer is None else None
    except LockgateError as exc:
        raise _failed(exc, 2) from None
    whose = "every principal" if all_principals else ", ".join(principals)
    typer.echo(f"approver {approver.id}: {approver.name}, decides for {whose}")
    if link is not None:
        typer.echo(enrolment_text(people.settings.base_url, link.token, link.expires_at))
    else:
        how = f"subject {subject}" if subject else f"verified email {email}"
        typer.echo(f"signs in at {issuer} as {how}")


@approvers_app.command("list")
def approvers_list() -> None:
    """List approvers: how they sign in, whose calls they decide, their sessions."""
    for item in _people().listing():
        a = item.approver
        who = ",".join(item.principals) or "-"
        how = (
            f"passkey ({item.passkeys} registered"
            + (", enrolment link pending" if item.enrolment_pending else "")
            + ")"
            if a.sign_in == "passkey"
            else f"oidc {a.issuer} {a.subject or '(by email, not signed in yet)'}"
        )
        typer.echo(
            f"{a.id}  {a.name:<24} {a.email or '-':<28} for {who:<16} {how}  "
            f"{item.active_sessions} signed in"
        )


@approvers_app.command("remove")
def approvers_remove(
    approver_id: Annotated[str, typer.Argument(help="The approver's id (approvers list).")],
) -> None:
    """Remove an approver: signed out everywhere, their passkeys and links void."""
    from lockgate.machine.errors import LockgateError

    try:
        approver = _people().remove(approver_id)
    except LockgateError as exc:
        raise _failed(exc, 1) from None
    typer.echo(f"removed {approver.id} ({approver.name})")


@approvers_app.command("enrol")
def approvers_enrol(
    approver_id: Annotated[str, typer.Argument(help="The approver's id (approvers list).")],
) -> None:
    """A new one-time passkey enrolment link (earlier unused ones stop working)."""
    from lockgate.machine.errors import LockgateError

    people = _people()
    try:
        link = people.issue_enrolment(approver_id)
    except LockgateError as exc:
        raise _failed(exc, 1) from None
    typer.echo(enrolment_text(people.settings.base_url, link.token, link.expires_at))


@approvers_app.command("sign-out")
def approvers_sign_out(
    approver_id: Annotated[
        str | None, typer.Argument(help="The approver's id; omit with --all.")
    ] = None,
    everyone: Annotated[bool, typer.Option("--all", help="Sign every approver out.")] = False,
) -> None:
    """End sessions at once, on every instance: the person signs in again to decide."""
    from lockgate.machine.errors import LockgateError

    if (approver_id is None) == (not everyone):
        raise fail("Name one approver id, or pass --all.", 2)
    people = _people()
    try:
        if approver_id is not None:
            people.get(approver_id)
        ended = people.sign_out_everywhere(approver_id)
    except LockgateError as exc:
        raise _failed(exc, 1) from None
    typer.echo(f"signed out {ended} session(s)")
