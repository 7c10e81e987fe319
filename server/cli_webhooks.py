"""`lockgate webhook`: a signing secret for the endpoint, and what the outbox holds."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from lockgate.server.cli_admin import configured_settings
from lockgate.spec import WebhookDeliveryStatus

webhook_app = typer.Typer(
    help="The webhook events about approvals (LOCKGATE_WEBHOOK_URL).", no_args_is_help=True
)


@webhook_app.command("secret")
def webhook_secret() -> None:
    """Print a new signing secret for LOCKGATE_WEBHOOK_SECRET (give the receiver the same)."""
    from lockgate.machine.webhook_signing import make_secret

    typer.echo(make_secret())


@webhook_app.command("list")
def webhook_list(
    status: Annotated[
        WebhookDeliveryStatus | None,
        typer.Option(help="Only events in this state (queued, delivered, abandoned)."),
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=10_000, help="At most this many.")] = 50,
) -> None:
    """Print the newest events of the outbox as JSON lines: id, state, attempts, the next
    attempt's time and the last error (an abandoned event keeps why)."""
    from lockgate.machine.db.migrate import prepare_database
    from lockgate.machine.db.store import SqlStore

    store = SqlStore(prepare_database(configured_settings()))
    try:
        for row in store.webhooks.recent(limit, None if status is None else status.value):
            line = {
                "id": row.id,
                "type": row.kind,
                "principal": row.principal_id,
                "status": row.status,
                "attempts": row.attempts,
                "next_attempt_at": row.next_attempt_at.isoformat(),
                "delivered_at": row.delivered_at.isoformat() if row.delivered_at else None,
                "last_error": row.last_error,
            }
            typer.echo(json.dumps(line, ensure_ascii=False))
    finally:
        store.engine.dispose()
