"""The approval page at /approve/{execution}/{call} over real HTTP, on SQLite and PostgreSQL.

The URL a waiting answer carries names the call and authorises nothing: every answer that
shows the call gives the same one, and opening it without a signed-in person leads to the
sign-in page. A signed-in approver of the call's principal is shown the call whole (tool,
every argument, the code, who asked, until when, the digest a decision must name), markup
escaped, with the headers that keep it private; anyone else, a call that is over, or a link
of an earlier version, gets a short page saying so. The API behind it is in
test_approval_api, the page in a real browser in test_approval_browser.

The app is the real one (`create_app`), served by uvicorn on a loopback port in a background
thread with its lifespan (boot recovery, drain, close; see tests.support.approval_app);
requests are real HTTP through httpx2, a person's with their session cookie
(`tests.support.people.Approver`) at the server's name for links (`localhost`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any
from urllib.parse import quote

import anyio
import httpx2
import pytest

from lockgate.machine.runtime import Runtime
from tests.support.approval_app import (
    BODY_LIMIT,
    PRINCIPAL,
    TWO_WRITES,
    WRITE_NOTE,
    Served,
    assert_clear_page,
    mcp_execute,
    serve,
    texts,
)
from tests.support.canary import CANARY
from tests.support.people import Approver


@pytest.fixture
def served(make_runtime: Callable[..., Runtime]) -> Iterator[Served]:
    """The app in approval mode `browser`: only a person accepts."""
    with serve(make_runtime, max_request_bytes=BODY_LIMIT, approval_mode="browser") as s:
        yield s


async def _mcp_calls(url: str, key: str, calls: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    from mcp.client import Client
    from mcp.client.streamable_http import streamable_http_client

    answers: list[Any] = []
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=30.0) as http,
        Client(streamable_http_client(f"{url}/mcp", http_client=http), mode="legacy") as client,
    ):
        for name, arguments in calls:
            result = await client.call_tool(name, arguments)
            assert not result.is_error, result
            assert result.structured_content is not None
            answers.append(dict(result.structured_content))
    return answers


def mcp_calls(served: Served, *calls: tuple[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Tool calls in one real MCP client session, as an agent's client makes them."""
    return anyio.run(_mcp_calls, served.url, served.key, list(calls))


def look_again(served: Served, execution_id: str) -> str:
    """The approval URL of `resume` without an action, in a session of its own."""
    [answer] = mcp_calls(served, ("resume", {"executionId": execution_id}))
    return str(answer["interaction"]["approvalUrl"])


def page_of(person: Approver, execution_id: str, call: int = 1) -> httpx2.Response:
    return person.get(f"/approve/{execution_id}/{call}")


# -- the URL: it names a call ----------------------------------------------------------------


def test_the_url_names_the_call_and_leads_a_stranger_to_sign_in(served: Served) -> None:
    answer = mcp_execute(served)
    assert answer["status"] == "waiting_for_interaction"
    execution_id, url = answer["executionId"], answer["interaction"]["approvalUrl"]
    base = served.runtime.settings.base_url
    assert base.startswith("http://localhost:")  # a passkey needs a host name, not an IP
    assert url == f"{base}/approve/{execution_id}/1"

    # Nobody signed in: the page is not shown, whatever else the request carries.
    with httpx2.Client(timeout=30.0) as browser:
        for headers in ({}, served.bearer(), {"X-Approval-Token": execution_id}):
            opened = browser.get(url, headers=headers)
            assert opened.status_code == 303, opened.text
            assert opened.headers["location"] == (
                f"/signin?next={quote(f'/approve/{execution_id}/1', safe='')}"
            )
            assert "hello there" not in opened.text
        signin = browser.get(f"{base}{opened.headers['location']}")
        assert signin.status_code == 200 and signin.headers["content-type"].startswith("text/html")
    assert served.status_of(execution_id) == "waiting_for_interaction"


def test_every_answer_showing_a_waiting_call_gives_the_same_url(served: Served) -> None:
    [first] = mcp_calls(served, ("execute", {"code": TWO_WRITES}))
    execution_id, url = first["executionId"], first["interaction"]["approvalUrl"]
    # The client asks again, twice (`resume` without an action): the same URL.
    answers = mcp_calls(
        served, ("resume", {"executionId": execution_id}), ("resume", {"executionId": execution_id})
    )
    assert {a["interaction"]["approvalUrl"] for a in answers} == {url}
    # Another session of the same client, later: still the same.
    assert look_again(served, execution_id) == url

    # Once the call is decided, the next call has a URL of its own, just as stable.
    ann = served.person()
    assert ann.approve(url).json()["status"] == "waiting_for_interaction"
    second = look_again(served, execution_id)
    assert second == url.removesuffix("/1") + "/2"
    assert look_again(served, execution_id) == second
    assert json.loads(texts(page_of(ann, execution_id, 2).text).by_id["args"]) == {
        "key": "second",
        "text": "two",
    }


# -- the page, for a signed-in approver ---------------------------------------------------------


def test_the_page_shows_the_whole_call_to_a_signed_in_approver(served: Served) -> None:
    answer = mcp_execute(served)
    execution_id, url = answer["executionId"], answer["interaction"]["approvalUrl"]
    ann = served.person("Ann")
    response = ann.get(url.removeprefix(ann.base_url))
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/html")
    found = texts(response.text)
    assert found.by_id["tool"] == "tools.notes.write"
    assert json.loads(found.by_id["args"]) == {"key": "greeting", "text": "hello there"}
    assert found.by_id["code"] == WRITE_NOTE
    assert found.by_id["who"] == PRINCIPAL
    assert found.by_id["person-name"] == "Ann"
    expires = datetime.fromisoformat(answer["expiresAt"])
    assert found.by_id["expires"] == expires.strftime("%Y-%m-%d %H:%M:%S UTC")
    # The digest a decision must name is the one of the call as the API shows it.
    shown = ann.call(execution_id, 1).json()
    assert found.by_id["digest"] == shown["digest"]
    assert f'datetime="{shown["expiresAt"]}"' in response.text
    assert datetime.fromisoformat(shown["expiresAt"]) == expires
    assert [b.strip() for b in found.buttons] == ["Sign out", "Approve", "Decline"]
    # What the page's script sends with: the CSRF token, never the cookie (HttpOnly).
    data = json.loads(found.by_id["data"])
    assert data["csrf"] == ann.csrf and data["digest"] == shown["digest"]
    assert data["decideUrl"] == f"/api/approvals/{execution_id}/1"
    assert ann.cookie not in response.text and ann.cookie.split(".")[1] not in response.text
    # Not cacheable, not frameable, no Referer, scripts by nonce only.
    headers = response.headers
    assert headers["cache-control"] == "no-store"
    assert headers["x-frame-options"] == "DENY"
    assert headers["referrer-policy"] == "no-referrer"
    csp = headers["content-security-policy"]
    assert "frame-ancestors 'none'" in csp and "script-src 'nonce-" in csp
    assert "form-action 'none'" in csp
    assert CANARY not in response.text
    # Opening the page decides nothing (link previews must not either).
    assert page_of(ann, execution_id).status_code == 200
    assert served.status_of(execution_id) == "waiting_for_interaction"


def test_long_code_and_arguments_are_shown_whole(served: Served) -> None:
    filler = "\n".join(f"x{i} = {i}" for i in range(600))
    text = "a long note " * 800
    code = f"{filler}\ntools.notes.write(key='long', text={text!r})"
    view = served.pause(code)
    ann = served.person()
    found = texts(page_of(ann, view.id).text).by_id
    # All of it: a person approves nothing they were not shown.
    assert found["code"] == code
    assert json.loads(found["args"]) == {"key": "long", "text": text}
    size = len(json.dumps({"key": "long", "text": text}).encode())
    assert found["args-size"].startswith(f"{size} bytes")
    # The principal's own API keeps to an excerpt of the code.
    by_key = served.get(f"/api/executions/{view.id}", headers=served.bearer()).json()
    assert by_key["code"].startswith("x0 = 0\n") and "more characters)" in by_key["code"]


def test_markup_in_code_and_arguments_is_escaped(served: Served) -> None:
    evil = "</script><script>alert(1)</script><img src=x onerror=alert(2)>"
    code = f"text = {evil!r}\n# {evil}\ntools.notes.write(key={evil!r}, text=text)"
    view = served.pause(code)
    ann = served.person()
    page = page_of(ann, view.id).text
    assert "<script>alert" not in page and "<img src=x" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    found = texts(page)
    assert json.loads(found.by_id["args"]) == {"key": evil, "text": evil}
    assert evil in found.by_id["code"]
    # Exactly two script elements: the JSON data block and the page's own (nonced) code.
    assert page.count("<script") == 2
    data = json.loads(found.by_id["data"])
    assert data["arguments"] == {"key": evil, "text": evil} and data["code"] == code


# -- the pages that say no ---------------------------------------------------------------------


def test_a_person_who_does_not_approve_for_the_principal_is_told_so(served: Served) -> None:
    view = served.pause()
    bea = served.person("Bea", principals=("bob",))
    page = assert_clear_page(page_of(bea, view.id), 403, "cannot decide", "Bea", PRINCIPAL)
    assert "hello there" not in page and WRITE_NOTE not in page
    assert_clear_page(page_of(bea, "0" * 32), 404, "No such call")
    ann = served.person("Ann")
    assert_clear_page(page_of(ann, view.id, 2), 404, "No such call")
    assert served.status_of(view.id) == "waiting_for_interaction"


def test_a_decided_call_s_page_says_it_was_decided(served: Served) -> None:
    view = served.pause(TWO_WRITES)
    ann = served.person()
    assert ann.decide(view.id, 1).json()["status"] == "waiting_for_interaction"
    assert_clear_page(page_of(ann, view.id, 1), 410, "already decided", "another approval")
    assert page_of(ann, view.id, 2).status_code == 200
    # The agent gives the second call up: its page says the execution ended.
    declined = served.post(
        f"/api/executions/{view.id}/resume",
        headers={**served.bearer(), "Content-Type": "application/json"},
        json={"action": "decline"},
    )
    assert declined.status_code == 200, declined.text
    assert_clear_page(page_of(ann, view.id, 2), 410, "already decided", "finished with an error")


def test_a_signed_out_person_is_sent_to_sign_in_again(served: Served) -> None:
    view = served.pause()
    ann = served.person()
    assert page_of(ann, view.id).status_code == 200
    assert served.runtime.people.sign_out(ann.cookie.split(".", 1)[0])
    again = page_of(ann, view.id)
    assert again.status_code == 303 and again.headers["location"].startswith("/signin?next=")


def test_links_of_earlier_versions_answer_a_notice(served: Served) -> None:
    ann = served.person()
    for token in ("not-a-real-token", "A" * 43, "%3Cscript%3E"):
        for who in (served, ann):
            page = assert_clear_page(who.get(f"/approve/{token}"), 404, "earlier version")
            assert "<script>" not in page and token not in page
    assert served.get("/approve/").status_code == 404
