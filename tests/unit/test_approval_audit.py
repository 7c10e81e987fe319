"""Every decision is an audit record, written with the decision: who (the door, the actor,
the client), what (the tool and a digest of the exact arguments), under which policy, when,
and until when; `lockgate audit export` prints them as JSON lines.

Two principals: each one's export filter shows only its own decisions.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import JsonValue
from typer.testing import CliRunner

from lockgate.machine.approval_audit import (
    Decider,
    Door,
    PersonRef,
    arguments_digest,
    policy_revision,
)
from lockgate.machine.engine import Action
from lockgate.machine.policy import Policy
from lockgate.server.cli import app
from lockgate.server.policy_rules import PolicyRules
from lockgate.spec import ExecutionStatus
from tests.support.engine_records import MakeRuntime

WRITE = "tools.notes.write(key='k', text='v')"


def export(database_url: str, tmp_path: Path, *args: str) -> list[dict[str, object]]:
    result = CliRunner().invoke(
        app,
        ["audit", "export", *args],
        env={"LOCKGATE_DATABASE_URL": database_url, "LOCKGATE_NOTES_DIR": str(tmp_path)},
    )
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.output.splitlines()]


def test_each_decision_is_recorded_with_its_door_arguments_and_policy(
    make_runtime: MakeRuntime, database_url: str, tmp_path: Path
) -> None:
    rt = make_runtime(policy_refresh_secs=0)
    alice = rt.engine.execute("alice", WRITE)
    client: dict[str, JsonValue] = {"name": "some-client", "version": "1.2"}
    rt.engine.resume(
        alice.id, "alice", Action.ACCEPT, decided_by=Decider(Door.RESUME, "alice", client)
    )
    # A stored rule changes the rules in force for bob's decision: another revision.
    PolicyRules(rt.engine.store).add("notes.read", "block", principal="bob")
    bob = rt.engine.execute("bob", WRITE)
    assert bob.status is ExecutionStatus.WAITING_FOR_INTERACTION
    ann = PersonRef("https://id.example", "ann-1", "Ann", "ann@example.com", "oidc")
    rt.engine.resume(
        bob.id, "bob", Action.DECLINE, decided_by=Decider(Door.APPROVAL_PAGE, "Ann", person=ann)
    )

    lines = export(database_url, tmp_path)
    assert [line["principal"] for line in lines] == ["alice", "bob"]
    first, second = lines
    assert first == {
        "executionId": alice.id,
        "principal": "alice",
        "call": 1,
        "tool": "tools.notes.write",
        "action": "accept",
        "door": "resume",
        "by": "model",
        "actor": "alice",
        "client": client,
        "person": None,
        "argumentsDigest": arguments_digest({"key": "k", "text": "v"}),
        "policyRevision": policy_revision(Policy()),
        "decidedAt": first["decidedAt"],
        "expiresAt": first["expiresAt"],
    }
    assert first["decidedAt"] and first["expiresAt"]
    assert str(first["decidedAt"]) < str(first["expiresAt"])
    assert second["action"] == "decline" and second["door"] == "approval_page"
    assert second["by"] == "person"
    # The person who decided, and how they signed in.
    assert second["person"] == {
        "issuer": "https://id.example",
        "subject": "ann-1",
        "name": "Ann",
        "email": "ann@example.com",
        "signedInWith": "oidc",
    }
    assert second["argumentsDigest"] == first["argumentsDigest"]  # the same arguments
    assert second["policyRevision"] != first["policyRevision"]  # other rules applied

    assert [
        line["executionId"] for line in export(database_url, tmp_path, "--principal", "bob")
    ] == [bob.id]
    assert export(database_url, tmp_path, "--since", "2999-01-01T00:00:00+00:00") == []
    bad = CliRunner().invoke(
        app,
        ["audit", "export", "--since", "yesterday"],
        env={"LOCKGATE_DATABASE_URL": database_url},
    )
    assert bad.exit_code == 2 and "--since" in bad.output


@pytest.mark.parametrize("action", [Action.ACCEPT, Action.DECLINE])
def test_a_decision_without_a_door_is_the_server_s(
    make_runtime: MakeRuntime, action: Action
) -> None:
    rt = make_runtime()
    paused = rt.engine.execute("alice", WRITE)
    rt.engine.resume(paused.id, "alice", action)
    call = rt.engine.store.tool_calls.last_decided(paused.id)
    assert call is not None and isinstance(call.decision, dict)
    assert call.decision["door"] == "server" and call.decision["action"] == str(action)
