"""A tool that asks its user for values before it goes on (`ToolContext.ask`).

A tool asks with named questions, each an MCP elicitation form (a message and the flat
object schema of the values wanted). Asking does not wait in the tool: it stops the call
(`InputNeeded`), the call's questions are stored with its paused execution, and once every
question is answered the call is made again from the start, with the answers, where `ask`
returns them. So a tool asks before it acts (nothing it did before asking may matter twice),
and it asks the same questions in the same order each time, as MCP's `input_required`
rounds have a server do.

A question is not an approval: it is the tool's own interface to its user, answered by the
client (its prompt to its person, or the agent), never by the approval page. A call that
needs approval still needs it.

The stored form (`tool_calls.input`) is plain JSON: `{"asked": {key: request}, "answers":
{key: response}, "before_task": bool}`, where a request is the MCP `elicitation/create`
request and a response the client's `ElicitResult` (`action`, `content`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, cast

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from pydantic import JsonValue

#: How many questions one call may ask at once, and how long a key and a message may be.
MAX_QUESTIONS = 10
MAX_KEY_CHARS = 64
MAX_MESSAGE_CHARS = 4000
KEY = re.compile(r"^[A-Za-z0-9_.:-]+$")
ACTIONS = ("accept", "decline", "cancel")
ELICIT = "elicitation/create"


class InputNeeded(BaseException):
    """The tool's call stops here until its questions are answered. A `BaseException`, like
    `GeneratorExit`: a control signal, so a tool's own `except Exception` cannot swallow it."""

    def __init__(self, asked: dict[str, JsonValue], before_task: bool) -> None:
        super().__init__("the tool asks its user for values")
        self.asked, self.before_task = asked, before_task


class InvalidQuestion(ValueError):
    """A tool asked in a form MCP cannot carry (raised in the tool, a fault of its code)."""


@dataclass(frozen=True)
class Question:
    """One question: what the person reads, and the values wanted (an elicitation form:
    an object schema whose properties are strings, numbers, integers, booleans or enums)."""

    message: str
    schema: Mapping[str, JsonValue]


@dataclass(frozen=True)
class Answer:
    """What the person did: `accept` with `content` (the values), `decline`, or `cancel`."""

    action: Literal["accept", "decline", "cancel"]
    content: dict[str, JsonValue] | None = None

    @property
    def accepted(self) -> bool:
        return self.action == "accept"


def request_of(question: Question) -> dict[str, JsonValue]:
    """The question as the MCP `elicitation/create` request a client is sent."""
    if not isinstance(question, Question):
        raise InvalidQuestion("each question is a Question(message, schema)")
    if not question.message.strip() or len(question.message) > MAX_MESSAGE_CHARS:
        raise InvalidQuestion(f"a question's message has 1 to {MAX_MESSAGE_CHARS} characters")
    schema = dict(question.schema)
    if schema.get("type") != "object" or not isinstance(schema.get("properties"), dict):
        raise InvalidQuestion("a question's schema is an object schema with properties")
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        raise InvalidQuestion(
            f"a question's schema is not valid JSON Schema: {exc.message}"
        ) from None
    return {"method": ELICIT, "params": {"message": question.message, "requestedSchema": schema}}


def asked_of(questions: Mapping[str, Question]) -> dict[str, JsonValue]:
    if not questions or len(questions) > MAX_QUESTIONS:
        raise InvalidQuestion(f"a tool asks 1 to {MAX_QUESTIONS} questions at once")
    for key in questions:
        if not isinstance(key, str) or not KEY.match(key) or len(key) > MAX_KEY_CHARS:
            raise InvalidQuestion(
                f"a question's key is 1 to {MAX_KEY_CHARS} letters, digits or _.:- ({key!r})"
            )
    return {key: request_of(question) for key, question in questions.items()}


def ask(
    answers: Mapping[str, JsonValue], questions: Mapping[str, Question], before_task: bool
) -> dict[str, Answer]:
    """The answers to `questions`, when every one was answered; `InputNeeded` otherwise."""
    asked = asked_of(questions)
    if any(key not in answers for key in asked):
        raise InputNeeded(asked, before_task)
    return {key: answer_of(answers[key]) for key in asked}


def answer_of(stored: JsonValue) -> Answer:
    """A stored response as the tool reads it (stored only once checked: `problems`)."""
    assert isinstance(stored, dict)
    action = cast(Literal["accept", "decline", "cancel"], stored["action"])
    content = stored.get("content")
    return Answer(action, dict(content) if isinstance(content, dict) else None)


def form_of(request: JsonValue) -> tuple[str, dict[str, JsonValue]]:
    """A stored question's message and requested schema (as `request_of` made it)."""
    params = request.get("params") if isinstance(request, dict) else None
    if not isinstance(params, dict):
        return "", {"type": "object", "properties": {}}
    schema = params.get("requestedSchema")
    return str(params.get("message", "")), dict(schema) if isinstance(schema, dict) else {}


def stored_input(row_input: JsonValue) -> dict[str, JsonValue]:
    """A call's stored `input`, or an empty one."""
    return dict(row_input) if isinstance(row_input, dict) else {}


def stored_answers(row_input: JsonValue) -> dict[str, JsonValue]:
    answers = stored_input(row_input).get("answers")
    return dict(answers) if isinstance(answers, dict) else {}


def open_questions(row_input: JsonValue) -> dict[str, JsonValue]:
    """The questions of the call's last ask not answered yet, by key, in asked order."""
    asked = stored_input(row_input).get("asked")
    answers = stored_answers(row_input)
    if not isinstance(asked, dict):
        return {}
    return {key: request for key, request in asked.items() if key not in answers}


def problems(request: JsonValue, response: JsonValue) -> str | None:
    """What is wrong with `response` as the answer to `request`, in words (None: nothing):
    an `ElicitResult` whose accepted content fits the question's schema."""
    if not isinstance(response, dict):
        return "an answer is an object with action (accept, decline or cancel) and content"
    action = response.get("action")
    if action not in ACTIONS:
        return f"action is accept, decline or cancel, not {action!r}"
    content = response.get("content")
    if action != "accept":
        return None if content is None or isinstance(content, dict) else "content is an object"
    if not isinstance(content, dict):
        return "an accepted answer carries its values as content (an object)"
    _, schema = form_of(request)
    if schema:
        error = next(iter(Draft202012Validator(schema).iter_errors(content)), None)
        if error is not None:
            where = ".".join(str(p) for p in error.absolute_path) or "content"
            return f"{where}: {error.message}"
    return None
