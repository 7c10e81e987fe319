"""The approvals inbox: every call waiting for the signed-in principal, newest first, with
tool, arguments, a code excerpt, who asked and time left; approve or decline from the list;
the decisions made lately. In headless Chromium, and as JSON (`GET /api/approvals`).

Two principals: alice's inbox never shows bob's calls, nor his key hers.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from lockgate.machine.runtime import Runtime
from lockgate.server.keys import ApiKeys
from tests.support.approval_app import PRINCIPAL, Served, serve
from tests.test_approval_browser import WAIT_MS, browser, open_page  # noqa: F401 - fixture

pytestmark = pytest.mark.slow


def note(key: str) -> str:
    return f'tools.notes.write(key="{key}", text="from the inbox test")'


@pytest.fixture
def served(make_runtime: Callable[..., Runtime]) -> Iterator[Served]:
    with serve(make_runtime) as s:
        yield s


def test_the_api_lists_only_the_key_s_own_waiting_calls_newest_first(served: Served) -> None:
    first = served.pause(note("older"))
    second = served.pause(note("newer"))
    bob_key = ApiKeys(served.runtime.engine.store).create("bob").secret
    bobs = served.pause(note("bobs"), principal="bob")

    listed = served.get("/api/approvals", headers=served.bearer())
    assert listed.status_code == 200, listed.text
    body = listed.json()
    assert body["principal"] == PRINCIPAL
    assert [w["executionId"] for w in body["waiting"]] == [second.id, first.id]
    newest = body["waiting"][0]
    assert newest["tool"] == "tools.notes.write"
    assert newest["argsPreview"] == {"key": "newer", "text": "from the inbox test"}
    assert newest["requestedBy"] == PRINCIPAL and newest["expiresAt"]
    assert 'key="newer"' in newest["code"]
    assert newest["approvalUrl"].endswith(newest["token"])
    assert body["decided"] == []

    theirs = served.get("/api/approvals", headers=served.bearer(bob_key)).json()
    assert [w["executionId"] for w in theirs["waiting"]] == [bobs.id]

    # A decision leaves the list for the history, with its audit record.
    decided = served.post(
        f"/api/executions/{second.id}/resume",
        headers={"X-Approval-Token": newest["token"], "Origin": served.url},
        json={"action": "decline"},
    )
    assert decided.status_code == 200, decided.text
    after = served.get("/api/approvals", headers=served.bearer()).json()
    assert [w["executionId"] for w in after["waiting"]] == [first.id]
    [past] = after["decided"]
    assert (past["executionId"], past["action"], past["door"]) == (
        second.id,
        "decline",
        "approval_page",
    )

    assert served.get("/api/approvals").status_code == 401
    link = served.get("/api/approvals", headers={"X-Approval-Token": newest["token"]})
    assert link.status_code == 401  # a link decides one call; it lists nothing


def test_approve_from_the_inbox_in_chromium(browser: Any, served: Served) -> None:  # noqa: F811
    older = served.pause(note("inbox-older"))
    newer = served.pause(note("inbox-newer"))
    served.pause(note("bobs"), principal="bob")

    context, page, problems = open_page(browser, served.url + "/approvals")
    try:
        page.fill("#key", served.key)
        page.click("#open")
        page.wait_for_selector("article.call", timeout=WAIT_MS)
        cards = page.query_selector_all("article.call")
        assert [c.get_attribute("data-execution") for c in cards] == [newer.id, older.id]
        first = cards[0]
        assert first.query_selector(".tool").inner_text() == "tools.notes.write"
        args = json.loads(first.query_selector(".args").inner_text())
        assert args == {"key": "inbox-newer", "text": "from the inbox test"}
        assert "min left" in first.query_selector(".muted").inner_text()

        first.query_selector("button.approve").click()
        page.wait_for_selector("#status:has-text('Approved')", timeout=WAIT_MS)
        page.wait_for_function(
            "document.querySelectorAll('article.call').length === 1", timeout=WAIT_MS
        )
        assert page.inner_text("#decided").count("accept tools.notes.write") == 1
        assert problems == [], problems
    finally:
        context.close()

    assert served.status_of(newer.id) == "completed"
    assert served.status_of(older.id) == "waiting_for_interaction"
