"""The approval API over real HTTP, on SQLite and PostgreSQL: the principal's key on
GET /api/executions/{id} and POST /api/executions/{id}/resume, and a signed-in person on
GET|POST /api/approvals/{execution}/{call}, the page's own API.

A key is the agent's: it reads its own executions and gives up its own calls (decline,
cancel), and accepts only in approval mode `model`. Nothing an agent holds decides its call
in mode `browser`: not the key, not the approval URL, not its parts sent as the old link
header. A person decides: one who signed in, approves for the call's principal, sends the
decision as JSON from the page's origin with its CSRF token, and names the digest of the
call exactly as shown; a decision for another call than the one waiting decides nothing.
Refusals are JSON problems with a stable code, never a trace; a crash before a decision
commits leaves the call to decide again, and two people deciding at once decide it once.
The page itself is in test_approval_page, the inbox in test_approval_inbox.

The app is the real one (`create_app`), served by uvicorn on a loopback port in a background
thread with its lifespan (see tests.support.approval_app); requests are real HTTP through
httpx2, a person's as `tests.support.people.Approver` sends them (the page's own requests).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx2
import pytest
from alembic.command import downgrade
from sqlalchemy import inspect, text
from sqlmodel import col, select

from lockgate.machine.db.connect import open_engine
from lockgate.machine.db.migrate import alembic_config, upgrade
from lockgate.machine.db.schema import Execution, TransitionLog
from lockgate.machine.db.store import SqlStore
from lockgate.machine.faults import Faults
from lockgate.machine.runtime import Runtime
from lockgate.machine.tools.spec import make_idempotency_key
from lockgate.server.call_shown import call_shown
from lockgate.server.keys import ApiKeys
from lockgate.spec.crash_points import CrashPoint
from tests.support.approval_app import (
    BODY_LIMIT,
    JSON,
    PRINCIPAL,
    TWO_WRITES,
    WRITE_NOTE,
    Served,
    assert_clear_page,
    assert_problem,
    mcp_execute,
    serve,
)
from tests.support.canary import CANARY
from tests.support.people import Approver, call_of

#: A call whose code catches the refusal and returns its words.
CAUGHT = (
    'try:\n    tools.notes.write(key="k", text="v")\n    msg = "written"\n'
    "except PermissionError as e:\n    msg = str(e)\nmsg"
)
APPROVED = CrashPoint.parse("tool_call:approve:awaiting_approval->approved:before_commit")


@pytest.fixture
def served(make_runtime: Callable[..., Runtime]) -> Iterator[Served]:
    """The app in approval mode `browser`: only a person accepts."""
    with serve(make_runtime, max_request_bytes=BODY_LIMIT, approval_mode="browser") as s:
        yield s


def writes_made(served: Served) -> list[str]:
    notes = served.runtime.sources[0]
    return [e["key"] for e in notes.effects() if not e["read"]]  # type: ignore[attr-defined]


def decisions(served: Served, execution_id: str) -> list[str]:
    """The decisions committed for the execution's calls (approve / decline events)."""
    with served.runtime.engine.store.session() as s:
        return [
            t.event
            for t in s.exec(
                select(TransitionLog)
                .where(
                    col(TransitionLog.record_id).startswith(f"{execution_id}:"),
                    col(TransitionLog.event).in_(["approve", "decline"]),
                )
                .order_by(col(TransitionLog.id))
            )
        ]


def decision_of(served: Served, execution_id: str, call: int = 1) -> dict[str, Any]:
    """The stored decision (with its audit record) of a call."""
    found = served.runtime.engine.store.tool_calls.get(make_idempotency_key(execution_id, call))
    assert found is not None and isinstance(found.decision, dict), found
    return found.decision


def key_resume(served: Served, execution_id: str, action: str, **headers: str) -> httpx2.Response:
    return served.post(
        f"/api/executions/{execution_id}/resume",
        headers={**JSON, **served.bearer(), **headers},
        json={"action": action},
    )


# -- the principal's key --------------------------------------------------------------------


def test_a_key_reads_its_own_execution_and_nobody_else_does(served: Served) -> None:
    view = served.pause()
    response = served.get(f"/api/executions/{view.id}", headers=served.bearer())
    assert response.status_code == 200, response.text
    assert response.headers["cache-control"] == "no-store"
    body = response.json()
    assert body["executionId"] == view.id
    assert body["status"] == "waiting_for_interaction"
    assert body["tool"] == "tools.notes.write"
    assert body["argsPreview"] == {"key": "greeting", "text": "hello there"}
    assert body["requestedBy"] == PRINCIPAL
    assert body["code"] == WRITE_NOTE
    assert datetime.fromisoformat(body["expiresAt"]) > datetime.now(UTC)
    assert CANARY not in response.text

    # Nobody else: no credentials, a wrong key, another principal's key, an unknown id.
    missing = served.get(f"/api/executions/{view.id}")
    assert_problem(missing, 401, "unauthorized")
    assert missing.headers["www-authenticate"].startswith("Bearer")
    assert_problem(
        served.get(f"/api/executions/{view.id}", headers=served.bearer("lg_not-a-key")), 401
    )
    bob = ApiKeys(served.runtime.engine.store).create("bob").secret
    # Another principal's execution is answered like a missing one (no existence oracle).
    foreign = served.get(f"/api/executions/{view.id}", headers=served.bearer(bob))
    assert_problem(foreign, 404, "not_found")
    unknown = served.get("/api/executions/" + "0" * 32, headers=served.bearer(bob))
    assert foreign.json()["error"]["hint"] == unknown.json()["error"]["hint"]
    assert_problem(served.get("/api/executions/nope", headers=served.bearer()), 404, "not_found")
    # A person's session is not a key: the principal's API reads nothing for it.
    ann = served.person()
    assert_problem(ann.get(f"/api/executions/{view.id}"), 401, "unauthorized")


def test_nothing_the_agent_holds_accepts_its_call_a_person_does(served: Served) -> None:
    answer = mcp_execute(served)
    execution_id, url = answer["executionId"], answer["interaction"]["approvalUrl"]
    # The URL names the call, on the server's name for links; nothing in it is a secret.
    assert url == f"{served.runtime.settings.base_url}/approve/{execution_id}/1"

    # The key cannot accept in mode `browser`; the refusal says who can, and where.
    refused = key_resume(served, execution_id, "accept")
    assert_problem(refused, 403, "forbidden")
    error = refused.json()["error"]
    assert "A person must approve this call" in error["message"]
    assert url in error["hint"]
    # The URL's parts in the header old links' tokens travelled in: refused in words, even
    # beside a valid key, on every route that once took them.
    for token in (url.rsplit("/approve/", 1)[1], str(call_of(url)[1]), execution_id):
        for response in (
            key_resume(served, execution_id, "accept", **{"X-Approval-Token": token}),
            served.post(
                f"/api/executions/{execution_id}/resume",
                headers={**JSON, "X-Approval-Token": token, "Origin": served.url},
                json={"action": "accept"},
            ),
            served.get(f"/api/executions/{execution_id}", headers={"X-Approval-Token": token}),
        ):
            assert_problem(response, 401, "unauthorized")
            assert "not a credential" in response.json()["error"]["message"]
    # The people's route takes no key and no link: it wants a person. The right digest
    # does not stand in for one either (it is no secret: the agent knows what it asked).
    shown = call_shown(served.runtime.engine.store, execution_id, 1)
    assert shown is not None
    for headers, code in (
        (served.bearer(), "sign_in_required"),
        ({}, "sign_in_required"),
        ({"X-Approval-Token": execution_id}, "unauthorized"),
    ):
        nobody = served.post(
            f"/api/approvals/{execution_id}/1",
            headers={**JSON, **headers, "Origin": served.url},
            json={"action": "accept", "digest": shown.digest},
        )
        assert_problem(nobody, 401, code)
    assert served.status_of(execution_id) == "waiting_for_interaction"
    assert decisions(served, execution_id) == [] and writes_made(served) == []

    # A signed-in approver of alice approves it, through the page's own API.
    ann = served.person("Ann")
    done = ann.approve(url)
    assert done.status_code == 200, done.text
    assert done.headers["cache-control"] == "no-store"
    body = done.json()
    assert body["status"] == "completed"
    assert body["result"] == {"wrote": {"key": "greeting", "written": True}}
    assert CANARY not in done.text
    assert writes_made(served) == ["greeting"]
    record = decision_of(served, execution_id)
    assert (record["action"], record["door"]) == ("accept", "approval_page")
    assert record["person"]["name"] == "Ann"
    assert record["person"]["signedInWith"] == "passkey"
    # The principal's key reads the outcome.
    by_key = served.get(f"/api/executions/{execution_id}", headers=served.bearer())
    assert by_key.json()["status"] == "completed" and by_key.json()["tool"] is None


def test_a_key_gives_up_its_own_call(served: Served) -> None:
    declined = served.pause(CAUGHT)
    response = key_resume(served, declined.id, "decline")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["status"] == "completed"
    assert "declined" in body["result"]
    assert [c.status for c in served.runtime.engine.view(declined.id).calls] == ["declined"]
    record = decision_of(served, declined.id)
    assert (record["door"], record["actor"], record["person"]) == (
        "http_api",
        f"the model ({PRINCIPAL}'s key)",
        None,
    )

    cancelled = served.pause()
    response = key_resume(served, cancelled.id, "cancel")
    assert response.status_code == 200, response.text
    assert response.json()["status"] in ("failed", "cancelled")
    assert writes_made(served) == []
    # The person finds nothing left to decide on either.
    ann = served.person()
    for view in (declined, cancelled):
        shown = ann.call(view.id, 1)
        assert shown.status_code == 200 and shown.json()["waiting"] is False
        late = ann.decide(view.id, 1, "accept", digest=shown.json()["digest"])
        assert_problem(late, 409, "already_settled")
    assert writes_made(served) == []


def test_in_mode_model_the_key_accepts(make_runtime: Callable[..., Runtime]) -> None:
    with serve(make_runtime, approval_mode="model") as served:
        view = served.pause('tools.notes.write(key="k", text="v")\n"done"')
        response = key_resume(served, view.id, "accept")
        assert response.status_code == 200 and response.json()["result"] == "done"
        record = decision_of(served, view.id)
        assert (record["door"], record["actor"]) == ("http_api", f"the model ({PRINCIPAL}'s key)")
        # A person who opens the call later is told it was decided, and decides nothing.
        ann = served.person()
        assert_clear_page(ann.get(f"/approve/{view.id}/1"), 410, "already decided", "completed")
        assert_problem(ann.decide(view.id, 1, "decline", digest="0" * 64), 409, "already_settled")
        assert decisions(served, view.id) == ["approve"]


# -- a person ---------------------------------------------------------------------------------


def test_a_person_reads_the_call_whole_with_its_digest(served: Served) -> None:
    view = served.pause()
    ann = served.person()
    response = ann.call(view.id, 1)
    assert response.status_code == 200, response.text
    assert response.headers["cache-control"] == "no-store"
    body = response.json()
    assert body == {
        "executionId": view.id,
        "call": 1,
        "requestedBy": PRINCIPAL,
        "tool": "tools.notes.write",
        "arguments": {"key": "greeting", "text": "hello there"},
        "code": WRITE_NOTE,
        "waiting": True,
        "expiresAt": body["expiresAt"],
        "digest": body["digest"],
    }
    assert len(body["digest"]) == 64 and int(body["digest"], 16) >= 0
    assert datetime.fromisoformat(body["expiresAt"]) > datetime.now(UTC)
    assert CANARY not in response.text
    # The same call reads the same; another call of the same code another digest.
    assert ann.call(view.id, 1).json()["digest"] == body["digest"]
    assert served.person("Bea").call(view.id, 1).json()["digest"] == body["digest"]
    other = served.pause()
    assert ann.call(other.id, 1).json()["digest"] != body["digest"]
    # Reading decides nothing.
    assert served.status_of(view.id) == "waiting_for_interaction"


def test_an_accept_must_name_the_call_as_shown(served: Served) -> None:
    view = served.pause()
    ann = served.person()
    digest = ann.call(view.id, 1).json()["digest"]
    for wrong in ("0" * 64, digest[::-1]):
        refused = ann.decide(view.id, 1, "accept", digest=wrong)
        assert_problem(refused, 409, "already_settled")
        assert "not for the call as it waits now" in refused.json()["error"]["message"]
    # An accept that names no digest was shown nothing.
    bare = ann.http.post(
        f"{ann.base_url}/api/approvals/{view.id}/1",
        json={"action": "accept"},
        headers=ann.headers(),
    )
    assert_problem(bare, 409, "already_settled")
    assert served.status_of(view.id) == "waiting_for_interaction"
    assert decisions(served, view.id) == [] and writes_made(served) == []
    # With the digest it was shown, it decides.
    done = ann.decide(view.id, 1, "accept", digest=digest)
    assert done.status_code == 200 and done.json()["status"] == "completed", done.text


def test_a_person_decides_only_the_call_named(served: Served) -> None:
    view = served.pause(TWO_WRITES)
    ann = served.person()
    first = ann.call(view.id, 1).json()
    assert first["arguments"] == {"key": "first", "text": "one"}
    moved_on = ann.decide(view.id, 1, "accept", digest=first["digest"])
    assert moved_on.json()["status"] == "waiting_for_interaction", moved_on.text
    second = served.runtime.engine.view(view.id)
    assert second.pending is not None and second.pending.seq == 2

    # Call 1 again (a second tab still showing it): it must not decide call 2, which
    # nobody was shown by that tab.
    for action in ("accept", "decline"):
        again = ann.decide(view.id, 1, action, digest=first["digest"])
        assert_problem(again, 409, "already_settled")
    # Call 2 with call 1's digest: not what waits.
    assert_problem(ann.decide(view.id, 2, "accept", digest=first["digest"]), 409)
    assert served.status_of(view.id) == "waiting_for_interaction"
    assert decisions(served, view.id) == ["approve"]

    shown = ann.call(view.id, 2).json()
    assert shown["arguments"] == {"key": "second", "text": "two"} and shown["waiting"] is True
    assert ann.call(view.id, 1).json()["waiting"] is False
    done = ann.decide(view.id, 2, "accept", digest=shown["digest"])
    assert done.json()["status"] == "completed", done.text
    assert writes_made(served) == ["first", "second"]
    # A call that was never made is not there to decide.
    assert_problem(ann.call(view.id, 3), 404, "not_found")
    assert_problem(ann.decide(view.id, 3, "decline", digest="0" * 64), 404, "not_found")


def test_a_person_decides_only_for_the_principals_they_approve_for(served: Served) -> None:
    view = served.pause()
    bea = served.person("Bea", principals=("bob",))
    assert_problem(bea.call(view.id, 1), 403, "forbidden")
    refused = bea.decide(view.id, 1, "accept", digest="0" * 64)
    assert_problem(refused, 403, "forbidden")
    assert "Bea does not approve calls of alice" in refused.json()["error"]["message"]
    assert_problem(bea.decide(view.id, 1, "decline", digest="0" * 64), 403, "forbidden")
    # An unknown execution is not found, for anybody.
    assert_problem(bea.call("0" * 32, 1), 404, "not_found")
    assert_problem(bea.decide("0" * 32, 1, "decline", digest="0" * 64), 404, "not_found")
    assert served.status_of(view.id) == "waiting_for_interaction"
    # Given alice too, the same person decides.
    both = served.person("Cy", principals=("bob", PRINCIPAL))
    assert both.decide(view.id, 1, "decline").json()["status"] == "failed"
    assert decision_of(served, view.id)["person"]["name"] == "Cy"


def test_a_decline_needs_no_digest_and_leaves_the_code_to_handle_it(served: Served) -> None:
    view = served.pause(CAUGHT)
    ann = served.person()
    response = ann.http.post(
        f"{ann.base_url}/api/approvals/{view.id}/1",
        json={"action": "decline"},
        headers=ann.headers(),
    )
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "completed"
    assert "declined" in response.json()["result"]
    assert [c.status for c in served.runtime.engine.view(view.id).calls] == ["declined"]
    assert writes_made(served) == []


def test_a_signed_out_or_forged_session_decides_nothing(served: Served) -> None:
    view = served.pause()
    ann = served.person()
    digest = ann.call(view.id, 1).json()["digest"]
    session_id = ann.cookie.split(".", 1)[0]
    for forged in (f"{session_id}.not-the-secret", "nonsense", ""):
        fake = Approver(ann.base_url, forged)
        try:
            assert_problem(fake.call(view.id, 1), 401, "sign_in_required")
            assert_problem(fake.decide(view.id, 1, digest=digest), 401, "sign_in_required")
        finally:
            fake.close()
    assert served.runtime.people.sign_out(session_id)
    assert_problem(ann.decide(view.id, 1, digest=digest), 401, "sign_in_required")
    assert served.status_of(view.id) == "waiting_for_interaction"
    assert decisions(served, view.id) == []


def test_nothing_the_database_holds_signs_a_person_in(served: Served) -> None:
    """A reader of the database (a leaked backup, a replica's user) finds no session cookie
    in it: each stored value of the sessions, alone or as the secret of a session's id,
    decides nothing. The cookie itself does."""
    view = served.pause()
    ann = served.person()
    digest = ann.call(view.id, 1).json()["digest"]
    with served.runtime.engine.store.engine.connect() as conn:
        rows = conn.execute(text("SELECT * FROM approver_sessions")).mappings().all()
    values = list(dict.fromkeys(str(v) for row in rows for v in row.values() if v is not None))
    session_id = ann.cookie.split(".", 1)[0]
    assert session_id in values  # the dump is of the real row
    tried = values + [f"{session_id}.{value}" for value in values]
    assert ann.cookie not in tried
    for cookie in tried:
        reader = Approver(ann.base_url, cookie)
        try:
            assert_problem(reader.decide(view.id, 1, digest=digest), 401, "sign_in_required")
        finally:
            reader.close()
    assert served.status_of(view.id) == "waiting_for_interaction"
    assert decisions(served, view.id) == []
    done = ann.decide(view.id, 1, digest=digest)
    assert done.status_code == 200 and done.json()["status"] == "completed", done.text


def test_cross_site_and_malformed_decisions_are_refused(served: Served) -> None:
    view = served.pause()
    ann = served.person()
    digest = ann.call(view.id, 1).json()["digest"]
    path = f"{ann.base_url}/api/approvals/{view.id}/1"
    good = {"action": "accept", "digest": digest}

    def post(headers: dict[str, str], **kwargs: Any) -> httpx2.Response:
        return ann.http.post(path, headers={**ann.cookies(), **headers}, **kwargs)

    with_csrf = {"X-CSRF-Token": ann.csrf}
    # A cross-site page: its Origin is not ours.
    for origin in ("https://evil.example", "null", f"{ann.base_url}.evil.example"):
        assert_problem(post({**JSON, **with_csrf, "Origin": origin}, json=good), 403, "forbidden")
    # What an HTML form can send (no preflight): refused before anything is decided.
    for content_type, data in (
        ("application/x-www-form-urlencoded", "action=accept"),
        ("multipart/form-data; boundary=x", "--x--"),
        ("text/plain", json.dumps(good)),
    ):
        assert_problem(post({**with_csrf, "Content-Type": content_type}, content=data), 415)
    # No CSRF token, or another session's.
    bea = served.person("Bea")
    for csrf in ({}, {"X-CSRF-Token": bea.csrf}, {"X-CSRF-Token": "forged"}):
        refused = post({**JSON, **csrf}, json=good)
        assert_problem(refused, 403, "forbidden")
    # Malformed bodies.
    for content in (
        "not json",
        '{"action": "launch"}',
        '{"action": "cancel", "digest": "' + digest + '"}',
        json.dumps({**good, "extra": 1}),
        json.dumps({**good, "digest": "short"}),
        json.dumps({**good, "door": "mcp"}),
        "[]",
    ):
        assert_problem(post({**JSON, **with_csrf}, content=content), 400, "invalid_input")
    big = json.dumps({**good, "grant": "x" * BODY_LIMIT})
    assert_problem(post({**JSON, **with_csrf}, content=big), 413)

    def chunked() -> Iterator[bytes]:  # no Content-Length: the limit holds while reading
        yield big.encode()

    assert_problem(post({**JSON, **with_csrf}, content=chunked()), 413)

    # None of that decided anything: the page's own request still does.
    assert served.status_of(view.id) == "waiting_for_interaction"
    assert decisions(served, view.id) == []
    ok = post(
        {
            **with_csrf,
            "Content-Type": "application/json; charset=utf-8",
            "Origin": ann.base_url,
        },
        json=good,
    )
    assert ok.status_code == 200 and ok.json()["status"] == "completed", ok.text


def test_the_key_s_api_refuses_malformed_requests(served: Served) -> None:
    view = served.pause()
    path = f"/api/executions/{view.id}/resume"
    for content_type, data in (
        ("application/x-www-form-urlencoded", "action=decline"),
        ("text/plain", '{"action": "decline"}'),
    ):
        headers = {**served.bearer(), "Content-Type": content_type}
        assert_problem(served.post(path, headers=headers, content=data), 415)
    for content in ("not json", '{"action": "launch"}', '{"action": "decline", "x": 1}', "[]"):
        refused = served.post(path, headers={**JSON, **served.bearer()}, content=content)
        assert_problem(refused, 400, "invalid_input")
    big = json.dumps({"action": "decline", "content": "x" * BODY_LIMIT})
    assert_problem(served.post(path, headers={**JSON, **served.bearer()}, content=big), 413)
    assert served.status_of(view.id) == "waiting_for_interaction"


def test_wrong_methods_and_paths_never_fail_with_500(served: Served) -> None:
    view = served.pause()
    ann = served.person()
    assert served.get(f"/api/executions/{view.id}/resume").status_code == 405
    assert served.post(f"/approve/{view.id}/1").status_code == 405
    assert served.request("DELETE", f"/api/executions/{view.id}").status_code == 405
    assert served.request("PUT", f"/api/approvals/{view.id}/1").status_code == 405
    assert served.get("/api/executions/").status_code == 404
    assert ann.get(f"/api/approvals/{view.id}/first").status_code == 404
    assert ann.get(f"/api/approvals/{view.id}").status_code == 404
    assert served.status_of(view.id) == "waiting_for_interaction"


# -- deadlines on the runtime's clock ----------------------------------------------------------


@dataclass
class Clock:
    """A clock the test moves: the runtime reads every time from it."""

    now: datetime

    def __call__(self) -> datetime:
        return self.now


def test_a_call_expires_on_the_runtime_clock(make_runtime: Callable[..., Runtime]) -> None:
    # A month behind the wall clock: by the wall clock the call's deadline is long past.
    clock = Clock(datetime.now(UTC) - timedelta(days=30))
    with serve(make_runtime, clock=clock, approval_ttl=timedelta(hours=1)) as served:
        answer = mcp_execute(served)
        execution_id, url = answer["executionId"], answer["interaction"]["approvalUrl"]
        deadline = datetime.fromisoformat(answer["expiresAt"])
        assert deadline == clock.now + timedelta(hours=1)
        ann = served.person()
        page = url.removeprefix(served.runtime.settings.base_url)

        # Just before the deadline on the runtime's clock, the call can be decided.
        clock.now = deadline - timedelta(seconds=1)
        assert ann.get(page).status_code == 200
        shown = ann.call(execution_id, 1).json()
        assert shown["waiting"] is True
        assert datetime.fromisoformat(shown["expiresAt"]) == deadline

        # At the deadline it has expired, whatever the wall clock says.
        clock.now = deadline
        assert_clear_page(ann.get(page), 410, "expired")
        assert_problem(ann.decide(execution_id, 1, digest=shown["digest"]), 410, "expired")
        assert served.status_of(execution_id) == "expired"
        assert decisions(served, execution_id) == [] and writes_made(served) == []


# -- a crash, and two people at once -----------------------------------------------------------


def test_a_crash_before_the_decision_commits_leaves_the_call_to_decide(
    make_runtime: Callable[..., Runtime],
) -> None:
    faults = Faults([APPROVED])
    with serve(make_runtime, faults=faults) as served:
        answer = mcp_execute(served)
        execution_id = answer["executionId"]
        ann = served.person()
        cookie = ann.cookie
        digest = ann.call(execution_id, 1).json()["digest"]
        # Ann clicks Approve; the process dies just before the decision commits (the answer
        # is whatever a dying server gives: not recorded as the app's).
        ann.http.post(
            f"{ann.base_url}/api/approvals/{execution_id}/1",
            json={"action": "accept", "digest": digest},
            headers=ann.headers(),
        )
        assert faults.fired == [APPROVED]

    with serve(make_runtime) as served:  # the restart
        assert served.status_of(execution_id) == "waiting_for_interaction"
        assert decisions(served, execution_id) == [] and writes_made(served) == []
        # Ann's session outlived the restart (it is a row): her next click decides, once.
        again = Approver(served.runtime.settings.base_url, cookie, "Ann")
        served.people.append(again)
        assert again.get(f"/approve/{execution_id}/1").status_code == 200
        done = again.decide(execution_id, 1, digest=digest)
        assert done.status_code == 200 and done.json()["status"] == "completed", done.text
        assert decisions(served, execution_id) == ["approve"]
        assert writes_made(served) == ["greeting"]
        assert_problem(again.decide(execution_id, 1, "decline", digest=digest), 409)
        assert_clear_page(again.get(f"/approve/{execution_id}/1"), 410, "already decided")


def test_two_people_deciding_at_once_decide_once(make_runtime: Callable[..., Runtime]) -> None:
    """Ann's Approve is held just before its decision commits; Bea's Decline goes through
    meanwhile. Only one of them decides; Ann is told the call was already settled."""
    faults = Faults()
    with serve(make_runtime, faults=faults) as served:
        view = served.pause()
        ann, bea = served.person("Ann"), served.person("Bea")
        digest = ann.call(view.id, 1).json()["digest"]
        gate = faults.gate(APPROVED)
        held: list[httpx2.Response] = []

        def approve() -> None:
            held.append(ann.decide(view.id, 1, "accept", digest=digest))

        click = threading.Thread(target=approve)
        click.start()
        try:
            assert gate.wait_until_held()
            declined = bea.decide(view.id, 1, "decline", digest=digest)
        finally:
            gate.open()
            click.join()
        [approved] = held
        assert declined.status_code == 200, declined.text
        assert_problem(approved, 409, "already_settled")
        assert "already recorded (decline)" in approved.json()["error"]["message"]
        assert decisions(served, view.id) == ["decline"]
        assert [c.status for c in served.runtime.engine.view(view.id).calls] == ["declined"]
        assert decision_of(served, view.id)["person"]["name"] == "Bea"
        assert writes_made(served) == []


# -- the links of earlier versions --------------------------------------------------------------


def test_migration_0014_drops_the_links_of_earlier_versions(database_url: str) -> None:
    """A live link of 0013 (a row that opened the page and decided) is gone after 0014,
    table and all, and the execution it was for is left as it was."""
    engine = open_engine(database_url)
    try:
        upgrade(engine)
        now = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
        SqlStore(engine).commit(
            [],
            [
                Execution(
                    id="e1",
                    principal_id=PRINCIPAL,
                    status="pending",
                    code="1",
                    created_at=now,
                    updated_at=now,
                )
            ],
        )
        downgrade(alembic_config(engine), "0013")
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO approval_tokens (id, execution_id, call_seq, principal_id, "
                    "created_at, expires_at, link) VALUES ('h1', 'e1', 1, 'alice', :now, "
                    ":later, 'e1:1:')"
                ),
                {
                    "now": now.replace(tzinfo=None),
                    "later": (now + timedelta(hours=1)).replace(tzinfo=None),
                },
            )
        upgrade(engine)
        with engine.connect() as conn:
            assert "approval_tokens" not in inspect(conn).get_table_names()
            rows = conn.execute(text("SELECT id, status FROM executions")).all()
        assert [tuple(r) for r in rows] == [("e1", "pending")]
    finally:
        engine.dispose()
