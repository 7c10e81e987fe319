"""The settings of tools' outbound calls: their bounds, and where a principal's sources may go.

A part of `Settings` (`machine/settings.py`, which inherits these), kept apart so each file
holds one concern; the variables are read the same way (`LOCKGATE_` prefix).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings


class OutboundSettings(BaseSettings):
    http_timeout_secs: float = Field(
        default=30.0,
        gt=0,
        description="How long a tool's outbound HTTP call (and fetching a source's document) "
        "may take in all (connect, headers and body together) before it fails.",
    )
    http_max_response_bytes: int = Field(
        default=1024 * 1024,
        ge=1,
        description="The largest HTTP response a tool call reads; a larger one fails the call.",
    )
    max_source_document_bytes: int = Field(
        default=16 * 1024 * 1024,
        ge=1024,
        description="The largest document (OpenAPI, GraphQL schema) a source a principal adds "
        "may be fetched from, and the most any stored source may keep once settled; beyond it "
        "the add is refused before anyone is asked to approve it.",
    )
    http_max_redirects: int = Field(
        default=5,
        ge=0,
        description="Redirects an outbound HTTP call follows before it fails.",
    )
    source_allowed_networks: str = Field(
        default="",
        description="Networks (CIDRs, comma-separated, e.g. '10.1.2.0/24') the sources a "
        "principal adds may reach besides public addresses. Empty: loopback, private, "
        "link-local, multicast and metadata addresses are refused to them, checked on the "
        "resolved address of every connection. The operator's sources reach what they name.",
    )

    catalogue_dir: Path | None = Field(
        default_factory=lambda: _cache_home() / "lockgate" / "catalogues",
        description="Where the tools built from the operator's OpenAPI documents are kept, "
        "under each document's digest, so a restart serves a large API without reading its "
        "document again (GitHub's: seconds). Empty: built at every start.",
        json_schema_extra={"shown_default": "$XDG_CACHE_HOME/lockgate/catalogues"},
    )

    @field_validator("catalogue_dir", mode="before")
    @classmethod
    def _no_catalogues(cls, value: object) -> object:
        return None if value == "" else value

    @field_validator("source_allowed_networks")
    @classmethod
    def _networks(cls, text: str) -> str:
        from lockgate.machine.tools.outbound import Reach

        try:
            Reach.of_setting(text)
        except ValueError as exc:
            raise ValueError(f"LOCKGATE_SOURCE_ALLOWED_NETWORKS: {exc}") from None
        return text

    @property
    def allowed_networks(self) -> tuple[Any, ...]:
        from lockgate.machine.tools.outbound import Reach

        return Reach.of_setting(self.source_allowed_networks)


def _cache_home() -> Path:
    """Where a user's caches go (the XDG base directory convention)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
