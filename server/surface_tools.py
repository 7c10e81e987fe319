"""The MCP surface's own tools as one table: each is a name, the arguments it takes (a pydantic
model whose JSON Schema is the listed input schema, or a source tool's spec, checked against
its own schema), what it says it does (it may depend on the caller's tools and approval
mode), whether it runs as a 2025 task, and its handler. `LockgateMCP.call_tool` looks a tool
up here, and the tool checks its arguments and hands them on; every failure is answered by
one mapping there."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

import mcp_types as types
from mcp.server import ServerRequestContext
from pydantic import BaseModel

from lockgate.machine.approval_modes import ApprovalMode
from lockgate.machine.lost_report import request_key
from lockgate.machine.policy import Policy
from lockgate.machine.tools.registry import ToolRegistry
from lockgate.machine.tools.spec import TaskSupport
from lockgate.server.experimental_tasks import asks_for_task, task_refused
from lockgate.server.tool_arguments import input_schema

Answer = types.CallToolResult | types.InputRequiredResult | dict[str, Any]
Arguments = TypeVar("Arguments")


class ArgumentsRefused(Exception):
    """Arguments a source tool's schema refuses, in its words (answered invalid_arguments)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass
class Call:
    """One `tools/call` of a surface tool, as its handler gets it."""

    ctx: ServerRequestContext[Any]
    params: types.CallToolRequestParams
    principal: str
    session_id: str | None
    mode: ApprovalMode
    #: The execution the call is about, once its handler knows it: a failure names it.
    execution_id: str | None = None

    @property
    def origin(self) -> str | None:
        """The request's key in the session's ledger (a lost answer is reported by it)."""
        if self.session_id is None or self.ctx.request_id is None:
            return None
        return request_key(self.session_id, self.ctx.request_id)


@dataclass(frozen=True)
class Listing:
    """What a tool's listing may depend on: the caller's tools, its policy, its mode."""

    registry: ToolRegistry
    policy: Policy
    mode: ApprovalMode


@dataclass(frozen=True)
class SurfaceTool(Generic[Arguments]):
    name: str
    #: The arguments as the handler takes them; raises ValidationError or ArgumentsRefused.
    check: Callable[[Mapping[str, Any]], Arguments]
    #: The input schema listed to a caller in this approval mode.
    schema: Callable[[ApprovalMode], dict[str, Any]]
    describe: Callable[[Listing], str]
    handle: Callable[[Call, Arguments], Awaitable[Answer]]
    #: Whether a 2025-11-25 client may ask for the call to run as a task.
    task_support: TaskSupport = TaskSupport.FORBIDDEN

    async def run(self, call: Call) -> Answer:
        if asks_for_task(call.ctx, call.params) and self.task_support is TaskSupport.FORBIDDEN:
            raise task_refused(self.name, self.task_support)
        return await self.handle(call, self.check(call.params.arguments or {}))

    def listed(self, listing: Listing) -> types.Tool:
        execution = None
        if self.task_support is not TaskSupport.FORBIDDEN:
            support: Literal["optional", "required"] = (
                "optional" if self.task_support is TaskSupport.OPTIONAL else "required"
            )
            execution = types.ToolExecution(task_support=support)
        return types.Tool(
            name=self.name,
            description=self.describe(listing),
            input_schema=self.schema(listing.mode),
            execution=execution,
        )


Model = TypeVar("Model", bound=BaseModel)


def modelled(
    name: str,
    model: type[Model],
    describe: Callable[[Listing], str],
    handle: Callable[[Call, Model], Awaitable[Answer]],
    *,
    listed_as: Callable[[ApprovalMode], type[BaseModel]] | None = None,
    task_support: TaskSupport = TaskSupport.FORBIDDEN,
) -> SurfaceTool[Model]:
    """A tool whose arguments are `model`: checked by it, listed as its JSON Schema (or, where
    the listing narrows by mode, as `listed_as(mode)`'s, a subclass of it)."""
    schemas = {mode: input_schema(listed_as(mode) if listed_as else model) for mode in ApprovalMode}
    return SurfaceTool(
        name=name,
        check=lambda raw: model.model_validate(dict(raw)),
        schema=schemas.__getitem__,
        describe=describe,
        handle=handle,
        task_support=task_support,
    )


class SurfaceTools:
    """The table, by name, in the order a listing shows it."""

    def __init__(self, tools: list[SurfaceTool[Any]]) -> None:
        self._tools = {tool.name: tool for tool in tools}

    def get(self, name: str) -> SurfaceTool[Any] | None:
        return self._tools.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[str]:
        return iter(self._tools)

    def listed(self, listing: Listing) -> list[types.Tool]:
        return [tool.listed(listing) for tool in self._tools.values()]
