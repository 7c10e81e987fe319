"""Passkeys (WebAuthn, the `webauthn` package): registered through an enrolment link, then
used to sign in, for a person with no identity provider.

The relying party is this server's public host (`localhost` by default: WebAuthn refuses
an IP address), and the expected origin its public URL. Each ceremony's challenge is a
sign-in challenge row, taken (deleted) by the answer that uses it, so an answer counts once
and on any instance. User verification is required: the authenticator checks that it is
its owner (a PIN or a biometric), not only that someone touched it.

`webauthn` is imported by the ceremonies that use it, not with this module: it is a tenth of
a boot's imports, and only a person signing in needs it.
"""

from __future__ import annotations

import json
import secrets
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

from pydantic import JsonValue

from lockgate.machine.errors import ErrorCode, LockgateError
from lockgate.machine.people import Issued, NewPasskey, People

#: How long a person has to answer their authenticator's prompt.
CEREMONY = timedelta(minutes=5)
REGISTER, SIGN_IN = "passkey_register", "passkey_sign_in"


class SignInRefused(LockgateError):
    """A sign-in (or a registration) that did not prove who the person is."""

    code = ErrorCode.FORBIDDEN


class Passkeys:
    def __init__(self, people: People) -> None:
        self.people = people
        settings = people.settings
        parts = urlsplit(settings.base_url)
        self.origin = f"{parts.scheme}://{parts.netloc}"
        self.rp_id = parts.hostname or "localhost"

    def _challenge(self, kind: str, data: dict[str, JsonValue]) -> tuple[str, bytes]:
        from webauthn.helpers import bytes_to_base64url

        challenge = secrets.token_bytes(32)
        data = {**data, "challenge": bytes_to_base64url(challenge)}
        return self.people.challenges.begin(kind, data, CEREMONY), challenge

    def _take(self, challenge_id: object, kind: str) -> dict[str, JsonValue]:
        data = self.people.challenges.finish(challenge_id, kind)
        if data is None:
            raise SignInRefused(
                "This passkey prompt was answered already, or it expired.",
                hint="Start again from the page.",
            )
        return data

    # -- registration, through an enrolment link ------------------------------------------

    def registration_options(self, token: str) -> dict[str, Any]:
        from webauthn import generate_registration_options, options_to_json
        from webauthn.helpers import base64url_to_bytes
        from webauthn.helpers.structs import (
            AuthenticatorSelectionCriteria,
            PublicKeyCredentialDescriptor,
            ResidentKeyRequirement,
            UserVerificationRequirement,
        )

        enrolment, approver = self.people.enrolment(token)
        held = self.people.rows.passkeys_of(approver.id)
        row_id, challenge = self._challenge(REGISTER, {"enrolment": enrolment.id})
        options = generate_registration_options(
            rp_id=self.rp_id,
            rp_name="Lockgate",
            user_id=base64url_to_bytes(approver.subject or ""),
            user_name=approver.email or approver.name,
            user_display_name=approver.name,
            challenge=challenge,
            authenticator_selection=AuthenticatorSelectionCriteria(
                resident_key=ResidentKeyRequirement.REQUIRED,
                user_verification=UserVerificationRequirement.REQUIRED,
            ),
            exclude_credentials=[
                PublicKeyCredentialDescriptor(id=base64url_to_bytes(p.id)) for p in held
            ],
        )
        return {"challenge": row_id, "publicKey": json.loads(options_to_json(options))}

    def register(self, token: str, challenge_id: object, credential: object) -> Issued:
        """Verify the authenticator's answer, then store the passkey, use the link and sign
        the person in (`People.complete_enrolment`)."""
        from webauthn import verify_registration_response
        from webauthn.helpers import base64url_to_bytes, bytes_to_base64url
        from webauthn.helpers.exceptions import WebAuthnException

        enrolment, _ = self.people.enrolment(token)
        data = self._take(challenge_id, REGISTER)
        if data.get("enrolment") != enrolment.id:
            raise SignInRefused("This passkey prompt was for another enrolment link.")
        if not isinstance(credential, dict):
            raise SignInRefused("The registration is not a passkey's answer.")
        try:
            verified = verify_registration_response(
                credential=credential,
                expected_challenge=base64url_to_bytes(str(data["challenge"])),
                expected_origin=self.origin,
                expected_rp_id=self.rp_id,
                require_user_verification=True,
            )
        except (WebAuthnException, ValueError, KeyError, TypeError) as exc:
            raise SignInRefused(
                f"The passkey could not be registered: {str(exc)[:200]}",
                hint="Try again from the enrolment page on this server's own address.",
            ) from None
        response = credential.get("response")
        transports = response.get("transports") if isinstance(response, dict) else None
        return self.people.complete_enrolment(
            token,
            NewPasskey(
                credential_id=bytes_to_base64url(verified.credential_id),
                public_key=verified.credential_public_key,
                sign_count=verified.sign_count,
                transports=[str(t) for t in transports] if isinstance(transports, list) else [],
            ),
        )

    # -- signing in -----------------------------------------------------------------------

    def sign_in_options(self) -> dict[str, Any]:
        from webauthn import generate_authentication_options, options_to_json
        from webauthn.helpers.structs import UserVerificationRequirement

        row_id, challenge = self._challenge(SIGN_IN, {})
        options = generate_authentication_options(
            rp_id=self.rp_id,
            challenge=challenge,
            user_verification=UserVerificationRequirement.REQUIRED,
        )
        return {"challenge": row_id, "publicKey": json.loads(options_to_json(options))}

    def sign_in(self, challenge_id: object, credential: object) -> Issued:
        from webauthn import verify_authentication_response
        from webauthn.helpers import base64url_to_bytes
        from webauthn.helpers.exceptions import WebAuthnException

        data = self._take(challenge_id, SIGN_IN)
        raw_id = credential.get("rawId") if isinstance(credential, dict) else None
        passkey = self.people.rows.passkey(raw_id) if isinstance(raw_id, str) else None
        if passkey is None:
            raise SignInRefused(
                "This passkey is not registered here.",
                hint="Use the passkey you created with your enrolment link, or ask the "
                "operator for a new link: lockgate approvers enrol <approver id>.",
            )
        try:
            verified = verify_authentication_response(
                credential=credential,  # type: ignore[arg-type]
                expected_challenge=base64url_to_bytes(str(data["challenge"])),
                expected_rp_id=self.rp_id,
                expected_origin=self.origin,
                credential_public_key=passkey.public_key,
                credential_current_sign_count=passkey.sign_count,
                require_user_verification=True,
            )
        except (WebAuthnException, ValueError, KeyError, TypeError) as exc:
            raise SignInRefused(
                f"The passkey did not prove who you are: {str(exc)[:200]}",
                hint="Try again from the sign-in page on this server's own address.",
            ) from None
        approver = self.people.rows.approver(passkey.approver_id)
        if approver is None:
            raise SignInRefused("The approver this passkey belonged to was removed.")
        self.people.rows.passkey_used(passkey.id, verified.new_sign_count, self.people.clock())
        return self.people.open_session(approver, "passkey")
