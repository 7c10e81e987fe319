"""The approval API over real HTTP, on SQLite and PostgreSQL: the principal's key on
GET /api/executions/{id} and POST /api/executions/{id}/resume.

A key is the agent's: it reads its own executions and gives up its own calls (decline,
cancel), and accepts only in approval mode `model`. Nothing an agent holds decides its call
in mode `browser`: not the key, not the approval URL, not its parts sent as the old link
header; a person does (test_approval_person_api). Refusals are JSON problems with a stable
code, never a trace. The page itself is in test_approval_page, the inbox in
test_approval_inbox.

The app is the real one (`create_app`), served by uvicorn on a loopback port in a background
thread with its lifespan (see tests.support.approval_app); requests are real HTTP through
httpx2, a person's as `tests.support.people.Approver` sends them (the page's own requests).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import httpx2

from lockgate.machine.runtime import Runtime
from lockgate.server.call_shown import call_shown
from lockgate.server.keys import ApiKeys
from tests.support.approval_api import (
    CAUGHT,
    decision_of,
    decisions,
    key_resume,
    served_fixture,  # noqa: F401  (fixture)
    writes_made,
)
from tests.support.approval_app import (
    BODY_LIMIT,
    JSON,
    PRINCIPAL,
    WRITE_NOTE,
    Served,
    assert_clear_page,
    assert_problem,
    mcp_execute,
    serve,
)
from tests.support.canary import CANARY
from tests.support.people import call_of

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
