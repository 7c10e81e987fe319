"""The API behind the browser approval page over real HTTP, on SQLite and PostgreSQL:
GET /api/executions/{id} and POST /api/executions/{id}/resume, with an approval token or a
bearer key; accept and decline, a token deciding only its own call of its own execution,
expired tokens and executions, CSRF and malformed decisions, and wrong methods and paths,
none of them a server error. The page itself is in test_approval_page.

The app is the real one (`create_app`), served by uvicorn on a loopback port in a background
thread with its lifespan (see tests.support.approval_app); requests are real HTTP through
httpx2. Approval URLs are obtained the way clients get them: once through the MCP `execute`
tool, otherwise minted for a paused execution exactly as `ApprovalSurface.approval_url` does.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

from lockgate.machine.runtime import Runtime
from lockgate.server.keys import ApiKeys
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
    texts,
    token_of,
)
from tests.support.canary import CANARY
from tests.support.polling import wait_for as wait_until

pytest_plugins = ["tests.support.approval_app"]


# -- the API --------------------------------------------------------------------------------


def test_get_execution_with_the_token_or_a_bearer_key(served: Served) -> None:
    view = served.pause()
    token = served.mint(view)
    by_token = served.get(f"/api/executions/{view.id}", headers={"X-Approval-Token": token})
    by_key = served.get(f"/api/executions/{view.id}", headers=served.bearer())
    for response in (by_token, by_key):
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
    assert_problem(
        served.get("/api/executions/nope", headers={"X-Approval-Token": token}),
        403,
        "token_unknown",
    )


def test_accept_completes_the_execution_and_uses_the_token_up(served: Served) -> None:
    answer = mcp_execute(served)
    execution_id, token = answer["executionId"], token_of(answer["interaction"]["approvalUrl"])
    headers = {**JSON, "X-Approval-Token": token, "Origin": served.url}

    response = served.post(
        f"/api/executions/{execution_id}/resume", headers=headers, json={"action": "accept"}
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["status"] == "completed"
    assert body["result"] == {"wrote": {"key": "greeting", "written": True}}
    assert CANARY not in response.text
    view = served.runtime.engine.view(execution_id)
    assert view.status == "completed" and view.result == body["result"]
    assert [c.status for c in view.calls] == ["succeeded"]

    # The link is used up: a second decision, a read and the page all say so, clearly.
    again = served.post(
        f"/api/executions/{execution_id}/resume", headers=headers, json={"action": "accept"}
    )
    assert_problem(again, 410, "token_used")
    assert "already used" in again.json()["error"]["message"]
    assert_problem(
        served.get(f"/api/executions/{execution_id}", headers={"X-Approval-Token": token}),
        410,
        "token_used",
    )
    assert_clear_page(served.get(f"/approve/{token}"), 410, "already used")
    # The principal's key still reads the outcome.
    by_key = served.get(f"/api/executions/{execution_id}", headers=served.bearer())
    assert by_key.json()["status"] == "completed"
    assert by_key.json()["tool"] is None


def test_decline_refuses_the_call(served: Served) -> None:
    view = served.pause(
        'try:\n    tools.notes.write(key="k", text="v")\n    msg = "written"\n'
        "except PermissionError as e:\n    msg = str(e)\nmsg"
    )
    token = served.mint(view)
    response = served.post(
        f"/api/executions/{view.id}/resume",
        headers={**JSON, "X-Approval-Token": token},
        json={"action": "decline"},
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["status"] == "completed"
    assert "declined by the approver" in body["result"]
    after = served.runtime.engine.view(view.id)
    assert [c.status for c in after.calls] == ["declined"]
    notes = served.runtime.sources[0]
    assert notes.effects() == []  # type: ignore[attr-defined]
    assert_clear_page(served.get(f"/approve/{token}"), 410, "already used")


def test_resume_with_a_bearer_key(served: Served) -> None:
    view = served.pause('tools.notes.write(key="k", text="v")\n"done"')
    response = served.post(
        f"/api/executions/{view.id}/resume",
        headers={**JSON, **served.bearer()},
        json={"action": "accept"},
    )
    assert response.status_code == 200 and response.json()["result"] == "done"
    # A link minted before is for a call that is settled now: refused, clearly.
    late = served.mint(view)
    assert_clear_page(served.get(f"/approve/{late}"), 410, "already decided", "completed")
    assert_problem(
        served.post(
            f"/api/executions/{view.id}/resume",
            headers={**JSON, "X-Approval-Token": late},
            json={"action": "accept"},
        ),
        409,
        "already_settled",
    )


def test_a_token_decides_only_the_call_it_was_minted_for(served: Served) -> None:
    view = served.pause(TWO_WRITES)
    first = served.mint(view)
    spare = served.mint(view, spare=True)  # another link for the same first call, unused
    assert (
        served.post(
            f"/api/executions/{view.id}/resume",
            headers={**JSON, "X-Approval-Token": first},
            json={"action": "accept"},
        ).json()["status"]
        == "waiting_for_interaction"
    )
    second = served.runtime.engine.view(view.id)
    assert second.pending is not None and second.pending.seq == 2

    # The spare link was for call 1: it must not approve call 2, which nobody reviewed.
    refused = served.post(
        f"/api/executions/{view.id}/resume",
        headers={**JSON, "X-Approval-Token": spare},
        json={"action": "accept"},
    )
    assert_problem(refused, 409, "already_settled")
    assert served.status_of(view.id) == "waiting_for_interaction"
    assert_clear_page(served.get(f"/approve/{spare}"), 410, "already decided")

    # A link for call 2 shows call 2 and decides it.
    page = texts(served.get(f"/approve/{served.mint(second)}").text)
    assert json.loads(page.by_id["args"]) == {"key": "second", "text": "two"}


def test_expired_token(served: Served) -> None:
    view = served.pause()
    past = datetime.now(UTC) - timedelta(minutes=1)
    token = served.mint(view, expires_at=past)
    assert_clear_page(served.get(f"/approve/{token}"), 410, "expired")
    assert_problem(
        served.post(
            f"/api/executions/{view.id}/resume",
            headers={**JSON, "X-Approval-Token": token},
            json={"action": "accept"},
        ),
        410,
        "token_expired",
    )
    assert_problem(
        served.get(f"/api/executions/{view.id}", headers={"X-Approval-Token": token}),
        410,
        "token_expired",
    )
    assert served.status_of(view.id) == "waiting_for_interaction"


def test_expired_execution_page(make_runtime: Callable[..., Runtime]) -> None:
    with serve(make_runtime, approval_ttl=timedelta(seconds=1)) as served:
        view = served.pause()
        assert view.pending is not None and view.pending.deadline is not None
        deadline = view.pending.deadline
        # A link that outlives its execution's deadline (e.g. minted by an older version).
        token = served.mint(view, expires_at=datetime.now(UTC) + timedelta(hours=1))
        wait_until(lambda: datetime.now(UTC) > deadline, "the deadline")
        assert_clear_page(served.get(f"/approve/{token}"), 410, "expired")
        assert served.status_of(view.id) == "expired"
        assert_problem(
            served.post(
                f"/api/executions/{view.id}/resume",
                headers={**JSON, "X-Approval-Token": token},
                json={"action": "accept"},
            ),
            410,
            "expired",
        )


def test_a_token_of_one_execution_is_refused_on_another(served: Served) -> None:
    a, b = served.pause(), served.pause()
    token_a = served.mint(a)
    headers = {**JSON, "X-Approval-Token": token_a}
    assert_problem(served.get(f"/api/executions/{b.id}", headers=headers), 403, "token_unknown")
    assert_problem(
        served.post(f"/api/executions/{b.id}/resume", headers=headers, json={"action": "accept"}),
        403,
        "token_unknown",
    )
    assert served.status_of(b.id) == "waiting_for_interaction"
    # Refused elsewhere, still good at home.
    ok = served.post(f"/api/executions/{a.id}/resume", headers=headers, json={"action": "accept"})
    assert ok.status_code == 200 and ok.json()["status"] == "completed"


def test_csrf_and_malformed_decisions_are_refused(served: Served) -> None:
    view = served.pause()
    token = served.mint(view)
    path = f"/api/executions/{view.id}/resume"
    with_token = {"X-Approval-Token": token}

    # A cross-site page: its Origin is not ours.
    for origin in ("https://evil.example", "null", f"{served.url}.evil.example"):
        assert_problem(
            served.post(
                path, headers={**JSON, **with_token, "Origin": origin}, json={"action": "accept"}
            ),
            403,
            "forbidden",
        )
    # What an HTML form can send (no preflight): refused before anything is decided.
    for content_type, data in (
        ("application/x-www-form-urlencoded", "action=accept"),
        ("multipart/form-data; boundary=x", "--x--"),
        ("text/plain", '{"action": "accept"}'),
    ):
        assert_problem(
            served.post(path, headers={**with_token, "Content-Type": content_type}, content=data),
            415,
        )
    # No credential at all, or a bad one.
    assert_problem(served.post(path, headers=JSON, json={"action": "accept"}), 401)
    assert_problem(
        served.post(
            path, headers={**JSON, "X-Approval-Token": "forged"}, json={"action": "accept"}
        ),
        403,
    )
    # Malformed bodies.
    for content in ("not json", '{"action": "launch"}', '{"action": "accept", "extra": 1}', "[]"):
        assert_problem(
            served.post(path, headers={**JSON, **with_token}, content=content), 400, "invalid_input"
        )
    big = json.dumps({"action": "accept", "content": "x" * BODY_LIMIT})
    assert_problem(served.post(path, headers={**JSON, **with_token}, content=big), 413)

    def chunked() -> Iterator[bytes]:  # no Content-Length: the limit holds while reading
        yield big.encode()

    assert_problem(served.post(path, headers={**JSON, **with_token}, content=chunked()), 413)

    # None of that decided anything or used the link up: it still works, from our origin.
    assert served.status_of(view.id) == "waiting_for_interaction"
    ok = served.post(
        path,
        headers={
            **with_token,
            "Content-Type": "application/json; charset=utf-8",
            "Origin": served.url,
        },
        json={"action": "accept"},
    )
    assert ok.status_code == 200 and ok.json()["status"] == "completed"


def test_wrong_methods_and_paths_never_fail_with_500(served: Served) -> None:
    view = served.pause()
    assert served.get(f"/api/executions/{view.id}/resume").status_code == 405
    assert served.post(f"/approve/{served.mint(view)}").status_code == 405
    assert served.request("DELETE", f"/api/executions/{view.id}").status_code == 405
    assert served.get("/api/executions/").status_code == 404
