"""Approvers who sign in with a passkey, for one person with no identity provider.

- The first start of a server on an empty database prints, on its terminal only, the API
  key it makes for `local` and a one-time enrolment link for an approver of `local`; in
  headless Chromium with its virtual authenticator (Chrome DevTools' WebAuthn domain) the
  person registers a passkey through that link, then approves the agent's call on its page
  and, signed out, signs in again with the passkey.
- `lockgate approvers add` prints a link that outlives a SIGKILL and a restart, registers
  one passkey (with the software authenticator, through the real routes) and is then used
  up; the passkey then signs the person in, and nothing else does: a passkey answer for
  another origin, a replayed one, an unknown device.
- No link's secret is ever in a log line.
"""

from __future__ import annotations

import concurrent.futures
import json
import signal
from typing import Any

import httpx2
import pytest
from webauthn import generate_registration_options, options_to_json

from lockgate.simulation.passkey_authenticator import SoftAuthenticator
from tests.support.approval_app import texts
from tests.support.chromium import WAIT_MS, chromium, console_problems, credentials
from tests.support.chromium import virtual_authenticator as attach_authenticator
from tests.support.people import (
    ENROLMENT_LINK,
    Approver,
    enrol_with_passkey,
    links_base,
    session_cookie,
    sign_in_with_passkey,
)
from tests.support.servers import (
    KEY_PATTERN,
    Deployment,
    create_key_directly,
    mcp_client,
    paused_write,
    run,
    settle,
    structured,
    unique_key,
    writes_of,
)

pytest_plugins = ["tests.support.servers"]

pytestmark = pytest.mark.slow


async def outcome(url: str, key: str, execution_id: str) -> dict[str, Any]:
    async with mcp_client(url, key, "legacy") as client:
        return structured(await settle(client, execution_id))


def test_an_enrolment_link_outlives_sigkill_and_registers_one_passkey(
    deployment: Deployment,
) -> None:
    server = deployment.start(LOCKGATE_APPROVAL_MODE="browser")
    bob = create_key_directly(deployment.database_url, "bob")
    # The command builds the link from the server's settings (its port, or public URL).
    added = deployment.cli(
        "approvers", "add", "Bea", "--principal", "bob", LOCKGATE_PORT=str(server.port)
    )
    assert added.returncode == 0, added.stderr
    found = ENROLMENT_LINK.search(added.stdout)
    assert found is not None, added.stdout
    token = found.group(1)
    base = links_base(server.base_url)
    assert f"{base}/enrol/{token}" in added.stdout

    # The link is durable: a SIGKILL and another process later, it still opens.
    assert server.kill() == -signal.SIGKILL
    server = deployment.start_at(server.port, LOCKGATE_APPROVAL_MODE="browser")
    page = httpx2.get(f"{base}/enrol/{token}", timeout=30)
    assert page.status_code == 200 and texts(page.text).by_id["title"].endswith("Bea")

    device = SoftAuthenticator()
    bea = enrol_with_passkey(base, token, device)
    try:
        note = unique_key()
        waiting = run(paused_write(server.url, bob, note))
        assert bea.approve(waiting["interaction"]["approvalUrl"]).json()["status"] == "completed"
    finally:
        bea.close()
    assert len(writes_of(deployment, note)) == 1

    # Used: it registers nothing more, whoever holds it.
    again = httpx2.post(
        f"{base}/enrol/{token}/options", json={}, headers={"Origin": base}, timeout=30
    )
    assert again.status_code == 410 and "used already" in again.json()["error"]["message"]
    assert httpx2.get(f"{base}/enrol/{token}", timeout=30).status_code == 410

    # The passkey signs Bea in; nothing else does.
    signed = sign_in_with_passkey(base, device)
    assert signed.status_code == 200, signed.text
    bea_again = Approver(base, session_cookie(signed))
    try:
        assert bea_again.inbox().json()["approver"] == "Bea"
    finally:
        bea_again.close()
    with httpx2.Client(timeout=30) as http:
        options = http.post(
            f"{base}/signin/passkey/options", json={}, headers={"Origin": base}
        ).json()
        elsewhere = device.authenticate(
            options["publicKey"], base, claimed_origin="http://localhost:1"
        )
        refused = http.post(
            f"{base}/signin/passkey",
            json={"challenge": options["challenge"], "credential": elsewhere},
            headers={"Origin": base},
        )
        assert refused.status_code == 401, refused.text
        assert "did not prove who you are" in refused.json()["error"]["message"]
        # The answer that was refused used its challenge up; a replay of a good one too.
        replayed = http.post(
            f"{base}/signin/passkey",
            json={
                "challenge": options["challenge"],
                "credential": device.replay_last_authentication(),
            },
            headers={"Origin": base},
        )
        assert replayed.status_code == 401 and "answered already" in replayed.text
    # A passkey for this host that was never registered here.
    stranger = SoftAuthenticator()
    stranger.register(
        json.loads(
            options_to_json(
                generate_registration_options(
                    rp_id="localhost", rp_name="elsewhere", user_name="mallory"
                )
            )
        ),
        base,
    )
    unknown = sign_in_with_passkey(base, stranger)
    assert unknown.status_code == 401 and "not registered here" in unknown.text

    # No log line carries a link's secret (the access log prints every path).
    secret = token.split(".", 1)[1]
    assert secret not in server.stderr()


def test_the_first_start_enrols_a_passkey_in_chromium_which_then_approves(
    deployment: Deployment,
) -> None:
    # An empty database: the first start makes the agent's key and the person's link.
    server = deployment.start(LOCKGATE_APPROVAL_MODE="native")
    printed = server.stdout()
    keys, links = set(KEY_PATTERN.findall(printed)), ENROLMENT_LINK.finditer(printed)
    [key], [link] = keys, [m.group(0) for m in links]
    base = links_base(server.base_url)
    assert link.startswith(f"{base}/enrol/")
    assert link.rsplit(".", 1)[1] not in server.stderr()  # on the terminal, never a log

    with chromium() as browser:
        context = browser.new_context(viewport={"width": 900, "height": 1000})
        page = context.new_page()
        problems = console_problems(page)
        cdp, authenticator = attach_authenticator(page)
        page.goto(link, wait_until="load", timeout=WAIT_MS)
        assert page.inner_text("#title") == "Create your passkey, Local operator"
        page.click("#create")
        page.wait_for_url(f"{base}/approvals", timeout=WAIT_MS)
        [passkey] = credentials(cdp, authenticator)
        assert passkey["rpId"] == "localhost" and passkey["isResidentCredential"]

        # The agent's code pauses on a write; the person opens the page its answer names.
        note = unique_key()
        # In a thread of its own: playwright's sync API owns this thread's event loop.
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(run, paused_write(server.url, key, note)).result(60)
        page.goto(waiting["interaction"]["approvalUrl"], wait_until="load", timeout=WAIT_MS)
        assert page.inner_text("#tool") == "tools.notes.write"
        assert note in page.inner_text("#args")
        assert page.inner_text("#person-name") == "Local operator"
        page.click("#approve")
        page.wait_for_selector("#outcome:has-text('completed')", timeout=WAIT_MS)

        # Signed out, the passkey signs the person in again (a discoverable credential).
        page.click("#signout")
        page.wait_for_url(f"{base}/signin", timeout=WAIT_MS)
        page.goto(f"{base}/signin?next=%2Fapprovals", wait_until="load", timeout=WAIT_MS)
        page.click("#passkey")
        page.wait_for_url(f"{base}/approvals", timeout=WAIT_MS)
        page.wait_for_selector("#decided li", timeout=WAIT_MS)
        assert "by Local operator (approval_page)" in page.inner_text("#decided")
        assert problems == [], problems
        context.close()

    done = run(outcome(server.url, key, waiting["executionId"]))
    assert done["status"] == "completed", done
    assert len(writes_of(deployment, note)) == 1
    [record] = deployment.audit_lines("local")
    assert record["person"]["name"] == "Local operator"
    assert record["person"]["signedInWith"] == "passkey"
