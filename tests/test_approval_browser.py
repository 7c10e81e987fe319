"""The approval page in a real browser: Debian's headless Chromium, driven by playwright.

An agent's client runs code through the MCP `execute` tool; the call pauses for approval and
the answer carries an approval URL. A person opens it, reads what will run, and clicks
Approve (or Decline); the execution then completes (or the code is told the call was
refused). The browser is /usr/bin/chromium, never one playwright downloads.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from lockgate.machine.runtime import Runtime
from tests.support.approval_app import PRINCIPAL, WRITE_NOTE, Served, mcp_execute, serve
from tests.support.canary import CANARY

pytestmark = pytest.mark.slow

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOT = Path("/tmp/lockgate-approval-page.png")
#: Browser waits: generous for a loaded CI machine, still far below the test timeout.
WAIT_MS = 20_000


@pytest.fixture
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{CHROMIUM} is missing; .ci/run installs Debian's chromium")
        pytest.skip(
            f"{CHROMIUM} is missing (apt-get install chromium); this test never downloads one"
        )
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True
        )
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def served(make_runtime: Callable[..., Runtime]) -> Iterator[Served]:
    with serve(make_runtime) as s:
        yield s


def paused_through_mcp(served: Served, code: str) -> dict[str, Any]:
    """`execute` through a real MCP client, in its own thread: playwright's sync API owns
    this thread's event loop."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        answer = pool.submit(mcp_execute, served, code).result(timeout=60)
    assert answer["status"] == "waiting_for_interaction", answer
    return answer


def open_page(browser: Any, url: str) -> tuple[Any, Any, list[str]]:
    """A fresh context and page at `url`, collecting console errors (a CSP violation
    included) and failed requests."""
    context = browser.new_context(viewport={"width": 900, "height": 1000})
    page = context.new_page()
    problems: list[str] = []
    page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(str(e)))
    response = page.goto(url, wait_until="load", timeout=WAIT_MS)
    assert response is not None and response.status == 200
    return context, page, problems


def test_approve_in_chromium_completes_the_execution(browser: Any, served: Served) -> None:
    answer = paused_through_mcp(served, WRITE_NOTE)
    execution_id, url = answer["executionId"], answer["interaction"]["approvalUrl"]

    context, page, problems = open_page(browser, url)
    try:
        assert page.title().startswith("Approve tools.notes.write?")
        assert page.inner_text("#tool") == "tools.notes.write"
        assert json.loads(page.inner_text("#args")) == {"key": "greeting", "text": "hello there"}
        assert page.inner_text("#who") == PRINCIPAL
        assert "tools.notes.write(" in page.inner_text("#code")
        # The page's script ran (the CSP lets its nonced script through): a relative expiry.
        assert re.fullmatch(r"\S+ \S+ UTC \(in 23 h 5\d min\)", page.inner_text("#expires"))
        assert page.is_enabled("#approve") and page.is_enabled("#decline")
        assert CANARY not in page.content()
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

        # Reloading the used link says so, plainly.
        again = page.reload(wait_until="load", timeout=WAIT_MS)
        assert again is not None and again.status == 410
        assert "already used" in page.inner_text("#title")
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


def test_decline_in_chromium_refuses_the_call(browser: Any, served: Served) -> None:
    answer = paused_through_mcp(served, WRITE_NOTE)
    execution_id, url = answer["executionId"], answer["interaction"]["approvalUrl"]

    context, page, problems = open_page(browser, url)
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


def test_approve_a_loop_once_in_chromium(browser: Any, served: Served) -> None:
    code = (
        "out = []\n"
        "for i in range(4):\n"
        "    out.append(tools.notes.write(key=f'loop-{i}', text='x')['key'])\n"
        "out"
    )
    answer = paused_through_mcp(served, code)
    execution_id, url = answer["executionId"], answer["interaction"]["approvalUrl"]
    context, page, problems = open_page(browser, url)
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
