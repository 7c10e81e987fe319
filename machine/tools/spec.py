"""What a tool is (`ToolSpec`), what a call gets (`ToolContext`), and what a source provides.

A `ToolSource` (the built-in notes, later OpenAPI or an upstream MCP server) contributes
`Tool`s, each described by a `ToolSpec`; `machine.tools.registry` serves them by name. A spec
is checked when it is made: its names must be Python identifiers and its parameters a valid
JSON Schema of an object (`machine.tools.schema`), because agent code calls
`tools.<source>.<name>(key=...)`.
"""

from __future__ import annotations

import json
import keyword
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property
from types import MappingProxyType
from typing import Protocol

from jsonschema.protocols import Validator
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    ValidatorFunctionWrapHandler,
    field_validator,
)

from lockgate.machine.policy import PolicyDecision, normal_condition
from lockgate.machine.tools.call_notices import (
    LEVELS,
    Listener,
    LogNotice,
    ProgressNotice,
    StreamRelease,
    nobody,
)
from lockgate.machine.tools.questions import Answer, Question, ask
from lockgate.machine.tools.schema import check_schema, property_schemas, schema_validator
from lockgate.machine.tools.signatures import notes, ordered_parameters, parameter, qualify

NAMESPACE = "tools"
"""The module agent code imports; a tool's call name is `tools.<source>.<name>`."""
#: Each source's tool names, sorted, as `(source, names)` pairs: what agent code finds under
#: `tools` (`ToolRegistry.frozen_namespace`; the sandbox declares it and keys on it).
Namespace = tuple[tuple[str, tuple[str, ...]], ...]


def make_idempotency_key(execution_id: str, sequence: int) -> str:
    """The key every call carries: stable across retries of the same call, unique otherwise."""
    return f"{execution_id}:{sequence}"


def is_identifier(name: str) -> bool:
    # Source and tool names become attribute names in agent code.
    return name.isidentifier() and not keyword.iskeyword(name)


def identifier(text: str) -> str:
    """`text` as a Python identifier: runs of other characters become `_`."""
    name = re.sub(r"\W+", "_", text).strip("_") or "_"
    if name[0].isdigit():
        name = f"_{name}"
    return f"{name}_" if keyword.iskeyword(name) else name


class TaskSupport(StrEnum):
    """Whether a call of the tool, exposed directly, may be answered with a task (MCP's
    `execution.taskSupport`): `forbidden`, always its result; `optional`, a task when the
    client takes tasks and the call does not finish at once (it waits for a person, or runs
    long); `required`, always a task, and refused (-32021) to a client that takes none."""

    FORBIDDEN = "forbidden"
    OPTIONAL = "optional"
    REQUIRED = "required"


class PlainJson(dict[str, JsonValue]):
    """A schema its maker has checked to be plain JSON (text keys, lists, finite numbers:
    `is_plain_json`), which a `ToolSpec` keeps as it is, not copied."""


def is_plain_json(value: object) -> bool:
    """Whether `value` is JSON as `json` reads it back (in C): no tuple, no key that is not
    text, no number that is not finite, no value of another type (a YAML date)."""
    try:
        return bool(json.loads(json.dumps(value, allow_nan=False)) == value)
    except (TypeError, ValueError, RecursionError):
        return False


def _empty_object_schema() -> dict[str, JsonValue]:
    return {"type": "object", "properties": {}, "additionalProperties": False}


class ToolSpec(BaseModel):
    """What a tool is: its name, its arguments' schema, and how careful to be with it."""

    model_config = ConfigDict(frozen=True)

    source: str
    name: str
    description: str
    parameters: dict[str, JsonValue] = Field(default_factory=_empty_object_schema)
    returns: str = "Any"
    """A Python type expression, for signatures and stubs: `dict`, `list[str]`."""
    idempotent: bool = False
    """Safe to call twice (read-only): an in-doubt call is retried only when this is true."""
    default_policy: PolicyDecision = PolicyDecision.REQUIRE_APPROVAL
    secrets: tuple[str, ...] = ()
    operation: str | None = None
    """What a call does, for policy conditions: the HTTP method of an OpenAPI operation
    (`DELETE`) or a GraphQL operation type (`mutation`); None for other tools."""
    about: str = ""
    """More words about the tool, for finding it only (`describe_tools` ranks by them, a
    listing does not show them): an operation's description and tags, bounded."""
    task_support: TaskSupport = TaskSupport.OPTIONAL
    """Whether a direct call may be answered with a task (`TaskSupport`)."""
    asks: bool = False
    """Whether the tool may ask its user for values (`ToolContext.ask`): its call is then
    journaled before it runs, never made at once, so its questions can pause it."""
    owner: str | None = None
    """The principal who added the tool's source (None: the operator's). Its calls read only
    that principal's secrets and reach only public addresses, and policy rules name it as
    `<owner>:<source>.<name>`."""

    @field_validator("operation")
    @classmethod
    def _check_operation(cls, operation: str | None) -> str | None:
        return None if operation is None else normal_condition(operation)

    @field_validator("source", "name")
    @classmethod
    def _check_identifier(cls, value: str) -> str:
        if not is_identifier(value):
            raise ValueError(f"{value!r} is not a Python identifier (agent code calls it)")
        return value

    @field_validator("parameters", mode="wrap")
    @classmethod
    def _kept_when_plain_json(
        cls, schema: object, handler: ValidatorFunctionWrapHandler
    ) -> dict[str, JsonValue]:
        """A `PlainJson` schema is kept as it is: pydantic's check of a JsonValue copies
        every list and object, seconds (and a copy each) for the thousands of tools of an
        API whose schemas share large definitions. Any other is checked and copied."""
        if type(schema) is PlainJson:
            return schema
        checked: dict[str, JsonValue] = handler(schema)
        return checked

    @field_validator("parameters")
    @classmethod
    def _check_parameters(cls, schema: dict[str, JsonValue]) -> dict[str, JsonValue]:
        if schema.get("type") != "object":
            raise ValueError("the parameters schema must have type 'object'")
        check_schema(schema, "parameters")
        for name in property_schemas(schema):
            if not is_identifier(name):
                raise ValueError(f"argument {name!r} cannot be passed as a keyword argument")
        return schema

    @cached_property
    def argument_validator(self) -> Validator:
        """The validator a call's arguments are checked with, built once per tool."""
        return schema_validator(self.parameters)

    @field_validator("returns")
    @classmethod
    def _check_returns(cls, value: str) -> str:
        try:
            compile(value, "<returns>", "eval")
        except SyntaxError:
            raise ValueError(f"returns {value!r} is not a Python type expression") from None
        return value

    @property
    def full_name(self) -> str:
        return f"{self.source}.{self.name}"

    @property
    def policy_name(self) -> str:
        """What policy rules match: `source.name`, or `owner:source.name` for a tool of a
        source a principal added (so a rule the operator wrote for its own `crm` is not
        also one for a `crm` some principal added)."""
        return self.full_name if self.owner is None else f"{self.owner}:{self.full_name}"

    @property
    def call_name(self) -> str:
        return f"{NAMESPACE}.{self.full_name}"

    def signature(self, decision: PolicyDecision | None = None) -> str:
        """`tools.notes.write(key: str, text: str) -> dict  # requires approval`.

        `decision` is the effective policy when known; the tool's default otherwise.
        """
        policy_notes = notes(decision or self.default_policy, self.idempotent)
        return self.bare_signature() + (f"  # {policy_notes}" if policy_notes else "")

    def bare_signature(self) -> str:
        """`tools.notes.write(key: str, text: str) -> dict`: the signature without its notes."""
        params = ", ".join(
            parameter(name, schema, required, ())
            for name, schema, required in ordered_parameters(self.parameters)
        )
        return f"{self.call_name}({params}) -> {self.returns}"

    def usage(self) -> str:
        """`tools.notes.write(key=..., text=...)`: how a keyword-only call looks."""
        names = ", ".join(f"{name}=..." for name, _, _ in ordered_parameters(self.parameters))
        return f"{self.call_name}({names})"

    def stub(self, shadowed: Sequence[str] = ()) -> str:
        """This tool as a keyword-only `def` for a `.pyi` module; `shadowed` lists builtin
        names that the module's own functions hide (see `machine.tools.stubs`)."""
        params = ", ".join(
            parameter(name, schema, required, shadowed, stub=True)
            for name, schema, required in ordered_parameters(self.parameters)
        )
        lines = [f"# {line}" for line in self.description.splitlines() if line.strip()]
        policy_notes = notes(self.default_policy, False)
        if policy_notes:
            lines.append(f"# {policy_notes} (by default; the server's policy decides)")
        if self.idempotent:
            lines.append("# read-only")
        star = "*, " if params else ""
        returns = qualify(self.returns, shadowed)
        lines.append(f"def {self.name}({star}{params}) -> {returns}: ...")
        return "\n".join(lines)


@dataclass(frozen=True)
class ToolContext:
    """What a call gets besides its arguments. Never stored: it holds resolved secrets."""

    idempotency_key: str
    secrets: Mapping[str, str] = field(repr=False)
    principal_id: str
    #: Where what the tool says while it runs goes (`machine.tools.call_notices`).
    notify: Listener = field(default=nobody, repr=False)
    #: The answers its user gave to what this call asked before (`ask`), by question key.
    answers: Mapping[str, JsonValue] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # A read-only copy: a tool must not be able to change what the next call sees.
        object.__setattr__(self, "secrets", MappingProxyType(dict(self.secrets)))

    def log(self, level: str, data: JsonValue) -> None:
        """A log message for the client waiting on this call (MCP's levels: `LEVELS`)."""
        if level not in LEVELS:
            raise ValueError(f"level must be one of {', '.join(LEVELS)}, not {level!r}")
        self.notify(LogNotice(level, data))

    def progress(
        self, progress: float, total: float | None = None, message: str | None = None
    ) -> None:
        """How far the call is, for a client that asked to hear it (its progressToken)."""
        self.notify(ProgressNotice(progress, total, message))

    def release_stream(self) -> None:
        """The call will run long: its client may be let go of the connection it waits on,
        to come back for the answer (MCP's SSE polling, SEP-1699; a client that cannot, or
        a request that needs no stream, keeps waiting as before)."""
        self.notify(StreamRelease())

    def ask(
        self, questions: Mapping[str, Question], *, before_task: bool = False
    ) -> dict[str, Answer]:
        """The user's answers to `questions` (by key); until every one is answered, the call
        stops here and its execution waits for them (`machine.tools.questions`): ask before
        acting, the same questions each time. `before_task`: the answers are needed before
        the call is worth a task, so a client that speaks both is asked on the call itself
        (an `input_required` round) and the task is made once they come."""
        return ask(self.answers, questions, before_task)


class Tool(Protocol):
    @property
    def spec(self) -> ToolSpec: ...

    def call(self, arguments: dict[str, JsonValue], context: ToolContext) -> JsonValue:
        """Run once with validated arguments; raise ToolFailed for an expected failure."""
        ...


class ToolSource(Protocol):
    """A source may also say what it left out (`left_out`: a tuple of warnings, one per
    operation of its document it cannot serve, naming it and why): see `left_out_of`."""

    @property
    def name(self) -> str: ...

    def tools(self) -> Sequence[Tool]: ...


def left_out_of(source: ToolSource) -> tuple[str, ...]:
    """What `source` could not serve of what it was given, each in words (none for most)."""
    found = getattr(source, "left_out", ())
    return tuple(str(warning) for warning in found) if isinstance(found, (tuple, list)) else ()
