"""The settings of the webhook outbox: where approval events go, signed how, retried how.

A part of `Settings` (`machine/settings.py`, which inherits these), kept apart so each file
holds one concern; the variables are read the same way (`LOCKGATE_` prefix).
"""

from __future__ import annotations

from datetime import timedelta

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings


class WebhookSettings(BaseSettings):
    webhook_url: str = Field(
        default="",
        description="An endpoint POSTed a signed event (Standard Webhooks: webhook-id, "
        "webhook-timestamp, webhook-signature headers) when a call needs approval and before "
        "an approval expires, retried with backoff from a durable outbox. Unset: no events.",
    )
    webhook_secret: SecretStr | None = Field(
        default=None,
        description="The webhook signing secret(s), `whsec_<base64>`, comma-separated: each "
        "signs (send both while a receiver rotates). Required with LOCKGATE_WEBHOOK_URL. Make "
        "one with `lockgate webhook secret`.",
    )
    webhook_timeout: timedelta = Field(
        default=timedelta(seconds=10), description="A webhook attempt's bound."
    )
    webhook_retry_base: timedelta = Field(
        default=timedelta(seconds=2),
        description="The first retry's delay; each next one doubles, up to an hour.",
    )
    webhook_concurrency: int = Field(
        default=8,
        ge=1,
        le=64,
        description="How many events one instance sends at once: a slow receiver holds one "
        "attempt (up to LOCKGATE_WEBHOOK_TIMEOUT, its whole bound), not the others.",
    )
    webhook_max_attempts: int = Field(
        default=16, ge=1, description="Attempts before an event is abandoned."
    )
    approval_warning: timedelta = Field(
        default=timedelta(minutes=15),
        description="How long before an approval expires its warning goes out (a webhook "
        "event). 0: no warning.",
    )

    @model_validator(mode="after")
    def _webhook_signed(self) -> WebhookSettings:
        """Events only ever go out signed, each secret a Standard Webhooks one (the
        messages never show a secret)."""
        from lockgate.machine.webhook_signing import check_webhook_settings

        check_webhook_settings(self.webhook_url, self.webhook_secret)
        return self
