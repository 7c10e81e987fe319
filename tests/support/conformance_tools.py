"""The official conformance suite's fixture tools, as a Python source an operator could
write (a `[[python]]` table of the sources file with `expose = "direct"`): the suite calls
them by name, as MCP tools, and each call runs through Lockgate's journal and policy like
any other. A test surface, never part of the server (tests/processes/test_conformance_suite.py).

Each tool answers what the suite's reference server answers (its everything-server), in the
typed parts agent code gets of an upstream MCP tool, which a direct tool answers as MCP
content.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from pydantic import JsonValue

from lockgate.machine.policy import PolicyDecision
from lockgate.machine.tools import Tool, ToolContext, ToolFailed, ToolSpec
from lockgate.machine.tools.spec import TaskSupport
from tests.support.conformance_questions import asking_tools

SOURCE = "conformance"
#: A 1x1 PNG and a minimal WAV, as the suite's reference server sends them.
IMAGE = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
)
AUDIO = "UklGRiYAAABXQVZFZm10IBAAAAABAAEAQB8AAAB9AAACABAAZGF0YQIAAAA="

#: slow_compute sleeps at most this long. Lockgate cancels a running call cooperatively (the
#: call finishes; the tasks extension allows that), and the suite asks for minute-long
#: computations it cancels at once: each would hold a worker for a minute for nothing.
SLOW_CAP_SECS = 3.0

#: The suite's JSON Schema 2020-12 fixture (SEP-1613, SEP-2106), which must be listed as is.
SCHEMA_2020_12: dict[str, JsonValue] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "$defs": {
        "address": {
            "$anchor": "addressDef",
            "type": "object",
            "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
        }
    },
    "properties": {
        "name": {"type": "string"},
        "address": {"$ref": "#/$defs/address"},
        "contactMethod": {"type": "string", "enum": ["phone", "email"]},
        "phone": {"type": "string"},
        "email": {"type": "string"},
    },
    "allOf": [{"anyOf": [{"required": ["phone"]}, {"required": ["email"]}]}],
    "if": {"properties": {"contactMethod": {"const": "phone"}}, "required": ["contactMethod"]},
    "then": {"required": ["phone"]},
    "else": {"required": ["email"]},
    "additionalProperties": False,
}


#: Each tool's arguments (any, but where the suite says which), and how it takes tasks.
NO_ARGUMENTS: dict[str, JsonValue] = {"type": "object", "properties": {}}
PARAMETERS: dict[str, dict[str, JsonValue]] = {
    "json_schema_2020_12_tool": SCHEMA_2020_12,
    "greet": {"type": "object", "properties": {"name": {"type": "string"}}},
    "test_header_param": {
        "type": "object",
        "properties": {"region": {"type": "string", "x-mcp-header": "Region"}},
        "required": ["region"],
    },
    "slow_compute": {
        "type": "object",
        "properties": {"seconds": {"type": "number", "minimum": 0}, "label": {"type": "string"}},
    },
}
TASKS = {
    "greet": TaskSupport.FORBIDDEN,
    "failing_job": TaskSupport.REQUIRED,
    "protocol_error_job": TaskSupport.REQUIRED,
}


def _resource(uri: str, mime_type: str, text: str) -> dict[str, JsonValue]:
    return {"type": "resource", "uri": uri, "mime_type": mime_type, "text": text}


def _failing(arguments: dict[str, JsonValue]) -> JsonValue:
    raise ToolFailed("This tool intentionally returns an error for testing")


def _broken(arguments: dict[str, JsonValue]) -> JsonValue:
    # Not an answer but a fault (anything but ToolFailed): a JSON-RPC internal error.
    raise RuntimeError("the job crashed")


def _slow(arguments: dict[str, JsonValue]) -> JsonValue:
    seconds = arguments.get("seconds", 0)
    time.sleep(min(float(seconds), SLOW_CAP_SECS) if isinstance(seconds, int | float) else 0)
    return f"computed {arguments.get('label', '')} in {seconds} s"


ANSWERS: dict[str, tuple[str, Callable[[dict[str, JsonValue]], JsonValue]]] = {
    "test_simple_text": (
        "Tests simple text content response",
        lambda _: "This is a simple text response for testing.",
    ),
    "test_image_content": (
        "Tests image content response",
        lambda _: [{"type": "image", "mime_type": "image/png", "data": IMAGE}],
    ),
    "test_audio_content": (
        "Tests audio content response",
        lambda _: [{"type": "audio", "mime_type": "audio/wav", "data": AUDIO}],
    ),
    "test_embedded_resource": (
        "Tests embedded resource content response",
        lambda _: [
            _resource(
                "test://embedded-resource", "text/plain", "This is an embedded resource content."
            )
        ],
    ),
    "test_multiple_content_types": (
        "Tests response with multiple content types (text, image, resource)",
        lambda _: [
            {"type": "text", "text": "Multiple content types test:"},
            {"type": "image", "mime_type": "image/png", "data": IMAGE},
            _resource(
                "test://mixed-content-resource", "application/json", '{"test":"data","value":123}'
            ),
        ],
    ),
    "test_error_handling": ("Tests error response handling", _failing),
    # The tasks scenarios' tools (SEP-2663).
    "greet": ("Greet someone (never a task)", lambda a: f"Hello, {a.get('name', 'world')}!"),
    "slow_compute": ("Compute for `seconds` (a task when long)", _slow),
    "failing_job": ("A job whose tool answers an error (always a task)", _failing),
    "protocol_error_job": ("A job that crashes (always a task)", _broken),
    # A parameter a balancer can route by: mirrored in an Mcp-Param-Region header (SEP-2243).
    "test_header_param": (
        "Tests a parameter carried in an Mcp-Param header too",
        lambda a: f"region {a.get('region')}",
    ),
    "json_schema_2020_12_tool": (
        "Tool with JSON Schema 2020-12 features",
        lambda arguments: f"Received: {arguments}",
    ),
}


@dataclass
class FixtureTool:
    spec: ToolSpec
    answer: Callable[[dict[str, JsonValue]], JsonValue]

    def call(self, arguments: dict[str, JsonValue], context: ToolContext) -> JsonValue:
        return self.answer(arguments)


@dataclass
class TalkingTool:
    """A tool that says things while it runs (log messages, progress), ~50 ms apart."""

    spec: ToolSpec
    steps: Callable[[ToolContext], list[Callable[[], None]]]
    done: str

    def call(self, arguments: dict[str, JsonValue], context: ToolContext) -> JsonValue:
        for number, step in enumerate(self.steps(context)):
            if number:
                time.sleep(0.05)
            step()
        return self.done


def _logging(context: ToolContext) -> list[Callable[[], None]]:
    said = ("Tool execution started", "Tool processing data", "Tool execution completed")
    return [partial(context.log, "info", text) for text in said]


def _progress(context: ToolContext) -> list[Callable[[], None]]:
    return [partial(context.progress, done, 100) for done in (0, 50, 100)]


CONFIRM_DELETE = ToolSpec(
    source=SOURCE,
    name="confirm_delete",
    description="Delete a file, once a person approved it",
    parameters={
        "type": "object",
        "properties": {"filename": {"type": "string", "minLength": 1}},
        "required": ["filename"],
        "additionalProperties": False,
    },
    default_policy=PolicyDecision.REQUIRE_APPROVAL,
)


@dataclass
class ConfirmDelete:
    """A write that needs a person's approval (the suite's confirm_delete): each deletion
    it makes is a line of `effects`, so a test can count them."""

    effects: Path | None
    spec: ToolSpec = field(default_factory=lambda: CONFIRM_DELETE)

    def call(self, arguments: dict[str, JsonValue], context: ToolContext) -> JsonValue:
        if self.effects is not None:
            with self.effects.open("a", encoding="utf-8") as made:
                made.write(f"{context.idempotency_key} {arguments['filename']}\n")
        return f"Deleted {arguments['filename']}."


@dataclass
class Reconnection:
    """The suite's test_reconnection: lets its request's stream go (SEP-1699) and answers;
    the client reconnects with Last-Event-ID for the answer."""

    spec: ToolSpec = field(
        default_factory=lambda: ToolSpec(
            source=SOURCE,
            name="test_reconnection",
            description="Closes its call's stream mid-call; the client polls for the answer",
            parameters=NO_ARGUMENTS,
            idempotent=True,
            default_policy=PolicyDecision.APPROVE,
        )
    )

    def call(self, arguments: dict[str, JsonValue], context: ToolContext) -> JsonValue:
        # The relay lets every notice out before the answer, so the stream is gone by the
        # time this answers: only the client's reconnect finds the answer.
        context.release_stream()
        return "Reconnection test completed successfully"


class ConformanceSource:
    name = SOURCE

    def __init__(self, effects: str | None = None) -> None:
        self._tools: list[Tool] = [
            FixtureTool(
                ToolSpec(
                    source=SOURCE,
                    name=name,
                    description=description,
                    parameters=PARAMETERS.get(name, NO_ARGUMENTS),
                    task_support=TASKS.get(name, TaskSupport.OPTIONAL),
                    idempotent=True,
                    default_policy=PolicyDecision.APPROVE,
                ),
                answer,
            )
            for name, (description, answer) in ANSWERS.items()
        ]
        self._tools.append(ConfirmDelete(Path(effects) if effects else None))
        self._tools.extend(asking_tools())
        self._tools.append(Reconnection())
        for name, steps, done in (
            ("test_tool_with_logging", _logging, "Logged three messages."),
            ("test_tool_with_progress", _progress, "Reported progress to 100 of 100."),
        ):
            spec = ToolSpec(
                source=SOURCE,
                name=name,
                description=f"Tests {name.removeprefix('test_tool_with_')} during a call",
                parameters=NO_ARGUMENTS,
                idempotent=True,
                default_policy=PolicyDecision.APPROVE,
            )
            self._tools.append(TalkingTool(spec, steps, done))

    def tools(self) -> Sequence[Tool]:
        return self._tools


def make_source(effects: str | None = None) -> ConformanceSource:
    """`effects`: a file where each deletion confirm_delete makes is written as a line."""
    return ConformanceSource(effects)
