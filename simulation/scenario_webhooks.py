"""Scenarios of the webhook outbox: approval events delivered, retried, abandoned, warned.

Each drives the outbox as an instance's delivery loop would (`deliver_due`), with the world's
endpoint (`simulation.webhook_endpoint`) accepting or refusing, and time moved only by the
scenario. Every step is safe to take again after a crash: delivery runs until nothing is
due, and time only moves forward to a point computed from what is stored.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from lockgate.machine.engine import Action
from lockgate.machine.runtime import Runtime
from lockgate.machine.webhooks import EXPIRING, REQUESTED
from lockgate.simulation.scenario_steps import WRITE_THEN_READ, decide, started
from lockgate.simulation.world import Client, ScenarioFailed, expect
from lockgate.spec import ExecutionStatus as E
from lockgate.spec import WebhookDeliveryStatus as W

#: Rounds a drive delivers for at most (each round attempts every due row once).
MAX_ROUNDS = 20


def _queued(runtime: Runtime) -> list[datetime]:
    rows = runtime.engine.store.webhooks.recent(100, status=W.QUEUED)
    return [r.next_attempt_at for r in rows]


def deliver_everything(client: Client) -> None:
    """Run delivery until no row is queued, moving time to each next attempt (a backoff)."""
    for _ in range(MAX_ROUNDS):
        client.runtime.engine.webhooks.deliver_due()
        waiting = _queued(client.runtime)
        if not waiting:
            return
        due = min(waiting)
        if due > client.world.clock():
            client.world.clock.advance(due - client.world.clock())
    raise ScenarioFailed(f"webhook events still queued after {MAX_ROUNDS} rounds")


def _received(client: Client, kind: str, execution_id: str) -> None:
    expect(
        (kind, execution_id) in client.world.webhooks.kinds(),
        f"the endpoint never received {kind} for {execution_id}",
    )


def webhook_delivered(client: Client) -> None:
    """A call paused for approval: its event reaches the endpoint, signed; then accepted."""
    view = started(client, "e", WRITE_THEN_READ)
    deliver_everything(client)
    _received(client, REQUESTED, view.id)
    done = decide(client, "e.id", Action.ACCEPT)
    assert done is not None
    expect(done.status in (E.COMPLETED, E.INTERRUPTED), f"accepted run ended {done.status}")


def webhook_abandoned(client: Client) -> None:
    """The endpoint is down: the event is retried with backoff, then abandoned after its
    last attempt; the approval itself is still decided (declined) through the model."""
    client.world.webhooks.down = True
    view = started(client, "e", WRITE_THEN_READ)
    deliver_everything(client)
    # A crash before the client learned of its first execution makes it execute again:
    # that one's event is abandoned too.
    rows = [r for r in client.runtime.engine.store.webhooks.recent(10) if r.execution_id == view.id]
    expect(
        [r.status for r in rows] == [W.ABANDONED],
        f"an endpoint that is down left the outbox {[(r.id, r.status) for r in rows]}",
    )
    client.world.webhooks.down = False
    done = decide(client, "e.id", Action.DECLINE)
    assert done is not None
    expect(done.status != E.WAITING_FOR_INTERACTION, f"declined run is {done.status}")
    expect(view.id not in {e for _, e in client.world.webhooks.kinds()}, "a refusal counted")


def approval_warned(client: Client) -> None:
    """Nobody decides: once the deadline is within the warning window, the maintenance
    round queues a warning (alone), which is delivered; then the approval is accepted."""
    view = started(client, "e", WRITE_THEN_READ)
    deliver_everything(client)
    row = client.runtime.engine.store.executions.get(view.id)
    if row is None or row.deadline is None:
        raise ScenarioFailed("a paused execution has no deadline")
    window = client.runtime.settings.approval_warning
    warn_at = row.deadline - window + timedelta(seconds=1)
    if client.world.clock() < warn_at:
        client.world.clock.advance(warn_at - client.world.clock())
    client.runtime.maintain()
    deliver_everything(client)
    _received(client, EXPIRING, view.id)
    done = decide(client, "e.id", Action.ACCEPT)
    assert done is not None
    expect(done.status in (E.COMPLETED, E.INTERRUPTED), f"accepted run ended {done.status}")
