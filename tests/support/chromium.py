"""Debian's headless Chromium, driven by playwright (never a browser playwright downloads),
and its virtual WebAuthn authenticator (Chrome DevTools' `WebAuthn` domain): a passkey
device as a real browser exposes it to a page.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.support.people import Approver
from tests.support.programs import missing

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
#: Browser waits: generous for a loaded CI machine, still far below the test timeout.
WAIT_MS = 20_000


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium (a playwright `Browser`); skips where Debian's chromium is
    missing, except on CI, where that fails."""
    if not os.access(CHROMIUM, os.X_OK):  # absent, or not a program that can run
        missing(f"{CHROMIUM} (this test never downloads a browser)", "chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True
        )
        try:
            yield browser
        finally:
            browser.close()


def virtual_authenticator(page: Any) -> tuple[Any, str]:
    """A platform authenticator holding resident keys and verifying its user, attached to
    `page`'s browser context: (the CDP session, its id)."""
    cdp = page.context.new_cdp_session(page)
    cdp.send("WebAuthn.enable", {"enableUI": False})
    added = cdp.send(
        "WebAuthn.addVirtualAuthenticator",
        {
            "options": {
                "protocol": "ctap2",
                "transport": "internal",
                "hasResidentKey": True,
                "hasUserVerification": True,
                "isUserVerified": True,
                "automaticPresenceSimulation": True,
            }
        },
    )
    return cdp, str(added["authenticatorId"])


def credentials(cdp: Any, authenticator_id: str) -> list[dict[str, Any]]:
    """The passkeys the virtual authenticator holds."""
    found = cdp.send("WebAuthn.getCredentials", {"authenticatorId": authenticator_id})
    return list(found["credentials"])


def console_problems(page: Any) -> list[str]:
    """Collect the page's script errors and failed requests (a CSP violation included)."""
    problems: list[str] = []
    page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(str(e)))
    return problems


def open_page(
    browser: Any, url: str, person: Approver | None = None, status: int = 200
) -> tuple[Any, Any, list[str]]:
    """A fresh browser context at `url`, with `person`'s session cookie when given (as the
    browser holds it after sign-in: HttpOnly, SameSite=Strict, for `localhost`), collecting
    console errors (a CSP violation included) and failed requests."""
    context = browser.new_context(viewport={"width": 900, "height": 1000})
    if person is not None:
        context.add_cookies(
            [
                {
                    "name": "lockgate_person",
                    "value": person.cookie,
                    "domain": "localhost",
                    "path": "/",
                    "httpOnly": True,
                    "sameSite": "Strict",
                }
            ]
        )
    page = context.new_page()
    problems = console_problems(page)
    response = page.goto(url, wait_until="load", timeout=WAIT_MS)
    assert response is not None and response.status == status, response
    return context, page, problems
