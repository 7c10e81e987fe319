"""The approval page in a real browser: Debian's headless Chromium, driven by playwright.

An agent's client runs code through the MCP `execute` tool; the call pauses for approval and
the answer carries an approval URL, which names the call. Opened by nobody in particular it
leads to the sign-in page. A person who signed in (their session cookie in the browser, set
for the server's name for links, `localhost`) opens it, reads what will run, and clicks
Approve (or Decline); the execution then completes (or the code is told the call was
refused), and the audit names that person. The browser is /usr/bin/chromium, never one
playwright downloads.
"""

from __future__ import annotations

import concurrent.futures
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from lockgate.machine.runtime import Runtime
from tests.support.approval_app import PRINCIPAL, WRITE_NOTE, Served, mcp_execute, serve
from tests.support.canary import CANARY
from tests.support.chromium import WAIT_MS, chromium, open_page

pytestmark = pytest.mark.slow

SCREENSHOT = Path("/tmp/lockgate-approval-page.png")


@pytest.fixture
def browser() -> Iterator[Any]:
    with chromium() as found:
        yield found


@pytest.fixture
def served(make_runtime: Callable[..., Runtime]) -> Iterator[Served]:
    """The app in approval mode `browser`: only a person accepts."""
    with serve(make_runtime, approval_mode="browser") as s:
        yield s


def paused_through_mcp(served: Served, code: str) -> dict[str, Any]:
    """`execute` through a real MCP client, in its own thread: playwright's sync API owns
    this thread's event loop."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        answer = pool.submit(mcp_execute, served, code).result(timeout=60)
    assert answer["status"] == "waiting_for_interaction", answer
    return answer


def test_without_a_session_the_url_leads_to_sign_in(browser: Any, served: Served) -> None:
    answer = paused_through_mcp(served, WRITE_NOTE)
    execution_id, url = answer["executionId"], answer["interaction"]["approvalUrl"]
    assert url.startswith("http://localhost:")
    context, page, problems = open_page(browser, url)
    try:
        assert page.url.startswith(f"{served.runtime.settings.base_url}/signin?next=")
        assert f"/approve/{execution_id}/1" in page.url.replace("%2F", "/")
        content = page.content()
        assert "hello there" not in content and "Approve" not in page.title()
        assert page.query_selector("#approve") is None
        assert problems == [], problems
    finally:
        context.close()
    assert served.status_of(execution_id) == "waiting_for_interaction"


def test_approve_in_chromium_completes_the_execution(browser: Any, served: Served) -> None:
    answer = paused_through_mcp(served, WRITE_NOTE)
    execution_id, url = answer["executionId"], answer["interaction"]["approvalUrl"]
    ann = served.person("Ann")

    context, page, problems = open_page(browser, url, ann)
    try:
        assert page.url == url
        assert page.title().startswith("Approve tools.notes.write?")
        assert page.inner_text("#tool") == "tools.notes.write"
        assert json.loads(page.inner_text("#args")) == {"key": "greeting", "text": "hello there"}
        assert page.inner_text("#who") == PRINCIPAL
        assert page.inner_text("#person-name") == "Ann"
        assert page.inner_text("#code") == WRITE_NOTE
        assert re.fullmatch(r"[0-9a-f]{64}", page.inner_text("#digest"))
        # The page's script ran (the CSP lets its nonced script through): a relative expiry.
        assert re.fullmatch(r"\S+ \S+ UTC \(in 23 h 5\d min\)", page.inner_text("#expires"))
        # The session cookie is HttpOnly: the page's own script cannot read it.
        assert page.evaluate("document.cookie") == ""
        assert page.is_enabled("#approve") and page.is_enabled("#decline")
        assert CANARY not in page.content() and ann.cookie not in page.content()
        page.screenshot(path=str(SCREENSHOT), full_page=True)

        page.click("#approve")
        page.wait_for_selector("#outcome:has-text('completed')", timeout=WAIT_MS)
        assert page.inner_text("#outcome") == "Approved. The execution completed."
        assert json.loads(page.inner_text("#result")) == {
            "wrote": {"key": "greeting", "written": True}
        }
        assert page.is_disabled("#approve") and page.is_disabled("#decline")
        page.screenshot(path=str(SCREENSHOT.with_suffix(".done.png")), full_page=True)
        assert problems == [], problems  # no script error, no CSP violation, no failed fetch

        # Reloading the page of the decided call says so, plainly.
        again = page.reload(wait_until="load", timeout=WAIT_MS)
        assert again is not None and again.status == 410
        assert "already decided" in page.inner_text("#title")
    finally:
        context.close()

    # The execution completed, as its principal sees it through the API and the engine.
    api = served.get(f"/api/executions/{execution_id}", headers=served.bearer())
    assert api.status_code == 200
    assert api.json()["status"] == "completed"
    view = served.runtime.engine.view(execution_id)
    assert view.status == "completed"
    assert view.result == {"wrote": {"key": "greeting", "written": True}}
    assert [c.status for c in view.calls] == ["succeeded"]
    effects = served.runtime.sources[0].effects()  # type: ignore[attr-defined]
    assert [e.get("tool") for e in effects] == ["notes.write"]
    # Ann decided it, on the page.
    call = served.runtime.engine.store.tool_calls.last_decided(execution_id)
    assert call is not None and isinstance(call.decision, dict)
    person = call.decision["person"]
    assert isinstance(person, dict)
    assert (call.decision["door"], person["name"]) == ("approval_page", "Ann")


def test_decline_in_chromium_refuses_the_call(browser: Any, served: Served) -> None:
    answer = paused_through_mcp(served, WRITE_NOTE)
    execution_id, url = answer["executionId"], answer["interaction"]["approvalUrl"]

    context, page, problems = open_page(browser, url, served.person())
    try:
        assert page.inner_text("#tool") == "tools.notes.write"
        page.click("#decline")
        page.wait_for_selector("#outcome:has-text('Declined')", timeout=WAIT_MS)
        outcome = page.inner_text("#outcome")
        assert outcome.startswith("Declined: the call was not made.")
        assert "declined by the approver" in outcome  # the code's PermissionError, uncaught
        assert page.inner_text("#result") == ""
        assert problems == [], problems
    finally:
        context.close()

    view = served.runtime.engine.view(execution_id)
    assert view.status == "failed"
    assert [c.status for c in view.calls] == ["declined"]
    assert served.runtime.sources[0].effects() == []  # type: ignore[attr-defined]


def test_a_person_who_does_not_approve_for_the_principal_cannot_decide(
    browser: Any, served: Served
) -> None:
    answer = paused_through_mcp(served, WRITE_NOTE)
    execution_id, url = answer["executionId"], answer["interaction"]["approvalUrl"]
    context, page, _ = open_page(browser, url, served.person("Bea", ("bob",)), status=403)
    try:
        assert "cannot decide" in page.inner_text("#title")
        assert "Bea does not approve calls of alice" in page.inner_text("#notice")
        assert page.query_selector("#approve") is None
        assert "hello there" not in page.content()
    finally:
        context.close()
    assert served.status_of(execution_id) == "waiting_for_interaction"


def test_approve_a_loop_once_in_chromium(browser: Any, served: Served) -> None:
    code = (
        "out = []\n"
        "for i in range(4):\n"
        "    out.append(tools.notes.write(key=f'loop-{i}', text='x')['key'])\n"
        "out"
    )
    answer = paused_through_mcp(served, code)
    execution_id, url = answer["executionId"], answer["interaction"]["approvalUrl"]
    context, page, problems = open_page(browser, url, served.person())
    try:
        page.fill("#grant", "3")
        page.click("#approve")
        page.wait_for_selector("#outcome:has-text('completed')", timeout=WAIT_MS)
        assert problems == [], problems
    finally:
        context.close()
    view = served.runtime.engine.view(execution_id)
    assert view.status == "completed"
    assert view.result == [f"loop-{i}" for i in range(4)]
    assert [c.status for c in view.calls] == ["succeeded"] * 4
