"""Signing in with the operator's OpenID Connect provider: the authorization code flow
with PKCE, for teams with an identity provider (Google, Okta, Entra ID, Keycloak, ...).

authlib builds the protocol's messages (the authorization URL, the token request, PKCE's
S256 challenge) and validates the ID token's claims (`CodeIDToken`: issuer, audience,
expiry, nonce); joserfc, which authlib builds on, checks its signature against the
provider's published keys. The two HTTP exchanges (discovery and keys, the token request)
go through httpx2, the HTTP library the rest of the server uses, with a deadline.

The sign-in's state is a sign-in challenge row (its PKCE verifier, nonce and where to go
next), taken (deleted) by the callback that uses it, and bound to the browser that started
it by a short-lived cookie: a callback with a state this browser did not start, or one
already used, is refused. A code is exchanged once; the provider refuses a replayed one.

authlib and joserfc are imported by the steps that use them, not with this module: they are
a tenth of a boot's imports, and only a person signing in needs them.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import httpx2

from lockgate.machine.people import Issued, People
from lockgate.server.sign_in_passkey import SignInRefused

if TYPE_CHECKING:
    from joserfc.errors import JoseError
    from joserfc.jwk import KeySet

#: How long the person has to come back from the provider.
ROUND_TRIP = timedelta(minutes=10)
OIDC = "oidc"
#: How long discovery and keys are reused before they are read again.
METADATA_SECONDS = 3600.0
#: The bound on each exchange with the provider.
HTTP_SECONDS = 10.0
#: Signature algorithms accepted for an ID token (never `none`).
SIGNED = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")
#: Clock difference tolerated between this server and the provider.
LEEWAY_SECONDS = 60


def _claim_words(exc: JoseError) -> str:
    """What was wrong with the ID token, in words."""
    from joserfc.errors import ExpiredTokenError, InvalidClaimError, MissingClaimError

    if isinstance(exc, ExpiredTokenError):
        return "it has expired"
    claim = getattr(exc, "claim", "") or ""
    if isinstance(exc, MissingClaimError):
        return f"it lacks the {claim!r} claim"
    named = {
        "iss": "it was issued by another provider (wrong issuer)",
        "aud": "it was issued to another client (wrong audience)",
        "nonce": "its nonce is not this sign-in's (a replayed or mixed-up token)",
        "exp": "it has expired",
        "iat": "its issue time is not valid",
    }
    if isinstance(exc, InvalidClaimError):
        return named.get(claim, f"its {claim!r} claim is not valid")
    return "it is not valid"


@dataclass
class _Provider:
    metadata: dict[str, Any]
    keys: KeySet
    read_at: float = field(default_factory=time.monotonic)


@dataclass(frozen=True)
class SignInStart:
    redirect: str
    state: str


class OidcSignIn:
    def __init__(self, people: People) -> None:
        self.people = people
        self.settings = people.settings
        self.issuer = self.settings.oidc_issuer.rstrip("/")
        self.redirect_uri = f"{self.settings.base_url}/signin/oidc/callback"
        self._provider: _Provider | None = None

    @property
    def configured(self) -> bool:
        return self.settings.oidc_configured

    async def _get_json(self, client: httpx2.AsyncClient, url: str) -> dict[str, Any]:
        try:
            response = await client.get(url)
        except httpx2.HTTPError as exc:
            raise SignInRefused(
                f"The identity provider could not be reached ({type(exc).__name__}).",
                hint="Try again in a moment; the operator can check LOCKGATE_OIDC_ISSUER.",
            ) from None
        if response.status_code != 200:
            raise SignInRefused(
                f"The identity provider answered HTTP {response.status_code} at {url[:200]}."
            )
        body = response.json()
        if not isinstance(body, dict):
            raise SignInRefused(f"The identity provider's {url[:200]} is not a JSON object.")
        return body

    async def provider(self, *, refresh: bool = False) -> _Provider:
        """Discovery and keys, read again after an hour, or when asked (an unknown key id:
        the provider rotated its keys)."""
        held = self._provider
        if held is not None and not refresh and time.monotonic() - held.read_at < METADATA_SECONDS:
            return held
        async with httpx2.AsyncClient(timeout=HTTP_SECONDS, follow_redirects=False) as client:
            metadata = await self._get_json(
                client, f"{self.issuer}/.well-known/openid-configuration"
            )
            if str(metadata.get("issuer", "")).rstrip("/") != self.issuer:
                raise SignInRefused(
                    f"The identity provider at {self.issuer} calls itself "
                    f"{str(metadata.get('issuer'))[:200]!r} (wrong issuer): sign-in is refused.",
                    hint="The operator sets LOCKGATE_OIDC_ISSUER to the provider's issuer "
                    "exactly as it publishes it.",
                )
            jwks = await self._get_json(client, str(metadata["jwks_uri"]))
        from joserfc.jwk import KeySet

        self._provider = _Provider(metadata, KeySet.import_key_set(jwks))  # type: ignore[arg-type]
        return self._provider

    async def start(self, next_path: str) -> SignInStart:
        """Where to send the person's browser, and the state it must come back with."""
        from authlib.oauth2.rfc6749.parameters import prepare_grant_uri
        from authlib.oauth2.rfc7636 import create_s256_code_challenge

        provider = await self.provider()
        nonce, verifier = secrets.token_urlsafe(32), secrets.token_urlsafe(64)
        state = self.people.challenges.begin(
            OIDC, {"nonce": nonce, "verifier": verifier, "next": next_path}, ROUND_TRIP
        )
        scopes = " ".join(dict.fromkeys(["openid", *self.settings.oidc_scopes.split()]))
        url = prepare_grant_uri(
            provider.metadata["authorization_endpoint"],
            self.settings.oidc_client_id,
            "code",
            redirect_uri=self.redirect_uri,
            scope=scopes,
            state=state,
            nonce=nonce,
            code_challenge=create_s256_code_challenge(verifier),  # type: ignore[no-untyped-call]
            code_challenge_method="S256",
        )
        return SignInStart(redirect=str(url), state=state)

    async def finish(self, params: dict[str, str], started_here: str | None) -> tuple[Issued, str]:
        """The provider's redirect back: the person's session, and where to go next."""
        if "error" in params:
            said = params.get("error_description") or params["error"]
            raise SignInRefused(f"The identity provider refused the sign-in: {said[:200]}")
        state, code = params.get("state", ""), params.get("code", "")
        if not state or not code:
            raise SignInRefused("The provider's answer has no code or state: start again.")
        if started_here is None or not secrets.compare_digest(state, started_here):
            raise SignInRefused(
                "This sign-in was not started in this browser (its state does not match).",
                hint="Start again from the sign-in page.",
            )
        data = self.people.challenges.finish(state, OIDC)
        if data is None:
            raise SignInRefused(
                "This sign-in was finished already, or took too long (its state is used or "
                "expired).",
                hint="Start again from the sign-in page.",
            )
        claims = await self._id_token(code, str(data["verifier"]), str(data["nonce"]))
        approver = self._approver(claims)
        return self.people.open_session(approver, OIDC), str(data.get("next") or "/approvals")

    async def _id_token(self, code: str, verifier: str, nonce: str) -> dict[str, Any]:
        provider = await self.provider()
        secret = self.settings.oidc_client_secret
        form = {
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": self.redirect_uri,
            "code_verifier": verifier,
        }
        # client_secret_basic for a confidential client; a public one names itself.
        auth = (
            httpx2.BasicAuth(self.settings.oidc_client_id, secret.get_secret_value())
            if secret
            else None
        )
        if auth is None:
            form["client_id"] = self.settings.oidc_client_id
        async with httpx2.AsyncClient(
            timeout=HTTP_SECONDS, follow_redirects=False, auth=auth
        ) as client:
            try:
                response = await client.post(provider.metadata["token_endpoint"], data=form)
            except httpx2.HTTPError as exc:
                raise SignInRefused(
                    f"The identity provider could not be reached ({type(exc).__name__})."
                ) from None
        body = (
            response.json()
            if response.headers.get("content-type", "").startswith("application/json")
            else {}
        )
        if response.status_code != 200 or "id_token" not in body:
            said = body.get("error_description") or body.get("error") or response.status_code
            raise SignInRefused(
                f"The identity provider would not exchange the code ({str(said)[:200]}): a code "
                "works once, for the sign-in that asked for it.",
                hint="Start again from the sign-in page.",
            )
        return await self._verified(str(body["id_token"]), nonce)

    async def _verified(self, id_token: str, nonce: str) -> dict[str, Any]:
        from authlib.oidc.core import CodeIDToken
        from joserfc import jwt
        from joserfc.errors import BadSignatureError, JoseError

        allowed = [a for a in self._provider_algorithms() if a in SIGNED] or ["RS256"]
        header = _header(id_token)
        if header.get("alg") not in allowed:
            raise SignInRefused(
                f"The ID token is not signed with an accepted algorithm ({header.get('alg')!r}): "
                "an unsigned token proves nothing."
            )
        try:
            try:
                token = jwt.decode(id_token, self._keys(), algorithms=allowed)
            except (JoseError, ValueError) as first:
                if header.get("kid") and not isinstance(first, BadSignatureError):
                    await self.provider(refresh=True)  # keys rotated since they were read
                    token = jwt.decode(id_token, self._keys(), algorithms=allowed)
                else:
                    raise
        except BadSignatureError:
            raise SignInRefused("The ID token's signature does not verify.") from None
        except (JoseError, ValueError) as exc:
            raise SignInRefused(f"The ID token cannot be read ({type(exc).__name__}).") from None
        claims = CodeIDToken(
            token.claims,
            token.header,
            options={
                "iss": {"essential": True, "value": self.issuer},
                "aud": {"essential": True, "value": self.settings.oidc_client_id},
            },
            params={"nonce": nonce},
        )
        try:
            claims.validate(now=int(time.time()), leeway=LEEWAY_SECONDS)
        except JoseError as exc:
            raise SignInRefused(f"The ID token is refused: {_claim_words(exc)}.") from None
        return dict(claims)

    def _provider_algorithms(self) -> list[str]:
        held = self._provider
        listed = held.metadata.get("id_token_signing_alg_values_supported") if held else None
        return [str(a) for a in listed] if isinstance(listed, list) else ["RS256"]

    def _keys(self) -> KeySet:
        assert self._provider is not None
        return self._provider.keys

    def _approver(self, claims: dict[str, Any]) -> Any:
        """The approver the token names: by issuer and subject; or, for an approver added
        by email, by a verified email of this provider (their subject bound from then on)."""
        rows = self.people.rows
        subject = str(claims.get("sub", ""))
        approver = rows.by_identity(self.issuer, subject)
        email = claims.get("email")
        if approver is None and isinstance(email, str) and claims.get("email_verified") is True:
            waiting = rows.unbound_by_email(self.issuer, email)
            if waiting is not None and rows.bind_subject(waiting.id, subject):
                approver = rows.by_identity(self.issuer, subject)
        if approver is None:
            who = email if isinstance(email, str) else f"subject {subject}"
            raise SignInRefused(
                f"{who[:200]} signed in at the identity provider, but is not an approver here.",
                hint="The operator adds approvers: lockgate approvers add NAME --email ... "
                "--principal ...",
            )
        return approver


def _header(token: str) -> dict[str, Any]:
    """The JWS header, read without verifying anything (to refuse `none` up front)."""
    import base64
    import json

    first = token.split(".", 1)[0]
    try:
        decoded = json.loads(base64.urlsafe_b64decode(first + "=" * (-len(first) % 4)))
    except ValueError:
        raise SignInRefused("The ID token is not a JWT.") from None
    if not isinstance(decoded, dict):
        raise SignInRefused("The ID token is not a JWT.")
    return decoded
