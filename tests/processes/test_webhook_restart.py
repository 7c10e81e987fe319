"""The webhook outbox across SIGKILL: real `lockgate serve` processes, a real endpoint on
loopback verifying every signature. An event queued with a pause is delivered by the next
process when the endpoint was down; an event the endpoint accepted just before the process
died (its `deliver` not committed) is delivered again: at least once, never lost."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator

import pytest

from lockgate.machine.db.migrate import prepare_database
from lockgate.machine.db.store import SqlStore
from lockgate.machine.settings import Settings
from lockgate.machine.webhooks import REQUESTED, event_id
from lockgate.spec import WebhookDeliveryStatus as W
from tests.support.polling import wait_for
from tests.support.servers import Deployment, create_key_directly, mcp_client, run, structured
from tests.support.webhook_receiver import Receiver, RunningReceiver, serve_receiver

pytest_plugins = ["tests.support.servers"]

pytestmark = pytest.mark.slow

WRITE = 'tools.notes.write(key="k", text="v")'


@pytest.fixture(name="hook")
def hook_fixture() -> Iterator[RunningReceiver]:
    yield from serve_receiver(Receiver())


def _settings(hook: RunningReceiver) -> dict[str, str]:
    # A dead process's claim lapses after one attempt's bound (and 5 s): a short bound makes
    # the next process take the event over sooner.
    return {
        "LOCKGATE_WEBHOOK_URL": hook.url,
        "LOCKGATE_WEBHOOK_SECRET": hook.receiver.secret,
        "LOCKGATE_WEBHOOK_TIMEOUT": "1",
    }


def _paused(url: str, key: str) -> str:
    async def execute() -> str:
        async with mcp_client(url, key, "legacy") as client:
            body = structured(await client.call_tool("execute", {"code": WRITE}))
            assert body["status"] == "waiting_for_interaction", body
            return str(body["executionId"])

    return run(execute())


def _paused_as_it_dies(url: str, key: str) -> str | None:
    """Code that pauses, on a server planned to die once the pause's event is delivered:
    that death races the answer (and the SDK's tool listing after it), so the client may
    hear the execution id or lose its connection first. The event names the execution
    either way; this returns what the client heard, if anything."""

    async def execute() -> str | None:
        try:
            async with mcp_client(url, key, "legacy") as client:
                body = structured(await client.call_tool("execute", {"code": WRITE}))
        except Exception:  # the planned death came first: nothing was heard
            return None
        assert body["status"] == "waiting_for_interaction", body
        return str(body["executionId"])

    return run(asyncio.wait_for(execute(), timeout=60))


def _status(database_url: str, delivery_id: str) -> str | None:
    store = SqlStore(prepare_database(Settings(database_url=database_url)))
    try:
        row = store.webhooks.get(delivery_id)
        return None if row is None else row.status
    finally:
        store.engine.dispose()


def test_an_event_queued_before_sigkill_is_delivered_by_the_next_process(
    deployment: Deployment, hook: RunningReceiver
) -> None:
    receiver = hook.receiver
    receiver.answers = [503] * 1000  # down until the test brings it up
    settings = _settings(hook)
    settings["LOCKGATE_WEBHOOK_RETRY_BASE"] = "0.2"
    key = create_key_directly(deployment.database_url, "alice")
    first = deployment.start(name="first", **settings)
    execution_id = _paused(first.url, key)
    with receiver.changed:
        assert receiver.changed.wait_for(lambda: len(receiver.attempts) >= 1, 30)
    assert first.kill() == -signal.SIGKILL
    assert receiver.received == {}

    receiver.answers.clear()  # the endpoint is back
    deployment.start(name="second", **settings)
    [event] = receiver.wait_for(1)
    delivery = event_id(REQUESTED, execution_id, 1)
    assert event["type"] == "approval.requested" and event["data"]["execution_id"] == execution_id
    assert list(receiver.received) == [delivery] and receiver.forged == 0
    wait_for(lambda: _status(deployment.database_url, delivery) == W.DELIVERED, "the row delivered")


def test_an_event_accepted_just_before_sigkill_is_delivered_again_not_lost(
    deployment: Deployment, hook: RunningReceiver
) -> None:
    receiver = hook.receiver
    settings = _settings(hook)
    key = create_key_directly(deployment.database_url, "alice")
    first = deployment.start(
        name="first",
        LOCKGATE_CRASH_AT="webhook_delivery:deliver:queued->delivered:after_effect",
        **settings,
    )
    answered = _paused_as_it_dies(first.url, key)
    receiver.wait_for(1)
    assert first.wait_exit() == -signal.SIGKILL  # it died between the POST and its commit
    [delivery] = receiver.received
    kind, execution_id, seq = delivery.split(":")
    assert (kind, seq) == (REQUESTED, "1")
    assert answered in (None, execution_id)  # what the client heard, if anything, agrees
    assert delivery == event_id(REQUESTED, execution_id, 1)
    assert _status(deployment.database_url, delivery) == W.QUEUED

    deployment.start(name="second", **settings)
    wait_for(lambda: len(receiver.received[delivery]) == 2, "the event delivered again")
    assert receiver.forged == 0
    first_body, second_body = receiver.received[delivery]
    assert first_body == second_body  # the same event, the same id: the receiver dedupes
    wait_for(lambda: _status(deployment.database_url, delivery) == W.DELIVERED, "the row delivered")
