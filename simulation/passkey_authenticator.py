"""A software passkey (WebAuthn) authenticator: the stand-in for a person's authenticator.

The fault-injection simulator and the fast in-process tests sign in with passkeys through
this class instead of a browser; the real ceremony is tested in Chromium with its virtual
authenticator. It plays the browser and the authenticator together: it takes the JSON form of
the options a server sends (`webauthn.options_to_json(...)`, parsed) and answers with the
JSON form of the credential `navigator.credentials.create()` / `.get()` serialises to (what
`webauthn.verify_registration_response` / `verify_authentication_response` accept).

It is an ES256 (EC P-256) platform authenticator: attestation "none", user present and
verified on every ceremony, every credential discoverable, a signature counter per
credential. Like a browser it refuses an rp id the origin may not claim and a registration
`excludeCredentials` names a credential it holds. A few knobs make the defective answers a
server must refuse: `claimed_origin` (the client data names another origin), `wrong_key`
(signed with a key the server never saw), `stale_counter` (the counter not advanced, as a
cloned authenticator's) and `replay_last_authentication()` (the previous answer, verbatim).

It is never used by the server itself.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import ipaddress
import json
import secrets
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import cbor2
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

#: COSE algorithm identifier of ECDSA with SHA-256 on P-256, the only one this device has.
ES256 = -7
#: The AAGUID of an authenticator that does not say what it is (attestation "none").
AAGUID = bytes(16)
FLAG_UP = 0x01  # user present
FLAG_UV = 0x04  # user verified
FLAG_AT = 0x40  # attested credential data included
TRANSPORTS = ("internal",)


def b64url(data: bytes) -> str:
    """Base64url without padding, as WebAuthn's JSON forms carry bytes."""
    return base64.urlsafe_b64encode(data).decode("ascii").rstrip("=")


def from_b64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass
class Credential:
    """One passkey the device holds."""

    credential_id: bytes
    private_key: ec.EllipticCurvePrivateKey
    rp_id: str
    user_handle: bytes
    sign_count: int

    @property
    def public_key_cose(self) -> bytes:
        """The public key as a COSE_Key (what a server stores after registration)."""
        return cose_key(self.private_key.public_key())


def cose_key(public_key: ec.EllipticCurvePublicKey) -> bytes:
    """An EC2 P-256 public key as a COSE_Key: {kty: EC2, alg: ES256, crv: P-256, x, y}."""
    point = public_key.public_bytes(
        serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
    )
    x, y = point[1:33], point[33:65]
    return cbor2.dumps({1: 2, 3: ES256, -1: 1, -2: x, -3: y})


def origin_host(origin: str) -> str:
    """The host of a secure-context origin (https, or http on localhost), refused otherwise."""
    parts = urlsplit(origin)
    host = (parts.hostname or "").lower()
    if not host or parts.path or parts.query or parts.fragment:
        raise ValueError(f"origin {origin!r} is not an origin (scheme://host[:port])")
    local = host == "localhost" or host.endswith(".localhost")
    if not (parts.scheme == "https" or (parts.scheme == "http" and local)):
        raise ValueError(
            f"origin {origin!r} is not a secure context: WebAuthn needs https "
            "(or http on localhost)"
        )
    return host


def check_rp_id(rp_id: str, origin: str) -> None:
    """Refuse an rp id the origin may not claim: it must be the origin's host or a registrable
    suffix of it. Without a public suffix list, a single-label rp id (`com`) counts as a public
    suffix unless it is the host itself (`localhost`)."""
    host = origin_host(origin)
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        pass
    else:
        raise ValueError(f"origin {origin!r} is an IP address, which cannot be an rp id")
    if rp_id == host or ("." in rp_id and host.endswith("." + rp_id)):
        return
    raise ValueError(
        f"rp id {rp_id!r} is neither the host of origin {origin!r} nor a registrable suffix "
        "of it (a browser refuses with SecurityError)"
    )


def client_data(kind: str, challenge: str, origin: str) -> bytes:
    """clientDataJSON as a browser serialises it (compact, in this key order)."""
    collected = {"type": kind, "challenge": challenge, "origin": origin, "crossOrigin": False}
    return json.dumps(collected, separators=(",", ":")).encode()


class SoftAuthenticator:
    """One authenticator device: the passkeys it holds and their counters.

    `sign_count_start` is every new credential's counter at registration; each authentication
    adds one before signing. (A counter that stays 0 is what synced passkeys report; a server
    then cannot detect clones, and `stale_counter` is accepted by it, as the spec says.)
    """

    def __init__(self, *, sign_count_start: int = 0) -> None:
        if not 0 <= sign_count_start < 2**32:
            raise ValueError("sign_count_start must fit in 4 bytes")
        self.sign_count_start = sign_count_start
        self._credentials: list[Credential] = []
        self._last_authentication: dict[str, Any] | None = None

    @property
    def credentials(self) -> tuple[Credential, ...]:
        """The passkeys held, oldest first."""
        return tuple(self._credentials)

    def register(
        self, options: dict[str, Any], origin: str, *, claimed_origin: str | None = None
    ) -> dict[str, Any]:
        """Create a passkey from PublicKeyCredentialCreationOptions in JSON form; answer with the
        registration credential's JSON form.

        `origin` is the page's origin (the rp id is checked against it); `claimed_origin`, if
        given, is what clientDataJSON names instead (a defective or lying client).
        """
        rp_id = options.get("rp", {}).get("id") or origin_host(origin)
        check_rp_id(rp_id, origin)
        params = options.get("pubKeyCredParams", [])
        if params and not any(
            p.get("type") == "public-key" and p.get("alg") == ES256 for p in params
        ):
            raise ValueError(
                "pubKeyCredParams does not offer ES256 (-7), the only algorithm this "
                "authenticator has (a browser refuses with NotSupportedError)"
            )
        held = {c.credential_id for c in self._credentials if c.rp_id == rp_id}
        for excluded in options.get("excludeCredentials") or []:
            if from_b64url(excluded["id"]) in held:
                raise ValueError(
                    f"this authenticator already holds credential {excluded['id']} for rp id "
                    f"{rp_id!r}, which excludeCredentials names (a browser refuses with "
                    "InvalidStateError)"
                )
        user_handle = from_b64url(options["user"]["id"])
        # A discoverable credential replaces the one held for the same rp id and user.
        self._credentials = [
            c for c in self._credentials if (c.rp_id, c.user_handle) != (rp_id, user_handle)
        ]
        credential = Credential(
            credential_id=secrets.token_bytes(32),
            private_key=ec.generate_private_key(ec.SECP256R1()),
            rp_id=rp_id,
            user_handle=user_handle,
            sign_count=self.sign_count_start,
        )
        self._credentials.append(credential)
        cred_id = credential.credential_id
        attested = AAGUID + len(cred_id).to_bytes(2, "big") + cred_id + credential.public_key_cose
        auth_data = (
            hashlib.sha256(rp_id.encode()).digest()
            + bytes([FLAG_UP | FLAG_UV | FLAG_AT])
            + credential.sign_count.to_bytes(4, "big")
            + attested
        )
        attestation = cbor2.dumps({"fmt": "none", "attStmt": {}, "authData": auth_data})
        public_key = credential.private_key.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        data = client_data("webauthn.create", options["challenge"], claimed_origin or origin)
        return {
            "id": b64url(cred_id),
            "rawId": b64url(cred_id),
            "type": "public-key",
            "response": {
                "clientDataJSON": b64url(data),
                "attestationObject": b64url(attestation),
                "transports": list(TRANSPORTS),
                # What a browser's toJSON() adds (servers may ignore them).
                "authenticatorData": b64url(auth_data),
                "publicKey": b64url(public_key),
                "publicKeyAlgorithm": ES256,
            },
            "clientExtensionResults": {},
            "authenticatorAttachment": "platform",
        }

    def authenticate(
        self,
        options: dict[str, Any],
        origin: str,
        *,
        claimed_origin: str | None = None,
        wrong_key: bool = False,
        stale_counter: bool = False,
    ) -> dict[str, Any]:
        """Sign in with a held passkey from PublicKeyCredentialRequestOptions in JSON form; answer
        with the authentication credential's JSON form.

        The passkey is the newest one held for the rp id, among `allowCredentials` when that is
        non-empty (any discoverable one otherwise). Knobs for a server's refusals:
        `claimed_origin` names another origin in clientDataJSON, `wrong_key` signs with a fresh
        key the server never registered, `stale_counter` signs the counter without advancing it.
        """
        rp_id = options.get("rpId") or origin_host(origin)
        check_rp_id(rp_id, origin)
        credential = self._pick(rp_id, options.get("allowCredentials") or [])
        if not stale_counter:
            credential.sign_count = (credential.sign_count + 1) % 2**32
        auth_data = (
            hashlib.sha256(rp_id.encode()).digest()
            + bytes([FLAG_UP | FLAG_UV])
            + credential.sign_count.to_bytes(4, "big")
        )
        data = client_data("webauthn.get", options["challenge"], claimed_origin or origin)
        key = ec.generate_private_key(ec.SECP256R1()) if wrong_key else credential.private_key
        signature = key.sign(auth_data + hashlib.sha256(data).digest(), ec.ECDSA(hashes.SHA256()))
        answer: dict[str, Any] = {
            "id": b64url(credential.credential_id),
            "rawId": b64url(credential.credential_id),
            "type": "public-key",
            "response": {
                "clientDataJSON": b64url(data),
                "authenticatorData": b64url(auth_data),
                "signature": b64url(signature),
                "userHandle": b64url(credential.user_handle),
            },
            "clientExtensionResults": {},
            "authenticatorAttachment": "platform",
        }
        self._last_authentication = answer
        return copy.deepcopy(answer)

    def replay_last_authentication(self) -> dict[str, Any]:
        """The previous authentication's answer again, byte for byte (a replay attack)."""
        if self._last_authentication is None:
            raise ValueError("this authenticator has not authenticated yet: nothing to replay")
        return copy.deepcopy(self._last_authentication)

    def _pick(self, rp_id: str, allowed: list[dict[str, Any]]) -> Credential:
        candidates = [c for c in self._credentials if c.rp_id == rp_id]
        if allowed:
            allowed_ids = {from_b64url(d["id"]) for d in allowed}
            candidates = [c for c in candidates if c.credential_id in allowed_ids]
        if not candidates:
            which = "none of allowCredentials" if allowed else "no credential at all"
            raise ValueError(
                f"this authenticator holds no usable credential for rp id {rp_id!r} "
                f"({which}; a browser reports NotAllowedError)"
            )
        return candidates[-1]
