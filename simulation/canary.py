"""A tool source that leaks its secret, so the secret invariant can fail.

An honest tool never puts its credential in what it returns, so "the secret appears
nowhere" holds for it whether or not the engine scrubs anything. These tools do what a
careless upstream does: echo the token in a result, quote it in an error message, and raise
an unexpected exception whose text holds it. Only the engine's scrubbing (and its refusal to
log an unexpected exception's message) keeps the secret out of the database and the logs, so
the invariant now proves the scrubbing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import JsonValue

from lockgate.machine.policy import PolicyDecision
from lockgate.machine.tools.registry import Tool, ToolContext, ToolFailed, ToolSpec

SOURCE = "canary"
TOKEN_SECRET = "canary_token"


def _spec(name: str, description: str, returns: str) -> ToolSpec:
    return ToolSpec(
        source=SOURCE,
        name=name,
        description=description,
        returns=returns,
        idempotent=True,
        default_policy=PolicyDecision.APPROVE,
        secrets=(TOKEN_SECRET,),
    )


ECHO = _spec("echo", "Returns its token, in a field and inside a sentence.", "dict")
REJECT = _spec("reject", "Fails with its token quoted in the error message.", "None")
BREAK = _spec("explode", "Raises an unexpected exception whose text is its token.", "None")


def _token(context: ToolContext) -> str:
    token = context.secrets.get(TOKEN_SECRET)
    if not token:
        raise ToolFailed(f"the canary needs the secret {TOKEN_SECRET!r}")
    return token


@dataclass(frozen=True)
class _Echo:
    spec: ToolSpec = ECHO

    def call(self, arguments: dict[str, JsonValue], context: ToolContext) -> JsonValue:
        token = _token(context)
        return {"token": token, "said": f"authenticated with {token}", "nested": [{"t": token}]}


@dataclass(frozen=True)
class _Reject:
    spec: ToolSpec = REJECT

    def call(self, arguments: dict[str, JsonValue], context: ToolContext) -> JsonValue:
        raise ToolFailed(f"upstream rejected the token {_token(context)} (HTTP 401)")


@dataclass(frozen=True)
class _Explode:
    spec: ToolSpec = BREAK

    def call(self, arguments: dict[str, JsonValue], context: ToolContext) -> JsonValue:
        raise ValueError(f"token={_token(context)}")


class CanarySource:
    """The `canary` tools: auto-approved and idempotent, each leaking `canary_token`."""

    name = SOURCE

    def tools(self) -> Sequence[Tool]:
        return [_Echo(), _Reject(), _Explode()]


#: Agent code that calls every leaking tool and returns what it got, the errors included.
LEAKING_CODE = (
    "got = [tools.canary.echo()]\n"
    "try:\n    tools.canary.reject()\nexcept RuntimeError as e:\n    got.append(str(e))\n"
    "try:\n    tools.canary.explode()\nexcept RuntimeError as e:\n    got.append(str(e))\n"
    "print(got)\n"
    "got"
)
