"""The `desk` tools: a tool that asks its user before it acts (`ToolContext.ask`), for the
scenarios of a call paused on questions.

`desk.compose(key)` asks two things at once, the note's text and a tag, then writes the note
through the notes' own `write` (so its effect is counted in the notes' log, by the call's
idempotency key, like any write). A write, not idempotent, approved by policy: only the
user's answers stand between the call and its effect.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import JsonValue

from lockgate.machine.policy import PolicyDecision
from lockgate.machine.tools import Tool, ToolContext, ToolSpec
from lockgate.machine.tools.notes import NotesSource
from lockgate.machine.tools.questions import Question

SOURCE = "desk"
TEXT: dict[str, JsonValue] = {
    "type": "object",
    "properties": {"text": {"type": "string"}},
    "required": ["text"],
}
TAG: dict[str, JsonValue] = {"type": "object", "properties": {"tag": {"type": "string"}}}
COMPOSE = ToolSpec(
    source=SOURCE,
    name="compose",
    description="Ask the user what the note under key says, and a tag; then write it.",
    parameters={
        "type": "object",
        "properties": {"key": {"type": "string"}},
        "required": ["key"],
        "additionalProperties": False,
    },
    returns="dict",
    asks=True,
    default_policy=PolicyDecision.APPROVE,
)


def text_answer(text: str) -> dict[str, JsonValue]:
    return {"action": "accept", "content": {"text": text}}


def tag_answer(tag: str) -> dict[str, JsonValue]:
    return {"action": "accept", "content": {"tag": tag}}


@dataclass(frozen=True)
class _Compose:
    write: Tool
    spec: ToolSpec = COMPOSE

    def call(self, arguments: dict[str, JsonValue], context: ToolContext) -> JsonValue:
        asked = context.ask(
            {
                "text": Question("What should the note say?", TEXT),
                "tag": Question("How should it be tagged?", TAG),
            }
        )
        text = (asked["text"].content or {}).get("text")
        tag = (asked["tag"].content or {}).get("tag", "")
        note = f"{text} #{tag}"
        self.write.call({"key": arguments["key"], "text": note}, context)
        return {"key": arguments["key"], "text": note}


class DeskSource:
    name = SOURCE

    def __init__(self, notes: NotesSource) -> None:
        self._write = next(t for t in notes.tools() if t.spec.name == "write")

    def tools(self) -> Sequence[Tool]:
        return [_Compose(self._write)]
