"""What a kind of tool source declares (`SourceKind`): how its table is read and built, what
is stored of it, whether agent code may add one and with which tool, and how the command
line fills its table. The kinds themselves are in `machine.tools.kinds`, one file each;
everything that used to spell out "openapi, graphql or mcp" asks that registry instead.

A kind's `build` imports its libraries (OpenAPI, GraphQL, the MCP client) only when a
source of that kind is built, so a server with none of them pays nothing for them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import JsonValue

from lockgate.machine.policy import PolicyDecision
from lockgate.machine.tools.source_tables import AUTH_FORMS, Origin
from lockgate.machine.tools.spec import ToolSource, ToolSpec

if TYPE_CHECKING:
    from lockgate.machine.secrets import SecretStore
    from lockgate.machine.tools.http_calls import HttpLimits

#: Agent code's own source, whose tools add, list and remove sources.
ADMIN_SOURCE = "lockgate"


class Builder(Protocol):
    def __call__(
        self,
        entry: Mapping[str, Any],
        origin: Origin,
        limits: HttpLimits,
        secrets: SecretStore | None,
    ) -> ToolSource: ...


class Settler(Protocol):
    def __call__(
        self,
        entry: Mapping[str, Any],
        origin: Origin,
        limits: HttpLimits,
        secrets: SecretStore | None,
    ) -> tuple[dict[str, Any], ToolSource]: ...


@dataclass(frozen=True)
class CommandLine:
    """What `lockgate sources add KIND NAME TARGET [options]` was given, for a kind to make
    its table of. `given` names the options used (a kind refuses the ones it does not take)."""

    target: str
    cwd: str
    base_url: str | None = None
    schema: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)

    @property
    def given(self) -> set[str]:
        named = {"base_url": self.base_url, "schema": self.schema, "env": self.env or None}
        return {option for option, value in named.items() if value is not None}


@dataclass(frozen=True)
class SourceKind:
    #: The sources file's table (`[[openapi]]`) and the stored kind.
    name: str
    #: The keys its table may have besides `name`.
    keys: tuple[str, ...]
    build: Builder
    #: What a source of this kind gives, in a few words (for help and hints).
    about: str
    #: The source and the table as it is stored (documents fetched kept as text, paths
    #: resolved), so every instance builds the same tools and fetches nothing. None: the
    #: table as given.
    settle: Settler | None = None
    #: Whether a table can be built before anyone approves adding it, with no connection
    #: (an inline document): it is then checked whole at once.
    offline: Callable[[Mapping[str, Any]], bool] = lambda entry: False
    #: Agent code's `tools.lockgate.add_<kind>_source`, if agents may add one.
    add_tool: ToolSpec | None = None
    #: How `lockgate sources add` fills its table (None: not stored; the sources file only).
    command_line: Callable[[CommandLine], dict[str, Any]] | None = None
    #: What TARGET is on the command line.
    target_help: str = ""
    #: Its table names a source (`name`); `[[python]]` names none (its factory does).
    named: bool = True

    @property
    def stored(self) -> bool:
        """Whether a source of this kind may be stored in the database (added at run time)."""
        return self.command_line is not None

    def settled(
        self,
        entry: Mapping[str, Any],
        origin: Origin,
        limits: HttpLimits,
        secrets: SecretStore | None,
    ) -> tuple[dict[str, Any], ToolSource]:
        if self.settle is not None:
            return self.settle(entry, origin, limits, secrets)
        return dict(entry), self.build(entry, origin, limits, secrets)


NAME_ARGUMENT: dict[str, JsonValue] = {
    "type": "string",
    "pattern": "^[A-Za-z_][A-Za-z0-9_]*$",
    "maxLength": 64,
    "description": "The source's name: its tools are then tools.<name>.<tool>(...).",
}
AUTH_ARGUMENT: dict[str, JsonValue] = {
    "type": "object",
    "description": "Optional: which stored secret the calls carry, and how. One of "
    + AUTH_FORMS.replace(" = ", ": "),
}


def arguments(required: list[str], **properties: JsonValue) -> dict[str, JsonValue]:
    """An admin tool's parameters: exactly these properties."""
    return {
        "type": "object",
        "properties": dict(properties),
        "required": list(required),
        "additionalProperties": False,
    }


def admin_tool(
    name: str, description: str, parameters: dict[str, JsonValue], *, read: bool
) -> ToolSpec:
    """A `tools.lockgate.*` tool: a read made at once, or a change a person approves."""
    return ToolSpec(
        source=ADMIN_SOURCE,
        name=name,
        description=description,
        parameters=parameters,
        returns="dict" if not name.startswith("list") else "list[dict]",
        idempotent=read,
        default_policy=PolicyDecision.APPROVE if read else PolicyDecision.REQUIRE_APPROVAL,
    )
