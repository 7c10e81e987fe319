"""The client a decision came from, as its audit record names it (`machine/approval_audit.py`;
the rest of the record is made once, by the decision entry: `server/decisions.py`)."""

from __future__ import annotations

from typing import Any

from mcp.server import ServerRequestContext
from pydantic import JsonValue


def client_of(ctx: ServerRequestContext[Any]) -> dict[str, JsonValue] | None:
    """The client's name and version as it told them (the 2025 handshake, or a 2026-07-28
    request's envelope)."""
    params = ctx.session.client_params
    info = params.client_info if params is not None else None
    if info is None:
        return None
    return {"name": info.name[:200], "version": info.version[:100]}
