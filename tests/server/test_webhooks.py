"""Webhook events about approvals, POSTed to a real endpoint on loopback and verified there
with the Standard Webhooks library, as an operator's relay (to Slack, to email) would."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from lockgate.machine.engine import Action
from lockgate.machine.runtime import Runtime
from lockgate.machine.webhook_signing import make_secret
from lockgate.machine.webhooks import EXPIRING, REQUESTED, event_id
from lockgate.spec import ExecutionStatus as E
from lockgate.spec import WebhookDeliveryStatus as W
from tests.support.webhook_receiver import Receiver, RunningReceiver, serve_receiver

WRITE = 'tools.notes.write(key="k", text="secret plans")'
Build = Callable[..., Runtime]


@pytest.fixture(name="hook")
def hook_fixture() -> Iterator[RunningReceiver]:
    yield from serve_receiver(Receiver())


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


def _runtime(build: Build, hook: RunningReceiver, **more: Any) -> Runtime:
    return build(webhook_url=hook.url, webhook_secret=hook.receiver.secret, **more)


def test_a_paused_call_is_announced_signed_with_what_a_person_needs(
    make_runtime: Build, hook: RunningReceiver
) -> None:
    runtime = _runtime(make_runtime, hook, public_url="https://lockgate.example")
    paused = runtime.engine.execute("alice", WRITE)
    assert paused.status == E.WAITING_FOR_INTERACTION
    # Queued with the pause itself, before anything was sent.
    [row] = runtime.engine.store.webhooks.recent(10)
    assert (row.id, row.status) == (event_id(REQUESTED, paused.id, 1), W.QUEUED)

    assert runtime.engine.webhooks.deliver_due() == 1
    [event] = hook.receiver.wait_for(1)
    assert event["type"] == "approval.requested"
    assert event["data"] == {
        "principal": "alice",
        "execution_id": paused.id,
        "call": 1,
        "tool": "notes.write",
        "arguments": {"key": "k", "text": "secret plans"},
        "expires_at": event["data"]["expires_at"],
        "approval_url": f"https://lockgate.example/approve/{paused.id}/1",
        "approvals_url": "https://lockgate.example/approvals",
    }
    # The page's link names the call and carries nothing that decides it: no credential.
    assert "token" not in str(event) and "lockgate_person" not in str(event)
    stored = runtime.engine.store.webhooks.get(row.id)
    assert stored is not None and stored.status == W.DELIVERED and stored.attempts == 1
    # Delivered once: nothing is due any more.
    assert runtime.engine.webhooks.deliver_due() == 0
    assert list(hook.receiver.received) == [row.id]


def test_refusals_and_redirects_are_retried_with_backoff_until_accepted(
    make_runtime: Build, hook: RunningReceiver
) -> None:
    clock = Clock()
    hook.receiver.answers = [500, 302]
    runtime = _runtime(make_runtime, hook, clock=clock, webhook_retry_base="10")
    paused = runtime.engine.execute("alice", WRITE)
    runtime.engine.webhooks.deliver_due()
    row = runtime.engine.store.webhooks.get(event_id(REQUESTED, paused.id, 1))
    assert row is not None and row.status == W.QUEUED and row.attempts == 1
    assert row.last_error is not None and row.last_error.startswith("HTTP 500")
    assert row.next_attempt_at == clock.now + timedelta(seconds=10)
    assert runtime.engine.webhooks.deliver_due() == 0  # not due before its backoff

    clock.now += timedelta(seconds=10)
    runtime.engine.webhooks.deliver_due()
    row = runtime.engine.store.webhooks.get(row.id)
    assert row is not None and row.attempts == 2 and row.last_error is not None
    assert row.last_error.startswith("HTTP 302: redirects are not followed")
    assert row.next_attempt_at == clock.now + timedelta(seconds=20)  # doubled
    assert hook.receiver.received == {}  # the redirect was not followed

    clock.now += timedelta(seconds=20)
    runtime.engine.webhooks.deliver_due()
    hook.receiver.wait_for(1)
    row = runtime.engine.store.webhooks.get(row.id)
    assert row is not None and row.status == W.DELIVERED and row.attempts == 3
    assert [status for _, status in hook.receiver.attempts] == [500, 302, 200]


def test_an_event_is_abandoned_after_its_last_attempt_and_the_approval_still_works(
    make_runtime: Build, hook: RunningReceiver, tmp_path: Path
) -> None:
    clock = Clock()
    hook.receiver.answers = [503, 503]
    runtime = _runtime(make_runtime, hook, clock=clock, webhook_max_attempts=2)
    paused = runtime.engine.execute("alice", WRITE)
    runtime.engine.webhooks.deliver_due()
    clock.now += timedelta(hours=1)
    runtime.engine.webhooks.deliver_due()
    row = runtime.engine.store.webhooks.get(event_id(REQUESTED, paused.id, 1))
    assert row is not None and row.status == W.ABANDONED and row.attempts == 2
    assert row.last_error == "HTTP 503: refused"
    clock.now += timedelta(hours=1)
    assert runtime.engine.webhooks.deliver_due() == 0  # abandoned is final
    done = runtime.engine.resume(paused.id, "alice", Action.ACCEPT)
    assert done.status == E.COMPLETED


def test_an_unreachable_endpoint_and_a_forged_secret_are_failures_not_deliveries(
    make_runtime: Build, hook: RunningReceiver
) -> None:
    runtime = make_runtime(webhook_url="http://127.0.0.1:9/hooks", webhook_secret=make_secret())
    paused = runtime.engine.execute("alice", WRITE)
    runtime.engine.webhooks.deliver_due()
    row = runtime.engine.store.webhooks.get(event_id(REQUESTED, paused.id, 1))
    assert row is not None and row.status == W.QUEUED
    assert row.last_error == "the request failed (ConnectError)"

    # Signed with a secret the receiver does not hold: it refuses, nothing is delivered.
    other = make_runtime(webhook_url=hook.url, webhook_secret=make_secret())
    other.engine.execute("bob", WRITE)
    other.engine.webhooks.deliver_due()
    assert hook.receiver.forged >= 1 and hook.receiver.received == {}


def test_a_warning_goes_out_once_before_the_approval_expires_whoever_sweeps(
    make_runtime: Build, hook: RunningReceiver
) -> None:
    clock = Clock()
    settings = {"approval_ttl": "3600", "approval_warning": "600", "clock": clock}
    a = _runtime(make_runtime, hook, **settings)
    b = _runtime(make_runtime, hook, **settings)
    paused = a.engine.execute("alice", WRITE)
    a.engine.webhooks.deliver_due()
    clock.now += timedelta(minutes=49)  # 11 minutes left: no warning yet
    a.maintain()
    assert a.engine.webhooks.deliver_due() == 0
    clock.now += timedelta(minutes=2)  # 9 minutes left
    for instance in (a, b, a):
        instance.maintain()
    assert b.engine.webhooks.deliver_due() == 1
    events = hook.receiver.wait_for(2)
    assert [e["type"] for e in events] == [REQUESTED, EXPIRING]
    warning = events[1]["data"]
    assert warning["execution_id"] == paused.id
    assert warning["expires_at"] == (clock.now + timedelta(minutes=9)).isoformat()
    # Decided meanwhile, or past the deadline: no further warning.
    a.engine.resume(paused.id, "alice", Action.DECLINE)
    a.maintain()
    assert a.engine.webhooks.deliver_due() == 0


def test_each_event_names_its_own_principal(make_runtime: Build, hook: RunningReceiver) -> None:
    runtime = _runtime(make_runtime, hook)
    alice = runtime.engine.execute("alice", WRITE)
    bob = runtime.engine.execute("bob", 'tools.notes.write(key="b", text="bob only")')
    runtime.engine.webhooks.deliver_due()
    events = {e["data"]["execution_id"]: e["data"] for e in hook.receiver.wait_for(2)}
    assert events[alice.id]["principal"] == "alice"
    assert events[bob.id]["principal"] == "bob"
    assert events[bob.id]["arguments"] == {"key": "b", "text": "bob only"}
    assert "bob only" not in str(events[alice.id])


def test_the_background_loop_delivers_without_being_asked(
    make_runtime: Build, hook: RunningReceiver
) -> None:
    runtime = _runtime(make_runtime, hook, heartbeat_interval="0.2")
    runtime.start()
    try:
        paused = runtime.engine.execute("alice", WRITE)
        [event] = hook.receiver.wait_for(1)
        assert event["data"]["execution_id"] == paused.id
    finally:
        runtime.close()  # its threads stop with it


@pytest.mark.parametrize(
    ("settings", "says"),
    [
        ({"webhook_url": "http://127.0.0.1/h"}, "without LOCKGATE_WEBHOOK_SECRET"),
        ({"webhook_url": "ftp://h", "webhook_secret": make_secret()}, "http:// or https://"),
        ({"webhook_secret": "whsec_c2hvcnQ="}, "at least 24 random bytes"),
        ({"webhook_secret": "hunter2-hunter2-hunter2-hunter2"}, "is not whsec_"),
    ],
)
def test_a_webhook_misconfiguration_is_refused_without_showing_the_secret(
    settings: dict[str, str], says: str
) -> None:
    from lockgate.machine.settings import Settings

    with pytest.raises(ValidationError) as refused:
        Settings(**settings)  # type: ignore[arg-type]
    assert says in str(refused.value)
    assert "hunter2" not in str(refused.value) and "c2hvcnQ" not in str(refused.value)


def test_the_operator_lists_the_outbox_and_makes_secrets(
    make_runtime: Build, hook: RunningReceiver, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    from lockgate.server.cli import app

    runtime = _runtime(make_runtime, hook)
    paused = runtime.engine.execute("alice", WRITE)
    runtime.engine.webhooks.deliver_due()
    monkeypatch.setenv("DATABASE_URL", database_url)
    listed = CliRunner().invoke(app, ["webhook", "list", "--status", "delivered"])
    assert listed.exit_code == 0, listed.output
    [line] = [json.loads(x) for x in listed.output.splitlines()]
    assert line["id"] == event_id(REQUESTED, paused.id, 1) and line["attempts"] == 1
    made = CliRunner().invoke(app, ["webhook", "secret"])
    assert made.exit_code == 0 and made.output.startswith("whsec_")
    bad = CliRunner().invoke(app, ["webhook", "list", "--status", "lost"])
    assert bad.exit_code == 2 and "lost" in bad.output


def test_each_call_an_execution_pauses_on_is_warned_about(
    make_runtime: Build, hook: RunningReceiver
) -> None:
    clock = Clock()
    runtime = _runtime(make_runtime, hook, approval_ttl="3600", approval_warning="600", clock=clock)
    two = 'tools.notes.write(key="a", text="1")\ntools.notes.write(key="b", text="2")'
    paused = runtime.engine.execute("alice", two)
    clock.now += timedelta(minutes=51)
    runtime.maintain()
    runtime.engine.resume(paused.id, "alice", Action.ACCEPT)  # now paused on the second
    clock.now += timedelta(minutes=51)
    runtime.maintain()
    runtime.engine.webhooks.deliver_due()
    warned = [
        (e["type"], e["data"]["call"]) for e in hook.receiver.wait_for(4) if e["type"] == EXPIRING
    ]
    assert sorted(warned) == [(EXPIRING, 1), (EXPIRING, 2)]
