"""Who decided a gated call, as its audit record names them (`machine/approval_audit.py`):
the door the decision came through, the actor, and the client it came from."""

from __future__ import annotations

from typing import Any

from mcp.server import ServerRequestContext
from pydantic import JsonValue

from lockgate.machine.approval_audit import Decider, Door


def client_of(ctx: ServerRequestContext[Any]) -> dict[str, JsonValue] | None:
    """The client's name and version as it told them (the 2025 handshake, or a 2026-07-28
    request's envelope)."""
    params = ctx.session.client_params
    info = params.client_info if params is not None else None
    if info is None:
        return None
    return {"name": info.name[:200], "version": info.version[:100]}


def by_resume(ctx: ServerRequestContext[Any], principal: str) -> Decider:
    return Decider(Door.RESUME, principal, client_of(ctx))


def by_client_prompt(ctx: ServerRequestContext[Any], principal: str) -> Decider:
    return Decider(Door.CLIENT_PROMPT, f"the person at {principal}'s client", client_of(ctx))


def by_key(principal: str) -> Decider:
    return Decider(Door.HTTP_API, principal)


def by_link(principal: str) -> Decider:
    return Decider(Door.APPROVAL_PAGE, f"the approval link for {principal}'s call")
