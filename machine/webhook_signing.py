"""How a webhook event is signed: the Standard Webhooks scheme, by its own library.

Receivers verify with any Standard Webhooks library (`standardwebhooks.Webhook(secret)
.verify(body, headers)`): the `webhook-signature` header holds `v1,<base64 HMAC-SHA256>` of
`<webhook-id>.<webhook-timestamp>.<body>` under the secret. Several secrets (rotation) each
sign, their signatures space-separated, as the scheme allows: a receiver holding either one
verifies.
"""

from __future__ import annotations

import base64
import binascii
import secrets
from dataclasses import dataclass
from datetime import datetime

from pydantic import SecretStr
from standardwebhooks.webhooks import Webhook

PREFIX = "whsec_"
#: Bytes of a secret `make_secret` makes (the scheme asks for 24 to 64).
SECRET_BYTES = 32
MIN_SECRET_BYTES = 24


def make_secret() -> str:
    return PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()


def _decoded(secret: str) -> bytes:
    body = secret.strip().removeprefix(PREFIX)
    try:
        return base64.b64decode(body + "==", validate=False)
    except (binascii.Error, ValueError):
        return b""


def check_webhook_settings(url: str, secret: SecretStr | None) -> None:
    """Refuse a URL without a secret, a URL that is not HTTP, or a secret that is not a
    Standard Webhooks one; ValueError, as a settings validator raises."""
    if secret is not None and secret.get_secret_value().strip():
        for n, one in enumerate(secret.get_secret_value().split(","), start=1):
            if not one.strip().startswith(PREFIX) or len(_decoded(one)) < MIN_SECRET_BYTES:
                raise ValueError(
                    f"LOCKGATE_WEBHOOK_SECRET: secret {n} is not whsec_ followed by the base64 "
                    f"of at least {MIN_SECRET_BYTES} random bytes (make one with `lockgate "
                    "webhook secret`)"
                )
    elif url:
        raise ValueError(
            "LOCKGATE_WEBHOOK_URL is set without LOCKGATE_WEBHOOK_SECRET: events are only ever "
            "sent signed (make a secret with `lockgate webhook secret`)"
        )
    if url and not url.startswith(("http://", "https://")):
        raise ValueError("LOCKGATE_WEBHOOK_URL must be an http:// or https:// URL")


@dataclass(frozen=True)
class Signer:
    """Signs an event's body with every configured secret."""

    secrets: tuple[str, ...]

    @classmethod
    def from_setting(cls, secret: SecretStr | None) -> Signer:
        if secret is None:
            return cls(())
        return cls(tuple(s.strip() for s in secret.get_secret_value().split(",") if s.strip()))

    def headers(self, event_id: str, at: datetime, body: bytes) -> dict[str, str]:
        """The three Standard Webhooks headers for one attempt (its own timestamp: a
        receiver refuses one older than five minutes, so a retry is signed afresh)."""
        signatures = " ".join(Webhook(s).sign(event_id, at, body) for s in self.secrets)
        return {
            "webhook-id": event_id,
            "webhook-timestamp": str(int(at.timestamp())),
            "webhook-signature": signatures,
            "content-type": "application/json",
        }
