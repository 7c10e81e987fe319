"""The arguments of the MCP surface's own tools, as the models that check them (the low-level
server passes arguments through unchecked) and that the listed input schemas are generated
from (`input_schema`), so what a client is told and what the server accepts cannot drift;
and a failed check in words."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError, create_model
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema

from lockgate.machine.execution_errors import code_too_long

#: The most answers one `resume` carries (a tool asks at most this many questions at once).
MAX_ANSWERS = 10

#: What `execute`'s schema tells a client about the key.
IDEMPOTENCY_KEY_HELP = (
    "Optional. A fresh value (a UUID) per program you mean to run once. If the answer to "
    "this call is lost (a restart, a broken connection), send the same call with the same "
    "key: it is attached to the execution the first one started (its result, or its "
    "current state) instead of starting a second. A key already used with other code is "
    "refused with idempotency_key_reused."
)

#: What `resume`'s answers are for.
ANSWERS_HELP = (
    "Instead of an action: the user's answers to what a paused call's tool asked them "
    "(interaction.kind questions), one per question key, each "
    '{"action": "accept", "content": {...}} (or decline / cancel).'
)


class ExecuteArguments(BaseModel):
    """`execute`'s arguments; the code's upper bound is the server's (`execute_arguments`)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    code: str = Field(min_length=1, description="The Python code to run.")
    idempotency_key: str | None = Field(
        default=None,
        alias="idempotencyKey",
        min_length=1,
        max_length=128,
        description=IDEMPOTENCY_KEY_HELP,
    )


def execute_arguments(max_code_chars: int) -> type[ExecuteArguments]:
    """`execute`'s arguments with this server's bound on the code (LOCKGATE_MAX_CODE_CHARS)."""
    bounded: type[ExecuteArguments] = create_model(
        "ExecuteArguments",
        __base__=ExecuteArguments,
        code=(
            str,
            Field(min_length=1, max_length=max_code_chars, description="The Python code to run."),
        ),
    )
    return bounded


class QuestionAnswer(BaseModel):
    """The user's answer to one question a tool asked (an MCP elicitation result)."""

    model_config = ConfigDict(extra="forbid")
    action: Literal["accept", "decline", "cancel"]
    content: dict[str, JsonValue] | None = None


class ResumeArguments(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    execution_id: str = Field(alias="executionId", min_length=1, max_length=64)
    action: Literal["accept", "decline", "cancel"] | None = None
    content: JsonValue = Field(default=None, description="Optional data sent with the decision.")
    #: Answers to what the paused call's tool asked its user, by question key.
    answers: dict[str, QuestionAnswer] | None = Field(
        default=None, max_length=MAX_ANSWERS, description=ANSWERS_HELP
    )

    def answered(self) -> dict[str, JsonValue]:
        """The answers as the engine takes them (each `{action, content?}`)."""
        return {
            key: answer.model_dump(exclude_none=True)
            for key, answer in (self.answers or {}).items()
        }


class PersonApprovesResume(ResumeArguments):
    """`resume` as listed where a person approves (approval modes `browser`, `native`): the
    model may give a call up but not accept it. Only the listing narrows: an accept sent
    anyway is refused by the decision entry, in words that say who approves."""

    action: Literal["decline", "cancel"] | None = None


class DescribeArguments(BaseModel):
    model_config = ConfigDict(extra="forbid")
    query: str = Field(
        default="",
        max_length=200,
        description="Words of a tool's name or description; empty for every tool.",
    )


class _ToolInputSchema(GenerateJsonSchema):
    """A tool's input schema as MCP clients read it: an optional argument is one that may be
    left out (no `anyOf` with null, no null default), and no titles (the names say it)."""

    def nullable_schema(self, schema: core_schema.NullableSchema) -> JsonSchemaValue:
        return self.generate_inner(schema["schema"])

    def default_schema(self, schema: core_schema.WithDefaultSchema) -> JsonSchemaValue:
        if schema.get("default") is None:
            return self.generate_inner(schema["schema"])
        return super().default_schema(schema)

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False


def input_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The JSON Schema a tool taking `model` lists, self-contained (no `$defs`: some clients
    resolve no references)."""
    schema = model.model_json_schema(by_alias=True, schema_generator=_ToolInputSchema)
    definitions = schema.pop("$defs", {})
    schema.pop("title", None)
    schema.pop("description", None)  # the model's docstring: the tool's description says it
    inlined: dict[str, Any] = _inlined(schema, definitions)
    return inlined


def _inlined(node: Any, definitions: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_inlined(item, definitions) for item in node]
    if not isinstance(node, dict):
        return node
    reference = node.get("$ref")
    if isinstance(reference, str) and reference.startswith("#/$defs/"):
        target = dict(definitions[reference.removeprefix("#/$defs/")])
        target.pop("title", None)
        rest = {key: value for key, value in node.items() if key != "$ref"}
        return _inlined({**target, **rest}, definitions)
    return {key: _inlined(value, definitions) for key, value in node.items()}


def problems(exc: ValidationError) -> str:
    """A validation failure in words, without echoing the values (they may be large)."""
    parts = []
    for err in exc.errors():
        if err["type"] == "string_too_long" and err["loc"] == ("code",):
            # The engine's own words for the same bound (it checks every entry's code).
            return code_too_long(len(str(err["input"])), int(err["ctx"]["max_length"]))
        where = ".".join(str(p) for p in err["loc"]) or "arguments"
        parts.append(f"{where}: {err['msg']}")
    return "Invalid arguments: " + "; ".join(parts)
