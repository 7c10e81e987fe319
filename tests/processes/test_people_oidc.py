"""Approvers who sign in with an OpenID provider: the real npm `oidc-provider`, run with the
machine's node on loopback, in front of a real `lockgate serve`.

Two people: Ann, added by her subject at the provider and granted alice's calls, and Bo,
added by his verified email and granted bob's. Each signs in through the provider (the
authorization code flow with PKCE, played by an HTTP client as a browser would), decides
their own principal's call through the page's API and is refused the other's; the audit
names them. Every way a sign-in can be wrong is refused in words: the provider's issuer,
the ID token's audience, issuer, expiry, signature or nonce, an unsigned token, a replayed
code or callback, a state this browser never started, a person who is not an approver. A
session outlives a SIGKILL and a restart, and `lockgate approvers sign-out` ends it.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx2
import pytest

from lockgate.simulation.ports import free_port
from tests.support.approval_app import texts
from tests.support.lockgate_server import LockgateServer
from tests.support.oidc_browser import query_of, sign_in, sign_in_to_callback, with_query
from tests.support.oidc_provider import (
    FaultMode,
    OidcAccount,
    OidcClient,
    OidcProvider,
    oidc_provider_package_fixture,  # noqa: F401  (fixture)
)
from tests.support.people import Approver, call_of, session_cookie
from tests.support.servers import (
    Deployment,
    create_key_directly,
    paused_write,
    run,
    unique_key,
    writes_of,
)

pytest_plugins = ["tests.support.servers"]

pytestmark = pytest.mark.slow

ANN = OidcAccount("ann-7", "ann@example.test", True, "Ann Approver")
BO = OidcAccount("bo-3", "bo@example.test", True, "Bo Approver")
#: Known to the provider, but nobody made her an approver.
EVE = OidcAccount("eve-1", "eve@example.test", True, "Eve")
#: Claims Bo's email, unverified: never matched to Bo.
MALLORY = OidcAccount("mallory-9", "bo@example.test", False, "Mallory")


@dataclass
class Setup:
    deployment: Deployment
    provider: OidcProvider
    server: LockgateServer
    base: str
    approvers: dict[str, str]

    @property
    def start(self) -> str:
        return f"{self.base}/signin/oidc?next=%2Fapprovals"

    def restart(self) -> None:
        self.server = self.deployment.start_at(self.server.port, **oidc_env(self.provider))


def oidc_env(provider: OidcProvider) -> dict[str, str]:
    return {
        "LOCKGATE_APPROVAL_MODE": "browser",
        "LOCKGATE_OIDC_ISSUER": provider.issuer,
        "LOCKGATE_OIDC_CLIENT_ID": "lockgate",
        "LOCKGATE_OIDC_CLIENT_SECRET": "lockgate-secret",
        "LOCKGATE_OIDC_PROVIDER_NAME": "Test IdP",
    }


def add_approver(deployment: Deployment, *args: str) -> str:
    done = deployment.cli("approvers", "add", *args)
    assert done.returncode == 0, done.stderr
    found = re.match(r"approver (\w+):", done.stdout)
    assert found is not None, done.stdout
    assert "/enrol/" not in done.stdout  # an OpenID approver gets no enrolment link
    return found.group(1)


@pytest.fixture(name="setup")
def setup_fixture(deployment: Deployment, oidc_provider_package: Path) -> Iterator[Setup]:
    port = free_port()
    base = f"http://localhost:{port}"
    client = OidcClient("lockgate", "lockgate-secret", [f"{base}/signin/oidc/callback"])
    with OidcProvider(
        clients=[client], accounts=[ANN, BO, EVE, MALLORY], package=oidc_provider_package
    ) as provider:
        approvers = {
            "ann": add_approver(
                deployment,
                "Ann",
                "--issuer",
                provider.issuer,
                "--subject",
                ANN.sub,
                "--principal",
                "alice",
            ),
            "bo": add_approver(
                deployment,
                "Bo",
                "--issuer",
                provider.issuer,
                "--email",
                BO.email,
                "--principal",
                "bob",
            ),
        }
        server = deployment.start_at(port, **oidc_env(provider))
        yield Setup(deployment, provider, server, base, approvers)


def signed_in_as(setup: Setup, account: OidcAccount) -> Approver:
    browser = httpx2.Client(timeout=30)
    landed = sign_in(browser, setup.start, account.sub)
    assert landed.status_code == 200, landed.text
    assert texts(landed.text).by_id["title"] == "Signed in"
    return Approver(setup.base, session_cookie(landed), account.name, http=browser)


def test_each_approver_decides_their_own_principal_s_calls_only(setup: Setup) -> None:
    database = setup.deployment.database_url
    alice, bob = create_key_directly(database, "alice"), create_key_directly(database, "bob")
    alice_note, bob_note = unique_key(), unique_key()
    for_alice = run(paused_write(setup.server.url, alice, alice_note))
    for_bob = run(paused_write(setup.server.url, bob, bob_note))

    ann, bo = signed_in_as(setup, ANN), signed_in_as(setup, BO)
    try:
        # Each sees their own principal's call in the inbox, never the other's.
        ann_inbox = ann.inbox().json()
        assert [c["executionId"] for c in ann_inbox["waiting"]] == [for_alice["executionId"]]
        assert [c["executionId"] for c in bo.inbox().json()["waiting"]] == [for_bob["executionId"]]
        # Ann cannot decide bob's call, through the API or the page.
        shown = ann.call(*call_of(for_bob["interaction"]["approvalUrl"]))
        assert shown.status_code == 403, shown.text
        refused = ann.decide(*call_of(for_bob["interaction"]["approvalUrl"]), digest="0" * 64)
        assert refused.status_code == 403, refused.text
        assert "Ann does not approve calls of bob" in refused.json()["error"]["message"]
        page = ann.get(for_bob["interaction"]["approvalUrl"].removeprefix(setup.base))
        assert page.status_code == 403 and "does not approve calls of bob" in page.text
        # Each decides their own.
        assert ann.approve(for_alice["interaction"]["approvalUrl"]).json()["status"] == "completed"
        declined = bo.approve(for_bob["interaction"]["approvalUrl"], action="decline")
        assert declined.json()["status"] == "completed"
    finally:
        ann.close()
        bo.close()
    assert len(writes_of(setup.deployment, alice_note)) == 1
    assert writes_of(setup.deployment, bob_note) == []

    [ann_record] = setup.deployment.audit_lines("alice")
    assert (ann_record["action"], ann_record["door"]) == ("accept", "approval_page")
    assert ann_record["person"] == {
        "issuer": setup.provider.issuer,
        "subject": ANN.sub,
        "name": "Ann",
        "email": None,
        "signedInWith": "oidc",
    }
    [bo_record] = setup.deployment.audit_lines("bob")
    # Bo was added by email; his first sign-in bound the provider's subject for him.
    assert bo_record["action"] == "decline" and bo_record["person"]["subject"] == BO.sub
    listed = setup.deployment.cli("approvers", "list").stdout
    assert f"oidc {setup.provider.issuer} {BO.sub}" in listed


def refusal(response: httpx2.Response) -> str:
    """The sign-in refusal page's words."""
    assert response.status_code == 401, response.text
    found = texts(response.text).by_id
    assert found["title"] == "Sign-in refused"
    assert "set-cookie" not in response.headers or "lockgate_person" not in str(
        response.headers.get_list("set-cookie")
    )
    return found["notice"]


FAULTS: dict[FaultMode, str] = {
    "wrong_audience": "issued to another client (wrong audience)",
    "wrong_issuer": "issued by another provider (wrong issuer)",
    "expired": "it has expired",
    "unsigned": "not signed with an accepted algorithm ('none')",
    "bad_signature": "signature does not verify",
    "wrong_nonce": "its nonce is not this sign-in's",
}


def test_every_bad_sign_in_is_refused_in_words(setup: Setup) -> None:
    for mode, words in FAULTS.items():
        setup.provider.set_mode(mode)
        with httpx2.Client(timeout=30) as browser:
            assert words in refusal(sign_in(browser, setup.start, ANN.sub)), mode

    with httpx2.Client(timeout=30) as browser:
        # A person the provider knows who is no approver here.
        assert "is not an approver here" in refusal(sign_in(browser, setup.start, EVE.sub))
    with httpx2.Client(timeout=30) as browser:
        # An unverified email is never matched to the approver who has it.
        assert "is not an approver here" in refusal(sign_in(browser, setup.start, MALLORY.sub))

    with httpx2.Client(timeout=30) as browser:
        callback = sign_in_to_callback(browser, setup.start, ANN.sub)
        # A state this browser never started (the sign-in cookie names the real one).
        forged = browser.get(with_query(callback, state="forged-state"))
        assert "not started in this browser" in refusal(forged)
        # The real callback signs her in, once; replayed, it is refused: in this browser
        # (its sign-in cookie is gone), and with the cookie copied too (the state is used).
        assert browser.get(callback).status_code == 200
        assert "not started in this browser" in refusal(browser.get(callback))
        copied = {"Cookie": f"lockgate_sign_in={query_of(callback)['state']}"}
        assert "finished already" in refusal(browser.get(callback, headers=copied))
    with httpx2.Client(timeout=30) as browser:
        first = sign_in_to_callback(browser, setup.start, ANN.sub)
        assert browser.get(first).status_code == 200  # its code is exchanged, once
        # The same code again, with a fresh sign-in's state: the provider refuses it.
        fresh = query_of(sign_in_to_callback(browser, setup.start, ANN.sub))
        replayed = browser.get(with_query(first, state=fresh["state"]))
        assert "would not exchange the code" in refusal(replayed)
    with httpx2.Client(timeout=30) as browser:
        # The provider's own refusal (the person cancelled) is passed on.
        cancelled = sign_in(browser, setup.start, ANN.sub, cancel=True)
        assert "refused the sign-in" in refusal(cancelled)


def test_a_provider_that_names_another_issuer_is_refused(
    deployment: Deployment, oidc_provider_package: Path
) -> None:
    port = free_port()
    base = f"http://localhost:{port}"
    client = OidcClient("lockgate", "lockgate-secret", [f"{base}/signin/oidc/callback"])
    with OidcProvider(
        clients=[client],
        accounts=[ANN],
        issuer="http://localhost:{port}/elsewhere",
        package=oidc_provider_package,
    ) as provider:
        # The operator configured where it listens; it says it is somebody else.
        env = {**oidc_env(provider), "LOCKGATE_OIDC_ISSUER": provider.url}
        deployment.start_at(port, **env)
        with httpx2.Client(timeout=30) as browser:
            answer = browser.get(f"{base}/signin/oidc")
            assert "(wrong issuer)" in refusal(answer)


def test_a_session_outlives_sigkill_and_restart_until_signed_out(setup: Setup) -> None:
    ann = signed_in_as(setup, ANN)
    try:
        assert ann.inbox().status_code == 200
        assert setup.server.kill() == -signal.SIGKILL
        setup.restart()
        # Another process, the same row: still Ann.
        after = ann.inbox()
        assert after.status_code == 200 and after.json()["approver"] == "Ann"
        done = setup.deployment.cli("approvers", "sign-out", setup.approvers["ann"])
        assert done.returncode == 0 and "signed out 1 session" in done.stdout
        ended = ann.inbox()
        assert ended.status_code == 401 and ended.json()["error"]["code"] == "sign_in_required"
    finally:
        ann.close()
    # The sign-in page still offers the provider, and signing in again works.
    again = signed_in_as(setup, ANN)
    try:
        assert again.inbox().status_code == 200
        signed_out = again.http.post(f"{setup.base}/signout", json={}, headers=again.headers())
        assert signed_out.status_code == 200
        assert again.inbox().status_code == 401
    finally:
        again.close()
    page = httpx2.get(f"{setup.base}/signin", timeout=30)
    assert texts(page.text).by_id["oidc"] == "Sign in with Test IdP"
