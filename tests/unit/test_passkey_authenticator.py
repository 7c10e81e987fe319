"""The software passkey authenticator answers what the real `webauthn` library verifies, and
each of its defects is one that library refuses.

A registration and the authentications after it are verified by `verify_registration_response`
and `verify_authentication_response` exactly as a server calls them; the knobs (another origin
in the client data, the wrong key, a counter not advanced, a replayed answer) and a wrong
challenge are each refused, and the authenticator itself refuses what a browser would.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest
from webauthn import (
    generate_authentication_options,
    generate_registration_options,
    options_to_json,
    verify_authentication_response,
    verify_registration_response,
)
from webauthn.helpers import parse_attestation_object, parse_registration_credential_json
from webauthn.helpers.exceptions import InvalidAuthenticationResponse, InvalidRegistrationResponse
from webauthn.helpers.structs import (
    AttestationFormat,
    AuthenticatorSelectionCriteria,
    AuthenticatorTransport,
    CredentialDeviceType,
    PublicKeyCredentialDescriptor,
    ResidentKeyRequirement,
    UserVerificationRequirement,
)

from lockgate.simulation.passkey_authenticator import SoftAuthenticator, b64url, from_b64url

ORIGIN = "http://localhost:8000"
RP_ID = "localhost"
USER_ID = b"user-7f3a"


@dataclass
class Stored:
    """What a server keeps of a registered passkey."""

    credential_id: bytes
    public_key: bytes
    sign_count: int


def creation_options(
    challenge: bytes = b"registration-challenge",
    rp_id: str = RP_ID,
    user_id: bytes = USER_ID,
    exclude: list[bytes] | None = None,
) -> dict[str, Any]:
    options = generate_registration_options(
        rp_id=rp_id,
        rp_name="Lockgate",
        user_name="alice",
        user_id=user_id,
        challenge=challenge,
        authenticator_selection=AuthenticatorSelectionCriteria(
            resident_key=ResidentKeyRequirement.REQUIRED,
            user_verification=UserVerificationRequirement.REQUIRED,
        ),
        exclude_credentials=[PublicKeyCredentialDescriptor(id=i) for i in exclude or []],
    )
    parsed: dict[str, Any] = json.loads(options_to_json(options))
    return parsed


def request_options(
    challenge: bytes = b"authentication-challenge",
    rp_id: str = RP_ID,
    allow: list[bytes] | None = None,
) -> dict[str, Any]:
    options = generate_authentication_options(
        rp_id=rp_id,
        challenge=challenge,
        allow_credentials=[PublicKeyCredentialDescriptor(id=i) for i in allow or []],
        user_verification=UserVerificationRequirement.REQUIRED,
    )
    parsed: dict[str, Any] = json.loads(options_to_json(options))
    return parsed


def register(device: SoftAuthenticator, origin: str = ORIGIN, rp_id: str = RP_ID) -> Stored:
    challenge = b"registration-challenge"
    answer = device.register(creation_options(challenge, rp_id=rp_id), origin)
    verified = verify_registration_response(
        credential=answer,
        expected_challenge=challenge,
        expected_origin=origin,
        expected_rp_id=rp_id,
        require_user_verification=True,
    )
    return Stored(verified.credential_id, verified.credential_public_key, verified.sign_count)


def verify_sign_in(
    answer: dict[str, Any],
    stored: Stored,
    challenge: bytes = b"authentication-challenge",
    origin: str = ORIGIN,
    rp_id: str = RP_ID,
) -> int:
    """A server's check of a sign-in; returns the new sign count it would store."""
    verified = verify_authentication_response(
        credential=answer,
        expected_challenge=challenge,
        expected_origin=origin,
        expected_rp_id=rp_id,
        credential_public_key=stored.public_key,
        credential_current_sign_count=stored.sign_count,
        require_user_verification=True,
    )
    assert verified.credential_id == stored.credential_id
    assert verified.user_verified
    return verified.new_sign_count


def test_a_registration_is_verified_by_the_webauthn_library() -> None:
    device = SoftAuthenticator()
    challenge = b"a fresh registration challenge"
    answer = device.register(creation_options(challenge), ORIGIN)

    verified = verify_registration_response(
        credential=answer,
        expected_challenge=challenge,
        expected_origin=ORIGIN,
        expected_rp_id=RP_ID,
        require_user_verification=True,
    )

    [held] = device.credentials
    assert verified.credential_id == held.credential_id
    assert verified.credential_public_key == held.public_key_cose
    assert verified.fmt == AttestationFormat.NONE
    assert verified.aaguid == "00000000-0000-0000-0000-000000000000"
    assert verified.sign_count == 0
    assert verified.user_verified
    assert verified.credential_device_type == CredentialDeviceType.SINGLE_DEVICE
    assert (held.rp_id, held.user_handle) == (RP_ID, USER_ID)
    parsed = parse_registration_credential_json(answer)
    assert parsed.response.transports == [AuthenticatorTransport.INTERNAL]
    assert answer["authenticatorAttachment"] == "platform"
    assert answer["id"] == answer["rawId"] == b64url(held.credential_id)
    assert "=" not in answer["response"]["attestationObject"]
    attestation = parse_attestation_object(from_b64url(answer["response"]["attestationObject"]))
    assert attestation.att_stmt.sig is None and attestation.auth_data.flags.at
    client_data = json.loads(from_b64url(answer["response"]["clientDataJSON"]))
    assert client_data == {
        "type": "webauthn.create",
        "challenge": b64url(challenge),
        "origin": ORIGIN,
        "crossOrigin": False,
    }


def test_authentications_are_verified_and_the_sign_count_grows() -> None:
    device = SoftAuthenticator()
    stored = register(device)

    for n in range(1, 4):
        challenge = f"sign-in {n}".encode()
        answer = device.authenticate(request_options(challenge), ORIGIN)
        new_count = verify_sign_in(answer, stored, challenge)
        assert new_count > stored.sign_count
        stored.sign_count = new_count
        assert from_b64url(answer["response"]["userHandle"]) == USER_ID
        client_data = json.loads(from_b64url(answer["response"]["clientDataJSON"]))
        assert client_data["type"] == "webauthn.get"
    assert stored.sign_count == 3


def test_the_counter_starts_where_it_is_told() -> None:
    device = SoftAuthenticator(sign_count_start=41)
    stored = register(device)
    assert stored.sign_count == 41
    assert verify_sign_in(device.authenticate(request_options(), ORIGIN), stored) == 42


def test_allow_credentials_restricts_and_an_empty_list_is_discoverable() -> None:
    device = SoftAuthenticator()
    first = register(device)
    other = device.register(creation_options(user_id=b"another-user"), ORIGIN)
    other_id = from_b64url(other["rawId"])

    answer = device.authenticate(request_options(allow=[first.credential_id]), ORIGIN)
    assert from_b64url(answer["rawId"]) == first.credential_id
    verify_sign_in(answer, first)
    # Discoverable: the newest passkey for the rp id, with its user handle.
    answer = device.authenticate(request_options(), ORIGIN)
    assert from_b64url(answer["rawId"]) == other_id
    assert from_b64url(answer["response"]["userHandle"]) == b"another-user"

    with pytest.raises(ValueError, match="no usable credential"):
        device.authenticate(request_options(allow=[b"a credential it never made"]), ORIGIN)
    with pytest.raises(ValueError, match=r"no usable credential for rp id 'example\.com'"):
        device.authenticate(request_options(rp_id="example.com"), "https://example.com")


def test_exclude_credentials_is_honoured_and_a_user_reregistering_replaces_the_passkey() -> None:
    device = SoftAuthenticator()
    stored = register(device)
    with pytest.raises(ValueError, match="excludeCredentials"):
        device.register(creation_options(exclude=[stored.credential_id]), ORIGIN)
    assert len(device.credentials) == 1

    device.register(creation_options(exclude=[b"someone else's"]), ORIGIN)
    [held] = device.credentials
    assert held.credential_id != stored.credential_id


@pytest.mark.parametrize(
    ("rp_id", "origin", "why"),
    [
        ("localhost", "https://evil.example", "nor a registrable suffix"),
        ("example.com", "https://example.com.evil.example", "nor a registrable suffix"),
        ("com", "https://example.com", "nor a registrable suffix"),  # a public suffix
        # A single label counts as a public suffix.
        ("localhost", "http://app.localhost:8000", "nor a registrable suffix"),
        ("example.com", "http://example.com", "not a secure context"),
        ("127.0.0.1", "https://127.0.0.1", "is an IP address"),
        ("localhost", "http://localhost:8000/login", "is not an origin"),
    ],
)
def test_the_authenticator_refuses_an_rp_id_the_origin_may_not_claim(
    rp_id: str, origin: str, why: str
) -> None:
    device = SoftAuthenticator()
    with pytest.raises(ValueError, match=why):
        device.register(creation_options(rp_id=rp_id), origin)
    with pytest.raises(ValueError, match=why):
        device.authenticate(request_options(rp_id=rp_id), origin)
    assert device.credentials == ()


def test_a_registrable_suffix_of_the_host_is_a_valid_rp_id() -> None:
    device = SoftAuthenticator()
    origin = "https://login.example.com"
    stored = register(device, origin=origin, rp_id="example.com")
    answer = device.authenticate(request_options(rp_id="example.com"), origin)
    assert verify_sign_in(answer, stored, origin=origin, rp_id="example.com") == 1


@pytest.mark.parametrize(
    "other_origin", ["http://localhost:9000", "https://localhost:8000", "https://evil.example"]
)
def test_a_server_refuses_another_origin(other_origin: str) -> None:
    device = SoftAuthenticator()
    challenge = b"registration-challenge"
    answer = device.register(creation_options(challenge), ORIGIN, claimed_origin=other_origin)
    with pytest.raises(InvalidRegistrationResponse, match="origin"):
        verify_registration_response(
            credential=answer,
            expected_challenge=challenge,
            expected_origin=ORIGIN,
            expected_rp_id=RP_ID,
            require_user_verification=True,
        )

    stored = register(device)
    answer = device.authenticate(request_options(), ORIGIN, claimed_origin=other_origin)
    with pytest.raises(InvalidAuthenticationResponse, match="origin"):
        verify_sign_in(answer, stored)


def test_the_same_host_on_another_port_is_signed_and_refused_by_the_server() -> None:
    # Without a knob: the rp id is the host, so the device signs, and the origin gives it away.
    device = SoftAuthenticator()
    stored = register(device)
    answer = device.authenticate(request_options(), "http://localhost:9000")
    with pytest.raises(InvalidAuthenticationResponse, match="origin"):
        verify_sign_in(answer, stored)


def test_a_server_refuses_an_answer_to_another_challenge() -> None:
    device = SoftAuthenticator()
    answer = device.register(creation_options(b"an old challenge"), ORIGIN)
    with pytest.raises(InvalidRegistrationResponse, match="challenge"):
        verify_registration_response(
            credential=answer,
            expected_challenge=b"the current challenge",
            expected_origin=ORIGIN,
            expected_rp_id=RP_ID,
        )

    stored = register(device)
    answer = device.authenticate(request_options(b"an old challenge"), ORIGIN)
    with pytest.raises(InvalidAuthenticationResponse, match="challenge"):
        verify_sign_in(answer, stored, challenge=b"the current challenge")


def test_a_server_refuses_a_replayed_answer() -> None:
    device = SoftAuthenticator()
    stored = register(device)
    first = device.authenticate(request_options(), ORIGIN)
    stored.sign_count = verify_sign_in(first, stored)

    replayed = device.replay_last_authentication()
    assert replayed == first
    # Even a server that failed to retire the challenge refuses it: the count did not grow.
    with pytest.raises(InvalidAuthenticationResponse, match="sign count"):
        verify_sign_in(replayed, stored)
    # And one that issued a new challenge refuses it for that first.
    with pytest.raises(InvalidAuthenticationResponse, match="challenge"):
        verify_sign_in(replayed, stored, challenge=b"the next challenge")


def test_nothing_to_replay_before_an_authentication() -> None:
    device = SoftAuthenticator()
    register(device)
    with pytest.raises(ValueError, match="nothing to replay"):
        device.replay_last_authentication()


def test_a_server_refuses_a_counter_that_did_not_advance() -> None:
    device = SoftAuthenticator()
    stored = register(device)
    stored.sign_count = verify_sign_in(device.authenticate(request_options(), ORIGIN), stored)

    cloned = device.authenticate(request_options(b"next"), ORIGIN, stale_counter=True)
    with pytest.raises(InvalidAuthenticationResponse, match="sign count of 1 was not greater"):
        verify_sign_in(cloned, stored, challenge=b"next")
    # The device itself is unharmed: its next honest answer verifies.
    honest = device.authenticate(request_options(b"later"), ORIGIN)
    assert verify_sign_in(honest, stored, challenge=b"later") == 2


def test_a_server_refuses_a_signature_by_the_wrong_key() -> None:
    device = SoftAuthenticator()
    stored = register(device)
    answer = device.authenticate(request_options(), ORIGIN, wrong_key=True)
    with pytest.raises(InvalidAuthenticationResponse, match="Could not verify"):
        verify_sign_in(answer, stored)


def test_an_offer_without_es256_is_refused() -> None:
    options = creation_options()
    options["pubKeyCredParams"] = [{"type": "public-key", "alg": -257}]
    with pytest.raises(ValueError, match="ES256"):
        SoftAuthenticator().register(options, ORIGIN)
