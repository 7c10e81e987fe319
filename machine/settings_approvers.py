"""The settings of people who approve: how they sign in, and how long a sign-in lasts.

A part of `Settings` (`machine/settings.py`, which inherits these), kept apart so each file
holds one concern; the variables are read the same way (`LOCKGATE_` prefix).
"""

from __future__ import annotations

from datetime import timedelta

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings


class ApproverSettings(BaseSettings):
    oidc_issuer: str = Field(
        default="",
        description="The OpenID Connect provider approvers sign in with (its issuer URL, e.g. "
        "https://accounts.google.com; its /.well-known/openid-configuration is read). Unset: "
        "people sign in with passkeys only.",
    )
    oidc_client_id: str = Field(
        default="", description="This server's client id at the OpenID provider."
    )
    oidc_client_secret: SecretStr | None = Field(
        default=None,
        description="This server's client secret at the OpenID provider (the redirect URI to "
        "register there is <public URL>/signin/oidc/callback).",
    )
    oidc_scopes: str = Field(
        default="openid email profile",
        description="The scopes asked of the OpenID provider (openid is always asked).",
    )
    oidc_provider_name: str = Field(
        default="your identity provider",
        description="How the sign-in page names the OpenID provider (e.g. Okta).",
    )
    approver_session_ttl: timedelta = Field(
        default=timedelta(hours=12),
        description="How long a person stays signed in to decide approvals (then they sign in "
        "again). `lockgate approvers sign-out` ends sessions sooner.",
    )
    enrolment_ttl: timedelta = Field(
        default=timedelta(hours=24),
        description="How long a passkey enrolment link printed by `lockgate approvers add` "
        "(or `enrol`) can be used.",
    )

    @property
    def oidc_configured(self) -> bool:
        return bool(self.oidc_issuer and self.oidc_client_id)
