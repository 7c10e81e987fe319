"""The SSE replay logs: per-session, unguessable, and bounded in bytes (really held)."""

from __future__ import annotations

import asyncio
import gc
import tracemalloc

from mcp.server.streamable_http import EventMessage
from mcp_types import JSONRPCMessage, JSONRPCResponse

from lockgate.server.event_store import ReplayLogs

#: About the size of the large tool answer the attack used (255 KiB of text).
BIG = "x" * (255 * 1024)


def answer(request_id: int, text: str) -> JSONRPCMessage:
    return JSONRPCResponse(
        jsonrpc="2.0", id=request_id, result={"content": [{"type": "text", "text": text}]}
    )


async def replayed(logs: ReplayLogs, session_id: str, after: str) -> list[EventMessage]:
    got: list[EventMessage] = []

    async def collect(event: EventMessage) -> None:
        got.append(event)

    await logs.for_session(session_id).replay_events_after(after, collect)
    return got


def test_a_session_replays_only_its_own_events() -> None:
    async def scenario() -> None:
        logs = ReplayLogs(per_session_bytes=10**6, total_bytes=10**7)
        alice, bob = logs.for_session("alice-session"), logs.for_session("bob-session")
        primed = await alice.store_event("7", None)
        await alice.store_event("7", answer(7, "alice's secret"))
        assert [e.message.id for e in await replayed(logs, "alice-session", primed)] == [7]  # type: ignore[union-attr]
        # Bob's session knows nothing of alice's ids, even the real one.
        assert not bob.knows(primed)
        assert await bob.replay_events_after(primed, lambda e: asyncio.sleep(0)) is None

    asyncio.run(scenario())


def test_event_ids_are_unguessable_and_name_their_stream() -> None:
    async def scenario() -> None:
        log = ReplayLogs(per_session_bytes=10**6, total_bytes=10**7).for_session("s")
        ids = [await log.store_event("7", answer(7, "a")) for _ in range(50)]
        assert len(set(ids)) == 50
        assert all(i.rpartition(":")[0] == "7" for i in ids)
        # 128 random bits after the stream, not a counter.
        assert all(len(i.rpartition(":")[2]) >= 21 for i in ids)

    asyncio.run(scenario())


def test_bounded_per_session_and_in_total_by_what_is_really_held() -> None:
    per_session, total = 1024 * 1024, 4 * 1024 * 1024

    async def scenario() -> ReplayLogs:
        logs = ReplayLogs(per_session_bytes=per_session, total_bytes=total)
        for session in range(40):
            log = logs.for_session(f"s{session}")
            for request in range(10):
                await log.store_event(str(request), answer(request, BIG))
                assert logs.bytes_held <= total
                assert log.size <= per_session
        return logs

    gc.collect()
    tracemalloc.start()
    try:
        logs = asyncio.run(scenario())
        gc.collect()
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # 400 answers of 255 KiB went through (100 MiB); what stays is within the total bound
    # (plus the interpreter's own small change), not a copy of every answer.
    assert held < total + 1024 * 1024, f"{held / 2**20:.1f} MiB held"
    assert logs.bytes_held > total - 2 * len(BIG)  # it does keep what it may


def test_the_newest_events_survive_and_oversized_ones_are_not_kept() -> None:
    async def scenario() -> None:
        logs = ReplayLogs(per_session_bytes=3 * len(BIG), total_bytes=10**8)
        log = logs.for_session("s")
        primed = await log.store_event("1", None)
        first = await log.store_event("1", answer(1, BIG))
        for n in range(2, 6):
            await log.store_event(str(n), answer(n, BIG))
        assert not log.knows(first) and not log.knows(primed)  # the oldest went first
        huge = await log.store_event("9", answer(9, BIG * 4))
        assert not log.knows(huge)  # larger than the session's budget: never kept
        assert log.size <= 3 * len(BIG)
        logs.discard("s")
        assert logs.bytes_held == 0

    asyncio.run(scenario())
