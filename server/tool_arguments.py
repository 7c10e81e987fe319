"""The arguments of the MCP surface's own tools, as the models that check them (the low-level
server passes arguments through unchecked), and a failed check in words."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError

#: The most answers one `resume` carries (a tool asks at most this many questions at once).
MAX_ANSWERS = 10


class ExecuteArguments(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    code: str = Field(min_length=1)
    idempotency_key: str | None = Field(
        default=None, alias="idempotencyKey", min_length=1, max_length=128
    )


class ResumeArguments(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    execution_id: str = Field(alias="executionId", min_length=1, max_length=64)
    action: Literal["accept", "decline", "cancel"] | None = None
    content: JsonValue = None
    #: Answers to what the paused call's tool asked its user, by question key.
    answers: dict[str, JsonValue] | None = Field(default=None, max_length=MAX_ANSWERS)


class DescribeArguments(BaseModel):
    model_config = ConfigDict(extra="forbid")
    query: str = Field(default="", max_length=200)


def problems(exc: ValidationError) -> str:
    """A validation failure in words, without echoing the values (they may be large)."""
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "arguments"
        parts.append(f"{where}: {err['msg']}")
    return "Invalid arguments: " + "; ".join(parts)
