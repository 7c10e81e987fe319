"""An upstream MCP server as a tool source: its tools proxied with their own schemas.

The upstream is a command run over stdio or a streamable HTTP URL, reached with the `mcp`
SDK's own client (what agent code gets of an answer: `mcp_content`). What a call needs
follows its annotations: `readOnlyHint` makes it a read (idempotent, approved by default);
`destructiveHint`, or no annotation at all, makes it wait for a person by default.

The SDK's client is async and a tool call runs on a worker thread, so each upstream has an
event loop of its own, on a thread that holds the connection open between calls. A write
is sent only once the upstream answered a ping on the connection: one that died while the
write waited for a person is connected again first, so the approval is not spent on a dead
connection. A write whose answer is lost once it was sent (the connection closed, or no
answer within the bound) raises `ToolOutcomeUnknown`: the engine leaves it in doubt. A read
that finds the connection gone fails in words and drops it; the next call connects again.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

from mcp import Client, types
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp.types import CONNECTION_CLOSED, REQUEST_TIMEOUT
from pydantic import JsonValue

from lockgate.machine.policy import PolicyDecision
from lockgate.machine.tools.errors import InvalidToolSource, ToolFailed, ToolOutcomeUnknown
from lockgate.machine.tools.mcp_content import answer_of, failure_text
from lockgate.machine.tools.outbound import Reach, guarded_async_client
from lockgate.machine.tools.spec import ToolContext, ToolSpec, identifier

T = TypeVar("T")
log = logging.getLogger("lockgate.tools")
Target = StdioServerParameters | str


def _innermost(exc: BaseException) -> BaseException:
    """The first error inside a task group's exception group (what actually went wrong)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


class McpUpstream:
    """The connection to one upstream server, on an event loop thread of its own."""

    def __init__(
        self,
        name: str,
        target: Target,
        timeout_secs: float,
        *,
        reach: Reach | None = None,
        max_answer_bytes: int = 1024 * 1024,
    ) -> None:
        self.name, self.target, self.timeout_secs = name, target, timeout_secs
        #: The largest answer of a tool kept (its compact JSON); a larger one is refused.
        self.max_answer_bytes = max_answer_bytes
        #: Where an upstream over HTTP may be reached (a principal's: public addresses).
        self.reach = reach or Reach()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._serve, name=f"lockgate-mcp-{name}", daemon=True
        )
        self._thread.start()
        self._lock = threading.Lock()
        self._client: Client | None = None
        self._stop: asyncio.Event | None = None
        self._held: Future[None] | None = None

    def _serve(self) -> None:
        try:
            self._loop.run_forever()
        finally:
            self._loop.close()

    def _connect(self) -> Client:
        """Open the connection (the lock held) and keep it open in a task of the loop."""
        opened: Future[tuple[Client, asyncio.Event]] = Future()

        async def hold() -> None:
            stop = asyncio.Event()
            try:
                async with Client(self._transport()) as client:
                    opened.set_result((client, stop))
                    await stop.wait()
            except BaseException as exc:
                if not opened.done():
                    opened.set_exception(exc)
                    return
                raise

        self._held = asyncio.run_coroutine_threadsafe(hold(), self._loop)
        try:
            client, self._stop = opened.result(self.timeout_secs)
        except FutureTimeout:
            self._held.cancel()
            raise self._late() from None
        except Exception as exc:
            cause = _innermost(exc)
            raise ToolFailed(
                f"the upstream MCP server {self.name!r} cannot be reached "
                f"({type(cause).__name__}: {cause})"
            ) from None
        self._client = client
        return client

    def _transport(self) -> Any:
        """The SDK client's transport: over HTTP, through connections checked against
        `reach` (a principal's upstream reaches public addresses only); over stdio, the
        command's stderr on the process's own (the SDK's default is whatever `sys.stderr`
        was when it was imported, which may be a capture with no file behind it)."""
        if isinstance(self.target, str) and self.reach.public_only:
            client = guarded_async_client(self.reach, self.timeout_secs)
            return streamable_http_client(self.target, http_client=client)
        if isinstance(self.target, StdioServerParameters):
            errlog = sys.__stderr__ if sys.__stderr__ is not None else sys.stderr
            return stdio_client(self.target, errlog=errlog)
        return self.target

    def _late(self) -> ToolFailed:
        return ToolFailed(
            f"the upstream MCP server {self.name!r} did not answer within "
            f"{self.timeout_secs:g} s (LOCKGATE_HTTP_TIMEOUT_SECS)"
        )

    def _drop(self) -> None:
        """Forget the connection (and close it); the next call connects again."""
        stop, self._client, self._stop = self._stop, None, None
        if stop is not None:
            self._loop.call_soon_threadsafe(stop.set)

    def _current(self) -> Client:
        """The open connection, or a new one if there is none or its task has ended."""
        with self._lock:
            gone = self._held is not None and self._held.done()
            if self._client is None or gone:
                self._drop()
                return self._connect()
            return self._client

    def _answers(self, client: Client) -> bool:
        """Whether the upstream answers a ping on `client` within the bound. A dead stdio
        process, a closed transport or a connection whose task has ended does not. Any
        answer will do: an error too (the 2026-07-28 protocol has no ping, and a server
        speaking it says "Method not found"), since only a live upstream answers at all."""
        ping = asyncio.run_coroutine_threadsafe(client.session.send_ping(), self._loop)
        try:
            ping.result(self.timeout_secs)
        except FutureTimeout:
            ping.cancel()
            return False
        except MCPError as exc:
            return exc.error.code not in (CONNECTION_CLOSED, REQUEST_TIMEOUT)
        except Exception:
            return False
        return True

    def _live(self) -> Client:
        """A connection the upstream answered on just now: the open one if it answers a
        ping, else a new one. Nothing of the call is sent before this."""
        client = self._current()
        if self._answers(client):
            return client
        log.info("the upstream MCP server %r is gone; connecting again", self.name)
        with self._lock:
            if self._client is client:  # (another call may have connected again already)
                self._drop()
        return self._current()

    def run(self, work: Callable[[Client], Awaitable[T]], *, write: bool = False) -> T:
        """Run `work` on the connection. A `write` (a call that must not be repeated, made
        perhaps long after the connection opened, when a person approved it) is sent only
        on a connection the upstream answered on just now (connecting again if it went
        away); once sent, its lost answer is a `ToolOutcomeUnknown`, not a failure."""
        client = self._live() if write else self._current()

        async def call() -> T:
            return await work(client)

        done = asyncio.run_coroutine_threadsafe(call(), self._loop)
        try:
            return done.result(self.timeout_secs)
        except FutureTimeout:
            done.cancel()
            if write:
                raise self._unknown(
                    f"did not answer within {self.timeout_secs:g} s (LOCKGATE_HTTP_TIMEOUT_SECS)"
                ) from None
            raise self._late() from None
        except Exception as exc:
            cause = _innermost(exc)
            if isinstance(cause, MCPError) and cause.error.code != CONNECTION_CLOSED:
                # The upstream answered, with an error of the protocol: nothing was lost.
                raise ToolFailed(
                    f"the upstream MCP server {self.name!r} refused the call "
                    f"({cause.error.code}: {cause.error.message})"
                ) from None
            with self._lock:
                self._drop()
            if write:
                raise self._unknown("closed the connection") from None
            raise ToolFailed(
                f"the upstream MCP server {self.name!r} failed ({type(cause).__name__}: "
                f"{cause}); the next call connects again"
            ) from None

    def _unknown(self, what: str) -> ToolOutcomeUnknown:
        return ToolOutcomeUnknown(
            f"the upstream MCP server {self.name!r} {what} after the call was sent, before "
            "answering: whether the call took effect is unknown"
        )

    def close(self) -> None:
        """Close the connection (ending a stdio upstream's process) and the loop's thread."""
        with self._lock:
            held, stop = self._held, self._stop
            self._drop()
        if held is not None and stop is not None:
            try:
                held.result(self.timeout_secs)  # the client's own exit, in its task
            except Exception:
                log.warning("the upstream MCP server %r did not close cleanly", self.name)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(self.timeout_secs)


class McpTool:
    def __init__(self, upstream: McpUpstream, spec: ToolSpec, upstream_name: str) -> None:
        self._upstream, self.spec, self._name = upstream, spec, upstream_name

    def call(self, arguments: dict[str, JsonValue], context: ToolContext) -> JsonValue:
        # A write is sent only on a connection the upstream answered on just now: one that
        # died while the call waited for a person is opened again first.
        result = self._upstream.run(
            lambda client: client.call_tool(self._name, arguments), write=not self.spec.idempotent
        )
        if result.is_error:
            raise ToolFailed(f"the upstream tool {self._name!r} failed: {failure_text(result)}")
        return answer_of(result, self._name, self._upstream.max_answer_bytes)


class McpSource:
    """The tools one upstream server lists, as it listed them when the source was made."""

    #: Its kind of table (`machine.tools.kinds`), as `list_sources` shows it.
    kind = "mcp"

    def close(self) -> None:
        self.upstream.close()

    def __init__(self, name: str, upstream: McpUpstream) -> None:
        self.name, self.upstream = name, upstream
        listed = upstream.run(lambda client: client.list_tools())
        self._tools = [self._tool(tool) for tool in listed.tools]

    def _tool(self, tool: types.Tool) -> McpTool:
        hints = tool.annotations
        read = bool(hints and hints.read_only_hint and not hints.destructive_hint)
        schema: dict[str, Any] = dict(tool.input_schema or {"type": "object"})
        schema.setdefault("type", "object")
        try:
            spec = ToolSpec(
                source=self.name,
                name=identifier(tool.name),
                description=(tool.description or tool.title or tool.name).strip().splitlines()[0],
                about=(tool.description or "")[:600],
                parameters=schema,
                returns="Any",
                idempotent=read,
                default_policy=PolicyDecision.APPROVE if read else PolicyDecision.REQUIRE_APPROVAL,
            )
        except ValueError as exc:
            raise InvalidToolSource(
                f"source {self.name!r}: the upstream tool {tool.name!r} cannot be served ({exc})"
            ) from None
        return McpTool(self.upstream, spec, tool.name)

    def tools(self) -> Sequence[McpTool]:
        return self._tools
