"""The OpenID provider the approver sign-in tests run against (tests/support/oidc_provider.py):
a real `oidc-provider` on loopback, driven by the browser helpers and, as the relying party,
by authlib's own OAuth 2.0 client (authorization code with PKCE S256), its ID tokens checked
with authlib's JWT tools (joserfc) and OpenID claim rules. Each test-only fault mode must
give the ID token the one defect it names and nothing else."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest
from authlib.common.security import generate_token  # type: ignore[import-untyped,unused-ignore]
from authlib.integrations.base_client import (  # type: ignore[import-untyped,unused-ignore]
    OAuthError,
)
from authlib.integrations.httpx_client import (  # type: ignore[import-untyped,unused-ignore]
    OAuth2Client,
)
from authlib.oauth2.rfc7636 import create_s256_code_challenge
from authlib.oidc.core import CodeIDToken  # type: ignore[import-untyped,unused-ignore]
from joserfc import jwt
from joserfc.errors import JoseError
from joserfc.jwk import KeySet
from joserfc.util import urlsafe_b64decode

from tests.support.oidc_browser import SignInError, query_of, sign_in_to_callback, with_query
from tests.support.oidc_provider import (
    FAULT_MODES,
    WRONG_ISSUER,
    FaultMode,
    OidcAccount,
    OidcClient,
    OidcProvider,
    oidc_provider_package_fixture,  # noqa: F401  (fixture)
)

pytestmark = pytest.mark.slow

SCOPE = "openid email profile"
ALICE = OidcAccount("alice", "alice@example.test", True, "Alice Approver")
BOB = OidcAccount("bob", "bob@example.test", False, "Bob")
#: A second client that authenticates at the token endpoint with client_secret_post; its
#: callback is never requested (the flows stop at it).
POST_CLIENT = OidcClient(
    "post-rp",
    "post-secret",
    ["http://localhost:9/callback"],
    token_endpoint_auth_method="client_secret_post",
)


def verify_id_token(
    provider: OidcProvider, token: dict[str, Any], client: OidcClient, nonce: str
) -> dict[str, Any]:
    """The ID token's claims once its signature (the provider's JWKS) and its claims (authlib's
    OpenID rules for the code flow: iss, aud, exp, iat, nonce; at_hash when there is one) are
    checked."""
    keys = KeySet.import_key_set(provider.jwks())  # type: ignore[arg-type]
    decoded = jwt.decode(token["id_token"], keys, algorithms=["RS256"])
    claims = CodeIDToken(
        decoded.claims,
        decoded.header,
        # `aud` given explicitly: authlib's ID token rules alone check it only through `azp`
        # (a token for another audience that names this client in `azp` would pass).
        {
            "iss": {"essential": True, "value": provider.issuer},
            "aud": {"essential": True, "value": client.client_id},
        },
        {"nonce": nonce, "client_id": client.client_id, "access_token": token["access_token"]},
    )
    claims.validate(leeway=0)
    return dict(claims)


def unverified(id_token: str) -> tuple[dict[str, Any], dict[str, Any], str]:
    """Header, claims and signature part of a compact JWS, nothing checked."""
    header, payload, signature = id_token.split(".")
    return (
        json.loads(urlsafe_b64decode(header.encode())),
        json.loads(urlsafe_b64decode(payload.encode())),
        signature,
    )


def defects(
    provider: OidcProvider, id_token: str, client: OidcClient, nonce: str
) -> set[FaultMode]:
    """What is wrong with an ID token, in the fault modes' names (empty: nothing)."""
    header, claims, signature = unverified(id_token)
    found: set[FaultMode] = set()
    if header["alg"] == "none" or not signature:
        found.add("unsigned")
    else:
        try:
            jwt.decode(id_token, KeySet.import_key_set(provider.jwks()))  # type: ignore[arg-type]
        except JoseError:
            found.add("bad_signature")
    if claims["iss"] != provider.issuer:
        found.add("wrong_issuer")
    audience = claims["aud"] if isinstance(claims["aud"], list) else [claims["aud"]]
    if audience != [client.client_id]:
        found.add("wrong_audience")
    if claims["exp"] <= time.time():
        found.add("expired")
    if claims.get("nonce") != nonce:
        found.add("wrong_nonce")
    return found


def authlib_client(client: OidcClient) -> Any:
    """authlib's OAuth 2.0 client (an httpx2.Client) as the relying party `client`: PKCE S256,
    its secret sent the way it is registered with."""
    return OAuth2Client(
        client_id=client.client_id,
        client_secret=client.client_secret,
        scope=SCOPE,
        redirect_uri=client.redirect_uris[0],
        code_challenge_method="S256",
        token_endpoint_auth_method=client.token_endpoint_auth_method,
    )


@dataclass
class Flow:
    """One authorization request made with authlib's client, up to its callback."""

    oauth: Any  # authlib's OAuth2Client (an httpx2.Client)
    client: OidcClient
    state: str
    verifier: str
    nonce: str
    callback: str = ""

    def exchange(self, provider: OidcProvider) -> dict[str, Any]:
        """The code for tokens at the token endpoint (authlib checks the callback's state)."""
        token: dict[str, Any] = self.oauth.fetch_token(
            provider.metadata()["token_endpoint"],
            authorization_response=self.callback,
            state=self.state,
            code_verifier=self.verifier,
        )
        return token


@pytest.fixture(name="browser")
def browser_fixture() -> Iterator[httpx2.Client]:
    """A fresh browser (cookie jar) per test: the provider remembers nobody."""
    with httpx2.Client(timeout=10) as client:
        yield client


#: The relying party these tests play: its callback is never served (the browser helper
#: stops at it; Lockgate's own tests are the relying party that serves one).
RP_CLIENT = OidcClient("lockgate-rp", "rp-secret", ["http://localhost:9/callback"])


@pytest.fixture(name="provider", scope="module")
def provider_fixture(oidc_provider_package: Path) -> Iterator[OidcProvider]:
    with OidcProvider(
        clients=[RP_CLIENT, POST_CLIENT], accounts=[ALICE, BOB], package=oidc_provider_package
    ) as provider:
        yield provider


@pytest.fixture(autouse=True)
def normal_mode(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every test starts and ends with no fault planted (the provider is the module's)."""
    if "provider" not in request.fixturenames:
        yield
        return
    provider: OidcProvider = request.getfixturevalue("provider")
    provider.set_mode("normal")
    yield
    provider.set_mode("normal")


def start_flow(
    provider: OidcProvider, browser: httpx2.Client, sub: str, client: OidcClient
) -> Flow:
    """authlib's authorization request, played by the browser up to the callback."""
    oauth = authlib_client(client)
    try:
        verifier, nonce = generate_token(48), generate_token(20)
        url, state = oauth.create_authorization_url(
            provider.metadata()["authorization_endpoint"], code_verifier=verifier, nonce=nonce
        )
        flow = Flow(oauth, client, state, verifier, nonce)
        flow.callback = sign_in_to_callback(browser, url, sub)
    except BaseException:
        oauth.close()
        raise
    return flow


@pytest.fixture(name="flows")
def flows_fixture() -> Iterator[list[Flow]]:
    """Flows a test starts, their authlib clients closed after it."""
    started: list[Flow] = []
    yield started
    for flow in started:
        flow.oauth.close()


def test_discovery_and_keys(provider: OidcProvider) -> None:
    metadata = provider.metadata()
    assert metadata["issuer"] == provider.issuer == provider.url
    assert provider.url.startswith("http://127.0.0.1:")
    assert metadata["authorization_endpoint"] == f"{provider.url}/auth"
    assert metadata["token_endpoint"] == f"{provider.url}/token"
    assert metadata["code_challenge_methods_supported"] == ["S256"]
    assert metadata["response_types_supported"] == ["code"]
    assert set(metadata["token_endpoint_auth_methods_supported"]) == {
        "client_secret_basic",
        "client_secret_post",
    }
    assert {"openid", "email", "profile"} <= set(metadata["scopes_supported"])
    keys = provider.jwks()["keys"]
    assert [(key["kid"], key["kty"]) for key in keys] == [(provider.kid, "RSA")]
    assert all("d" not in key for key in keys), "the JWKS holds public keys only"


def test_a_sign_in_with_authlib_gives_a_signed_id_token_and_the_code_is_single_use(
    provider: OidcProvider, browser: httpx2.Client, flows: list[Flow]
) -> None:
    flows.append(flow := start_flow(provider, browser, "alice", RP_CLIENT))
    params = query_of(flow.callback)
    assert flow.callback.startswith(RP_CLIENT.redirect_uris[0] + "?")
    assert params["state"] == flow.state and params["iss"] == provider.issuer and params["code"]

    token = flow.exchange(provider)
    assert token["token_type"].lower() == "bearer"
    claims = verify_id_token(provider, token, RP_CLIENT, flow.nonce)
    assert claims["iss"] == provider.issuer
    assert claims["aud"] == RP_CLIENT.client_id
    assert claims["sub"] == "alice"
    assert claims["email"] == "alice@example.test" and claims["email_verified"] is True
    assert claims["name"] == "Alice Approver"
    assert claims["nonce"] == flow.nonce
    header, _, _ = unverified(token["id_token"])
    assert header["alg"] == "RS256" and header["kid"] == provider.kid

    with pytest.raises(OAuthError) as replayed:
        flow.exchange(provider)
    assert replayed.value.error == "invalid_grant"


def test_pkce_is_required_and_checked(
    provider: OidcProvider, browser: httpx2.Client, flows: list[Flow]
) -> None:
    # No code_challenge: the provider answers the client with invalid_request.
    plain = with_query(
        f"{provider.url}/auth",
        client_id=RP_CLIENT.client_id,
        response_type="code",
        redirect_uri=RP_CLIENT.redirect_uris[0],
        scope=SCOPE,
        state="s1",
        nonce="n1",
    )
    refused = query_of(sign_in_to_callback(browser, plain, "alice"))
    assert refused["error"] == "invalid_request" and refused["state"] == "s1"
    assert "PKCE" in refused["error_description"]

    # Another code_verifier than the challenge's: the code is refused.
    flows.append(flow := start_flow(provider, browser, "alice", RP_CLIENT))
    flow.verifier = generate_token(48)
    with pytest.raises(OAuthError) as mismatched:
        flow.exchange(provider)
    assert mismatched.value.error == "invalid_grant"


def test_client_secret_post_and_a_second_account(
    provider: OidcProvider, browser: httpx2.Client, flows: list[Flow]
) -> None:
    flows.append(flow := start_flow(provider, browser, "bob", POST_CLIENT))
    claims = verify_id_token(provider, flow.exchange(provider), POST_CLIENT, flow.nonce)
    assert (claims["sub"], claims["aud"]) == ("bob", POST_CLIENT.client_id)
    assert (claims["email"], claims["email_verified"]) == ("bob@example.test", False)


def test_an_unknown_account_and_a_cancelled_sign_in(
    provider: OidcProvider, browser: httpx2.Client, flows: list[Flow]
) -> None:
    with pytest.raises(SignInError, match="no account mallory"):
        flows.append(start_flow(provider, browser, "mallory", RP_CLIENT))
    asked = with_query(
        f"{provider.url}/auth",
        client_id=RP_CLIENT.client_id,
        response_type="code",
        redirect_uri=RP_CLIENT.redirect_uris[0],
        scope=SCOPE,
        code_challenge=create_s256_code_challenge(generate_token(48)),  # type: ignore[no-untyped-call]
        code_challenge_method="S256",
    )
    cancelled = query_of(sign_in_to_callback(browser, asked, "alice", cancel=True))
    assert cancelled["error"] == "access_denied"


@pytest.mark.parametrize("mode", [mode for mode in FAULT_MODES if mode != "normal"])
def test_each_fault_mode_gives_the_one_defect_it_names(
    provider: OidcProvider,
    browser: httpx2.Client,
    flows: list[Flow],
    mode: FaultMode,
) -> None:
    state = provider.set_mode(mode)
    assert (state["mode"], state["once"]) == (mode, True)
    applied = state["applied"]
    flows.append(faulty := start_flow(provider, browser, "alice", RP_CLIENT))
    token = faulty.exchange(provider)
    assert defects(provider, token["id_token"], RP_CLIENT, faulty.nonce) == {mode}
    header, claims, _ = unverified(token["id_token"])
    if mode == "unsigned":
        assert header == {"alg": "none"}
    elif mode == "wrong_audience":
        assert claims["aud"] == POST_CLIENT.client_id  # another client of the provider's
    elif mode == "wrong_issuer":
        assert claims["iss"] == WRONG_ISSUER
    elif mode == "expired":
        assert claims["exp"] < time.time() - 3500 and claims["iat"] < claims["exp"]
    elif mode == "bad_signature":
        assert header["kid"] == provider.kid  # the provider's kid, another key's signature
    with pytest.raises(JoseError):  # authlib's checks refuse it
        verify_id_token(provider, token, RP_CLIENT, faulty.nonce)
    # The rest of the answer is the provider's own, and the defect was for one answer only.
    assert claims["sub"] == "alice" and token["access_token"]
    assert provider.fault_state() == {"mode": "normal", "once": True, "applied": applied + 1}
    flows.append(clean := start_flow(provider, browser, "alice", RP_CLIENT))
    assert defects(provider, clean.exchange(provider)["id_token"], RP_CLIENT, clean.nonce) == set()


def test_a_fault_mode_can_last_until_reset(
    provider: OidcProvider, browser: httpx2.Client, flows: list[Flow]
) -> None:
    provider.set_mode("wrong_nonce", once=False)
    for _ in range(2):
        flows.append(flow := start_flow(provider, browser, "alice", RP_CLIENT))
        assert defects(provider, flow.exchange(provider)["id_token"], RP_CLIENT, flow.nonce) == {
            "wrong_nonce"
        }
    provider.set_mode("normal")
    flows.append(flow := start_flow(provider, browser, "alice", RP_CLIENT))
    assert defects(provider, flow.exchange(provider)["id_token"], RP_CLIENT, flow.nonce) == set()
    with pytest.raises(ValueError, match="mode must be one of"):
        provider.set_mode("sideways")  # type: ignore[arg-type]


def test_a_provider_claiming_another_issuer_than_where_it_listens(
    oidc_provider_package: Path, browser: httpx2.Client
) -> None:
    with OidcProvider(
        clients=[POST_CLIENT],
        accounts=[ALICE],
        issuer="http://localhost:{port}/elsewhere",
        package=oidc_provider_package,
    ) as provider:
        assert provider.issuer == f"http://localhost:{provider.port}/elsewhere"
        assert provider.metadata()["issuer"] == provider.issuer != provider.url
        flow = start_flow(provider, browser, "alice", POST_CLIENT)
        with flow.oauth:
            token = flow.exchange(provider)
        assert unverified(token["id_token"])[1]["iss"] == provider.issuer
        assert query_of(flow.callback)["iss"] == provider.issuer
