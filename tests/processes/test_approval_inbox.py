"""The approvals inbox, for a signed-in person: every call waiting on the principals they
approve for, newest first, with tool, arguments, code, who asked and time left; approve or
decline from the list (a call too long to show there whole is decided on its page); the
decisions made lately, naming who made them. In headless Chromium, and as JSON
(`GET /api/approvals`).

Two principals and three people: Ann approves alice's calls, Bea bob's, Cy both. Nobody's
inbox shows a call of a principal they do not approve for. An API key, the agent's, lists
nothing: it gets a refusal that says a person must sign in.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from lockgate.machine.runtime import Runtime
from lockgate.server.approval_inbox import SHOWN_WHOLE_BYTES
from tests.support.approval_app import PRINCIPAL, Served, assert_problem, serve
from tests.support.chromium import WAIT_MS, chromium, open_page

pytestmark = pytest.mark.slow


def note(key: str, text: str = "from the inbox test") -> str:
    return f"tools.notes.write(key={key!r}, text={text!r})"


@pytest.fixture
def served(make_runtime: Callable[..., Runtime]) -> Iterator[Served]:
    """The app in approval mode `browser`: only a person accepts."""
    with serve(make_runtime, approval_mode="browser") as s:
        yield s


@pytest.fixture
def browser() -> Iterator[Any]:
    with chromium() as found:
        yield found


def listed(response: Any) -> list[str]:
    assert response.status_code == 200, response.text
    return [w["executionId"] for w in response.json()["waiting"]]


def test_a_person_s_inbox_lists_only_their_principals_calls_newest_first(
    served: Served,
) -> None:
    first = served.pause(note("older"))
    second = served.pause(note("newer"))
    bobs = served.pause(note("bobs"), principal="bob")
    ann = served.person("Ann")
    bea = served.person("Bea", principals=("bob",))
    cy = served.person("Cy", principals=(PRINCIPAL, "bob"))

    response = ann.inbox()
    assert response.status_code == 200, response.text
    assert response.headers["cache-control"] == "no-store"
    body = response.json()
    assert (body["approver"], body["principals"]) == ("Ann", [PRINCIPAL])
    assert [w["executionId"] for w in body["waiting"]] == [second.id, first.id]
    newest = body["waiting"][0]
    assert newest["tool"] == "tools.notes.write"
    assert newest["arguments"] == {"key": "newer", "text": "from the inbox test"}
    assert newest["requestedBy"] == PRINCIPAL and newest["expiresAt"]
    assert newest["code"] == note("newer")
    assert newest["shownWhole"] is True and newest["call"] == 1
    # What the page of the call shows, and the digest a decision from the list names.
    assert newest["pageUrl"] == f"{served.runtime.settings.base_url}/approve/{second.id}/1"
    assert newest["digest"] == ann.call(second.id, 1).json()["digest"]
    assert newest["decideUrl"] == f"/api/approvals/{second.id}/1"
    assert body["decided"] == []

    assert listed(bea.inbox()) == [bobs.id]
    assert listed(cy.inbox()) == [bobs.id, second.id, first.id]

    # A decision from the list leaves it for the history, naming the person and the door.
    decided = ann.decide(second.id, 1, "decline", digest=newest["digest"], door="inbox")
    assert decided.status_code == 200, decided.text
    after = ann.inbox().json()
    assert [w["executionId"] for w in after["waiting"]] == [first.id]
    [past] = after["decided"]
    assert (past["executionId"], past["principal"], past["action"], past["door"]) == (
        second.id,
        PRINCIPAL,
        "decline",
        "inbox",
    )
    assert past["person"]["name"] == "Ann" and past["person"]["signedInWith"] == "passkey"
    assert bea.inbox().json()["decided"] == []  # alice's decisions are not bob's approver's
    assert [p["executionId"] for p in cy.inbox().json()["decided"]] == [second.id]


def test_a_key_or_a_link_lists_nothing(served: Served) -> None:
    view = served.pause(note("hidden"))
    for headers in ({}, served.bearer()):
        refused = served.get("/api/approvals", headers=headers)
        assert_problem(refused, 401, "sign_in_required")
        assert "/signin" in refused.json()["error"]["hint"]
        page = served.get("/approvals", headers=headers)
        assert page.status_code == 303
        assert page.headers["location"] == "/signin?next=%2Fapprovals"
    link = served.get("/api/approvals", headers={"X-Approval-Token": view.id})
    assert_problem(link, 401, "unauthorized")
    assert "hidden" not in link.text
    # A person's inbox answers, also with a key beside the cookie (the key adds nothing).
    ann = served.person()
    both = ann.get("/api/approvals", headers=served.bearer())
    assert listed(both) == [view.id]


def test_a_call_too_long_for_the_list_is_decided_on_its_page(served: Served) -> None:
    long = served.pause(note("long", "x" * (SHOWN_WHOLE_BYTES + 1)))
    short = served.pause(note("short"))
    ann = served.person()
    items = {w["executionId"]: w for w in ann.inbox().json()["waiting"]}
    assert items[short.id]["shownWhole"] is True
    item = items[long.id]
    assert item["shownWhole"] is False
    assert "arguments" not in item and "code" not in item and "digest" not in item
    assert item["pageUrl"].endswith(f"/approve/{long.id}/1")
    # Its page shows it whole, with the digest to decide it by.
    assert ann.get(f"/approve/{long.id}/1").status_code == 200
    assert ann.decide(long.id, 1).json()["status"] == "completed"


def test_approve_from_the_inbox_in_chromium(browser: Any, served: Served) -> None:
    older = served.pause(note("inbox-older"))
    newer = served.pause(note("inbox-newer"))
    served.pause(note("bobs"), principal="bob")
    ann = served.person("Ann")

    context, page, problems = open_page(
        browser, served.runtime.settings.base_url + "/approvals", ann
    )
    try:
        assert page.inner_text("#person-name") == "Ann"
        page.wait_for_selector("article.call", timeout=WAIT_MS)
        cards = page.query_selector_all("article.call")
        assert [c.get_attribute("data-execution") for c in cards] == [newer.id, older.id]
        first = cards[0]
        assert first.query_selector(".tool").inner_text() == "tools.notes.write"
        args = json.loads(first.query_selector(".args").inner_text())
        assert args == {"key": "inbox-newer", "text": "from the inbox test"}
        assert first.query_selector(".code").inner_text() == note("inbox-newer")
        assert "min left" in first.query_selector(".muted").inner_text()

        first.query_selector("button.approve").click()
        page.wait_for_selector("#status:has-text('Approved')", timeout=WAIT_MS)
        page.wait_for_function(
            "document.querySelectorAll('article.call').length === 1", timeout=WAIT_MS
        )
        decided = page.inner_text("#decided")
        assert decided.count("accept tools.notes.write for alice by Ann (inbox)") == 1
        assert problems == [], problems
    finally:
        context.close()

    assert served.status_of(newer.id) == "completed"
    assert served.status_of(older.id) == "waiting_for_interaction"
    call = served.runtime.engine.store.tool_calls.last_decided(newer.id)
    assert call is not None and isinstance(call.decision, dict)
    assert call.decision["door"] == "inbox"
