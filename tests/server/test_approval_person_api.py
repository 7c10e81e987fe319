"""A signed-in person on the approval API over real HTTP, on SQLite and PostgreSQL: GET|POST
/api/approvals/{execution}/{call}, the page's own API.

A person decides: one who signed in, approves for the call's principal, sends the decision
as JSON from the page's origin with its CSRF token, and names the digest of the call exactly
as shown; a decision for another call than the one waiting decides nothing. A forged or
signed-out session decides nothing, and nothing the database holds signs anyone in. Calls
expire on the runtime's clock; a crash before a decision commits leaves the call to decide
again, and two people deciding at once decide it once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import httpx2
from alembic.command import downgrade
from sqlalchemy import inspect, text

from lockgate.machine.db.connect import open_engine
from lockgate.machine.db.migrate import alembic_config, upgrade
from lockgate.machine.db.schema import Execution
from lockgate.machine.db.store import SqlStore
from lockgate.machine.faults import Faults
from lockgate.machine.runtime import Runtime
from tests.support.approval_api import (
    APPROVED,
    CAUGHT,
    decision_of,
    decisions,
    served_fixture,  # noqa: F401  (fixture)
    writes_made,
)
from tests.support.approval_app import (
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
from tests.support.people import Approver

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
