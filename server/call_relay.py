"""What a tool says while a request waits on its execution, relayed to that request's client:
log messages as `notifications/message`, at the level the session asked for (a 2025 session's
is kept on its row by `logging/setLevel`; a 2026-07-28 request asks in its own `_meta`, which
the SDK honours), and progress as `notifications/progress` when the request carried a
`progressToken`. Best effort, as MCP's notifications are (`machine.tools.call_notices`).
A tool that will run long may let the request's stream go (`ToolContext.release_stream`,
SEP-1699): the stream is closed after its priming event, and the client reconnects with
Last-Event-ID for the answer, which the session's replay log holds.

The tool runs on a worker thread; its notices cross to the event loop in order, through one
queue that a single task drains, and the request answers only once the queue is empty, so a
client hears every notice before the result.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import mcp_types as types
from mcp.server import ServerRequestContext

from lockgate.machine.tools.call_notices import (
    LEVELS,
    CallNotice,
    Listener,
    LogNotice,
    StreamRelease,
)
from lockgate.server.input_required import STATELESS

log = logging.getLogger("lockgate.mcp")

#: How long the answer waits for notices still being sent once the call is over.
DRAIN_SECS = 5.0


def _wanted(level: str, floor: str | None) -> bool:
    return floor not in LEVELS or LEVELS.index(level) >= LEVELS.index(floor)


@asynccontextmanager
async def relayed(
    ctx: ServerRequestContext[Any],
    params: types.CallToolRequestParams,
    session_level: Callable[[], Awaitable[str | None]],
) -> AsyncIterator[Listener]:
    """A listener for the execution this request waits on; `session_level` reads the
    session's log level (on a 2025 session, at its first log message: a call that says
    nothing costs no read)."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[CallNotice | None] = asyncio.Queue()
    token = (params.meta or {}).get("progress_token")
    floor: list[str | None] = []  # read once, when first needed

    async def wanted(level: str) -> bool:
        if not floor:
            # 2026-07-28 has no session level: the SDK applies the request's own.
            legacy = ctx.protocol_version < STATELESS
            floor.append(await session_level() if legacy else None)
        return _wanted(level, floor[0])

    async def send(notice: CallNotice) -> None:
        if isinstance(notice, StreamRelease):
            # Only where the client can come back for the answer: the SDK offers the close
            # on a resumable stream (an event store, a client of 2025-11-25 or later).
            if ctx.close_sse_stream is not None:
                await ctx.close_sse_stream()
        elif isinstance(notice, LogNotice):
            if await wanted(notice.level):
                await ctx.session.send_log_message(
                    level=notice.level,  # type: ignore[arg-type]  # checked: one of LEVELS
                    data=notice.data,
                    logger="lockgate.tools",
                    related_request_id=ctx.request_id,
                )
        elif token is not None:
            await ctx.session.send_progress_notification(
                token,
                notice.progress,
                notice.total,
                notice.message,
                related_request_id=str(ctx.request_id),
            )

    async def drain() -> None:
        while (notice := await queue.get()) is not None:
            try:
                await send(notice)
            except Exception as exc:  # a client gone: the call goes on regardless
                log.info("a tool's notice was not delivered (%s)", type(exc).__name__)

    # The task that sends them starts with the first notice: most calls say nothing, and the
    # task with its cancel scope and shield was 1.6% of an `execute` request's CPU.
    sender: asyncio.Task[None] | None = None
    heard = False

    def sending() -> asyncio.Task[None]:
        nonlocal sender
        if sender is None:
            sender = asyncio.create_task(drain())
        return sender

    def hear(notice: CallNotice) -> None:  # on the event loop, in the order they were said
        sending()
        queue.put_nowait(notice)

    def listener(notice: CallNotice) -> None:  # on the tool's thread
        nonlocal heard
        heard = True
        loop.call_soon_threadsafe(hear, notice)

    try:
        yield listener
    finally:
        if heard:
            # After every notice the call made (each was queued before the call returned,
            # and the end marker is queued after them).
            task = sending()
            loop.call_soon_threadsafe(queue.put_nowait, None)
            with anyio.move_on_after(DRAIN_SECS):
                await asyncio.shield(task)
            task.cancel()
