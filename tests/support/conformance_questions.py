"""The conformance suite's fixture tools that ask their user for values (`ToolContext.ask`),
as an operator's Python source would write them: each asks through Lockgate's durable
questions (the call's execution waits for the answers, on any instance, after any restart),
and answers what the suite's reference server answers.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import JsonValue

from lockgate.machine.policy import PolicyDecision
from lockgate.machine.tools import ToolContext, ToolSpec
from lockgate.machine.tools.questions import Answer, Question
from lockgate.machine.tools.spec import TaskSupport

SOURCE = "conformance"


def _form(**fields: JsonValue) -> dict[str, JsonValue]:
    return {"type": "object", "properties": dict(fields)}


def _required(schema: dict[str, JsonValue], *names: str) -> dict[str, JsonValue]:
    return {**schema, "required": list(names)}


NAME = _required(_form(name={"type": "string"}), "name")
DEFAULTS = _form(
    name={"type": "string", "description": "User name", "default": "John Doe"},
    age={"type": "integer", "description": "User age", "default": 30},
    score={"type": "number", "description": "User score", "default": 95.5},
    status={
        "type": "string",
        "description": "User status",
        "enum": ["active", "inactive", "pending"],
        "default": "active",
    },
    verified={"type": "boolean", "description": "Verification status", "default": True},
)
ENUMS = _form(
    untitledSingle={"type": "string", "enum": ["option1", "option2", "option3"]},
    titledSingle={
        "type": "string",
        "oneOf": [
            {"const": "value1", "title": "First Option"},
            {"const": "value2", "title": "Second Option"},
            {"const": "value3", "title": "Third Option"},
        ],
    },
    legacyEnum={
        "type": "string",
        "enum": ["opt1", "opt2", "opt3"],
        "enumNames": ["Option One", "Option Two", "Option Three"],
    },
    untitledMulti={
        "type": "array",
        "items": {"type": "string", "enum": ["option1", "option2", "option3"]},
    },
    titledMulti={
        "type": "array",
        "items": {
            "anyOf": [
                {"const": "value1", "title": "First Choice"},
                {"const": "value2", "title": "Second Choice"},
                {"const": "value3", "title": "Third Choice"},
            ]
        },
    },
)


def _said(answer: Answer) -> str:
    return f"action={answer.action}, content={json.dumps(answer.content)}"


def _name(answer: Answer) -> str:
    return str((answer.content or {}).get("name", "")) if answer.accepted else "nobody"


def _elicitation(arguments: dict[str, JsonValue], context: ToolContext) -> JsonValue:
    contact = _required(
        _form(
            username={"type": "string", "description": "User's response"},
            email={"type": "string", "description": "User's email address"},
        ),
        "username",
        "email",
    )
    asked = context.ask({"response": Question(str(arguments["message"]), contact)})
    answer = asked["response"]
    return f"User response: <action: {answer.action}, content: {json.dumps(answer.content)}>"


def _defaults(arguments: dict[str, JsonValue], context: ToolContext) -> JsonValue:
    message = "Test client default value handling - please accept with defaults"
    answer = context.ask({"defaults": Question(message, DEFAULTS)})["defaults"]
    return f"Elicitation completed: {_said(answer)}"


def _enums(arguments: dict[str, JsonValue], context: ToolContext) -> JsonValue:
    answer = context.ask({"enums": Question("Pick from the options", ENUMS)})["enums"]
    return f"Elicitation completed: {_said(answer)}"


def _hello(arguments: dict[str, JsonValue], context: ToolContext) -> JsonValue:
    answer = context.ask({"user_name": Question("What is your name?", NAME)})["user_name"]
    return f"Hello, {_name(answer)}!"


def _confirmed(arguments: dict[str, JsonValue], context: ToolContext) -> JsonValue:
    ok = _required(_form(ok={"type": "boolean"}), "ok")
    answer = context.ask({"confirm": Question("Please confirm", ok)})["confirm"]
    # Reached only with the answers of a requestState the server unsealed and checked.
    return f"state-ok: {_said(answer)}"


def _two_rounds(arguments: dict[str, JsonValue], context: ToolContext) -> JsonValue:
    name = _name(context.ask({"step1": Question("Step 1: What is your name?", NAME)})["step1"])
    colour = _required(_form(color={"type": "string"}), "color")
    second = context.ask({"step2": Question("Step 2: What is your favorite color?", colour)})
    return f"{name} likes {(second['step2'].content or {}).get('color')}."


def _two_at_once(arguments: dict[str, JsonValue], context: ToolContext) -> JsonValue:
    both = context.ask(
        {
            "name": Question("Who are you?", _form(name={"type": "string"})),
            "confirm": Question("Go ahead?", _form(confirm={"type": "boolean"})),
        }
    )
    return f"Got both: {_said(both['name'])}; {_said(both['confirm'])}"


def _before_task(arguments: dict[str, JsonValue], context: ToolContext) -> JsonValue:
    question = {"user_name": Question("What is your name?", NAME)}
    answer = context.ask(question, before_task=True)["user_name"]
    return f"Task done for {_name(answer)}."


ASKING: dict[str, tuple[str, Callable[[dict[str, JsonValue], ToolContext], JsonValue]]] = {
    "test_elicitation": ("Asks its user, with the message given", _elicitation),
    "test_elicitation_sep1034_defaults": ("Asks with a default for each type", _defaults),
    "test_elicitation_sep1330_enums": ("Asks with every kind of enum", _enums),
    "test_input_required_result_elicitation": ("Asks for a name", _hello),
    "test_input_required_result_request_state": ("Asks to confirm", _confirmed),
    "test_input_required_result_tampered_state": ("Asks to confirm", _confirmed),
    "test_input_required_result_multi_round": ("Asks twice, in turn", _two_rounds),
    "multi_input": ("Asks two questions at once", _two_at_once),
    "test_tool_with_task": ("Asks a name, then works as a task", _before_task),
}
PARAMETERS: dict[str, dict[str, JsonValue]] = {
    "test_elicitation": _required(_form(message={"type": "string"}), "message"),
}


@dataclass
class AskingTool:
    spec: ToolSpec
    answer: Callable[[dict[str, JsonValue], ToolContext], JsonValue]

    def call(self, arguments: dict[str, JsonValue], context: ToolContext) -> JsonValue:
        return self.answer(arguments, context)


def asking_tools() -> list[AskingTool]:
    return [
        AskingTool(
            ToolSpec(
                source=SOURCE,
                name=name,
                description=description,
                parameters=PARAMETERS.get(name, _form()),
                task_support=(
                    TaskSupport.REQUIRED if name == "test_tool_with_task" else TaskSupport.OPTIONAL
                ),
                asks=True,
                idempotent=True,
                default_policy=PolicyDecision.APPROVE,
            ),
            answer,
        )
        for name, (description, answer) in ASKING.items()
    ]
