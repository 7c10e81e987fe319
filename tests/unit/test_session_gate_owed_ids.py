"""A POST's owed id at the session gate (`server/session_gate.py`), over ASGI on a real
runtime, in front of scripted stand-ins for the SDK's transport
(`tests/support/session_gate.py`): an answered request passes byte for byte and is consumed
(the session active meanwhile, the executionId kept to 64 characters); only a result or
error for the owed id answers it (split across chunks, after a bad or non-UTF-8 event, over
two data lines, without a space); a stream ending without it gets the -32010 before its end;
a JSON answer and an error status answer it; an error-status stream, a headerless response
or a JSON response that does not answer leave it lost for the next GET; and when the answer
does not come: a passed deadline (on the stream, or as JSON before the start), a JSON
response under way (left lost), a drain, a client gone (left lost).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Awaitable
from typing import Any, TypeVar

import anyio
import pytest

from lockgate.server.owed_response import DrainSignal, sse_event
from tests.support.servers import run
from tests.support.session_gate import (
    JSON,
    PRIMING,
    REQUEST_LOST_MARK,
    SSE,
    App,
    MakeRuntime,
    Transport,
    answer,
    call,
    data,
    exchange,
    gate_for,
    json_script,
    lost_error_of,
    one_owed,
    owed_rows,
    scope,
    sse_script,
)
from tests.support.sessions import REQUEST_LOST, opened, session_status

# -- a POST's owed id --------------------------------------------------------------------------


def test_an_answered_request_passes_through_untouched_and_is_consumed(
    make_runtime: MakeRuntime,
) -> None:
    runtime = make_runtime()
    opened(runtime)
    during: list[str] = []
    events = (
        PRIMING,
        data({"jsonrpc": "2.0", "method": "notifications/progress"}),
        data(answer(7)),
    )
    inner = sse_script(*events)

    async def script(scope: Any, receive: Any, send: Any) -> None:
        during.append(session_status(runtime))
        [row] = owed_rows(runtime)
        during.append(row.status)
        await inner(scope, receive, send)

    transport = Transport(script)
    gate = gate_for(runtime, transport)
    request = call(7, name="resume", arguments={"executionId": "x" * 80})
    reply = run(exchange(gate, scope(), request))
    assert reply.status == 200 and reply.headers == dict(SSE)
    assert reply.body == b"".join(events)
    assert reply.ended
    assert transport.bodies == [json.dumps(request).encode()]
    assert during == ["active", "owed"]
    row = one_owed(runtime)
    assert (row.status, row.request_id, row.method) == ("answered", 7, "tools/call")
    assert row.execution_id == "x" * 64
    assert session_status(runtime) == "idle"


def test_only_a_result_or_error_for_the_owed_id_answers_it(make_runtime: MakeRuntime) -> None:
    runtime = make_runtime()
    opened(runtime)
    not_answers = (
        data(answer(2)),  # another id
        data({"jsonrpc": "2.0", "id": 1, "method": "sampling/createMessage"}),  # a request
        b"event: message\r\ndata: {not json\r\n\r\n",
        data(["not", "a", "message"]),
        b"event: message\r\n\r\n",
    )
    gate = gate_for(runtime, Transport(sse_script(PRIMING, *not_answers)))
    reply = run(exchange(gate, scope(), call(1)))
    row = one_owed(runtime)
    assert row.status == "reported"
    lost = reply.reports()
    assert lost == [lost_error_of(runtime, row)]
    assert lost[0]["id"] == 1
    assert reply.ended


def test_an_answer_split_across_chunks_or_after_a_bad_event_answers_it(
    make_runtime: MakeRuntime,
) -> None:
    runtime = make_runtime()
    opened(runtime)
    whole = data({"jsonrpc": "2.0", "id": "a", "error": {"code": 1, "message": "no"}})
    split = (PRIMING, whole[:20], whole[20:])
    bad_then_answer = (PRIMING + b"data: {oops\n\n" + data(answer("b")),)
    # Bytes that are not UTF-8 in an event, then the answer.
    not_utf8 = (PRIMING, b"event: message\r\ndata: \xff\xfe\r\n\r\n" + data(answer("c")))
    # The answer's JSON over two data lines, and with no space after the colon.
    lines = json.dumps(answer("d"), indent=1).split("\n")
    two_lines = (PRIMING, ("data: " + "\ndata: ".join(lines) + "\n\n").encode())
    no_space = (PRIMING, f"data:{json.dumps(answer('e'))}\n\n".encode())

    async def scenario() -> None:
        cases = (
            ("a", split),
            ("b", bad_then_answer),
            ("c", not_utf8),
            ("d", two_lines),
            ("e", no_space),
        )
        for request_id, events in cases:
            gate = gate_for(runtime, Transport(sse_script(*events)))
            reply = await exchange(gate, scope(), call(request_id))
            assert reply.body == b"".join(events)

    run(scenario())
    assert {row.request_id: row.status for row in owed_rows(runtime)} == {
        name: "answered" for name in "abcde"
    }


def test_a_stream_ending_without_the_answer_reports_it_lost_on_that_stream(
    make_runtime: MakeRuntime,
) -> None:
    runtime = make_runtime()
    opened(runtime)
    gate = gate_for(runtime, Transport(sse_script(PRIMING)))
    reply = run(exchange(gate, scope(), call(3)))
    row = one_owed(runtime)
    assert row.status == "reported"
    # The priming event, the report (an event without an id: the stream's own ids are the
    # SDK's), then the end of the stream the SDK wrote.
    report_event = f"event: message\r\ndata: {json.dumps(lost_error_of(runtime, row))}\r\n\r\n"
    assert [m["body"] for m in reply.bodies] == [PRIMING, report_event.encode(), b""]
    assert [m.get("more_body") for m in reply.bodies] == [True, True, False]
    [report] = reply.sse()
    assert report["error"]["code"] == REQUEST_LOST and report["id"] == 3
    assert report["error"]["data"]["next"] == "re-execute"
    assert session_status(runtime) == "idle"


def test_a_json_answer_is_recognised_whole_and_an_error_status_answers(
    make_runtime: MakeRuntime,
) -> None:
    runtime = make_runtime()
    opened(runtime)
    whole = json.dumps(answer(1)).encode()

    async def bare_end(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": JSON})
        third = json.dumps(answer(3)).encode()
        await send({"type": "http.response.body", "body": third, "more_body": True})
        await send({"type": "http.response.body"})  # body and more_body are optional

    cases: list[tuple[int, App]] = [
        (1, json_script(whole[:10], whole[10:])),
        (2, json_script(b'{"error": "bad request"}', status=400)),
        (3, bare_end),
    ]

    async def scenario() -> None:
        for request_id, script in cases:
            gate = gate_for(runtime, Transport(script))
            reply = await exchange(gate, scope(), call(request_id))
            assert reply.headers == dict(JSON)

    run(scenario())
    assert {row.request_id: row.status for row in owed_rows(runtime)} == {
        1: "answered",
        2: "answered",
        3: "answered",
    }


def test_an_error_status_stream_or_a_headerless_response_is_not_appended_to(
    make_runtime: MakeRuntime,
) -> None:
    """An SSE response with an error status, or one with no headers at all, gets no -32010
    written into it; its id is left lost for the session's next GET."""
    runtime = make_runtime()
    opened(runtime)

    async def headerless(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def scenario() -> None:
        for request_id, script in ((1, sse_script(PRIMING, status=400)), (2, headerless)):
            reply = await exchange(gate_for(runtime, Transport(script)), scope(), call(request_id))
            assert REQUEST_LOST_MARK.encode() not in reply.body

    run(scenario())
    assert {row.request_id: row.status for row in owed_rows(runtime)} == {1: "lost", 2: "lost"}


def test_a_json_response_that_does_not_answer_leaves_the_id_lost_for_the_next_get(
    make_runtime: MakeRuntime,
) -> None:
    """A JSON response cannot take a second message: the id waits for the session's GET."""
    runtime = make_runtime()
    opened(runtime)
    wrong = json.dumps(answer(9)).encode()

    async def scenario() -> None:
        for request_id, body in ((1, wrong), (2, b"not json")):
            gate = gate_for(runtime, Transport(json_script(body)))
            reply = await exchange(gate, scope(), call(request_id))
            assert reply.body == body and reply.ended

    run(scenario())
    assert {row.request_id: row.status for row in owed_rows(runtime)} == {1: "lost", 2: "lost"}


async def hang(scope: Any, receive: Any, send: Any) -> None:
    await anyio.sleep_forever()


def sse_then_hang(scope: Any, receive: Any, send: Any) -> Awaitable[None]:
    async def go() -> None:
        await send({"type": "http.response.start", "status": 200, "headers": SSE})
        await send({"type": "http.response.body", "body": PRIMING, "more_body": True})
        await anyio.sleep_forever()

    return go()


def test_a_passed_deadline_reports_the_id_on_its_stream_and_ends_it(
    make_runtime: MakeRuntime,
) -> None:
    runtime = make_runtime()
    opened(runtime)
    gate = gate_for(runtime, Transport(sse_then_hang), deadline=0.2)
    reply = run(exchange(gate, scope(), call(4)))
    row = one_owed(runtime)
    assert row.status == "reported"
    assert [m["body"] for m in reply.bodies] == [
        PRIMING,
        sse_event(lost_error_of(runtime, row)),
        b"",
    ]
    assert [m.get("more_body") for m in reply.bodies] == [True, True, False]
    assert session_status(runtime) == "idle"


def test_a_request_not_started_by_the_deadline_is_answered_32010_as_json(
    make_runtime: MakeRuntime,
) -> None:
    runtime = make_runtime()
    opened(runtime)
    gate = gate_for(runtime, Transport(hang), deadline=0.2)
    reply = run(exchange(gate, scope(), call(5)))
    row = one_owed(runtime)
    assert row.status == "reported"
    assert reply.status == 200 and reply.headers == dict(JSON)
    assert reply.json() == lost_error_of(runtime, row)
    assert reply.ended and len(reply.bodies) == 1


def test_a_json_response_under_way_at_the_deadline_is_left_lost(
    make_runtime: MakeRuntime,
) -> None:
    runtime = make_runtime()
    opened(runtime)

    async def partial(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": JSON})
        await send({"type": "http.response.body", "body": b'{"jsonrpc"', "more_body": True})
        await anyio.sleep_forever()

    gate = gate_for(runtime, Transport(partial), deadline=0.2)
    reply = run(exchange(gate, scope(), call(6)))
    assert reply.body == b'{"jsonrpc"'  # no second message in a JSON body
    assert one_owed(runtime).status == "lost"


def test_draining_reports_what_an_open_request_owes(make_runtime: MakeRuntime) -> None:
    runtime = make_runtime()
    opened(runtime)
    drain = DrainSignal()

    async def script(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": SSE})
        await send({"type": "http.response.body", "body": PRIMING, "more_body": True})
        drain.trigger()
        await anyio.sleep_forever()

    gate = gate_for(runtime, Transport(script), drain=drain)
    reply = run(exchange(gate, scope(), call(8)))
    assert one_owed(runtime).status == "reported"
    assert [m["id"] for m in reply.sse()] == [8]
    assert reply.ended


T = TypeVar("T")


async def within_seconds(seconds: float, awaited: Awaitable[T]) -> T:
    """`awaited`, or TimeoutError: what a drain cuts short must not wait for the deadline."""
    with anyio.fail_after(seconds):
        return await awaited


@pytest.mark.parametrize("begun", ["on another thread as it runs", "before it arrived"])
def test_a_drain_reports_an_open_requests_id_without_waiting_for_its_deadline(
    make_runtime: MakeRuntime, begun: str
) -> None:
    # SIGTERM's handler and the runtime's drain are not on the event loop's thread; and a
    # request may arrive once the drain began: either way it is cut short and its id
    # reported, not left to its deadline (an hour here).
    runtime = make_runtime()
    opened(runtime)
    drain = DrainSignal()
    if begun == "before it arrived":
        drain.trigger()

    async def script(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": SSE})
        await send({"type": "http.response.body", "body": PRIMING, "more_body": True})
        if begun == "on another thread as it runs":
            threading.Thread(target=drain.trigger).start()
        await anyio.sleep_forever()

    gate = gate_for(runtime, Transport(script), drain=drain, deadline=3600)
    reply = run(within_seconds(10, exchange(gate, scope(), call(10))))
    assert one_owed(runtime).status == "reported"
    # On the stream once it started; as the JSON answer when the drain came first.
    told = [m["id"] for m in reply.sse()] if reply.sse() else [reply.json()["id"]]
    assert told == [10]
    assert reply.ended


def test_a_client_gone_before_the_deadline_leaves_its_id_lost_for_the_next_get(
    make_runtime: MakeRuntime,
) -> None:
    runtime = make_runtime()
    opened(runtime)

    async def script(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": SSE})
        await send({"type": "http.response.body", "body": PRIMING, "more_body": True})
        assert (await receive())["type"] == "http.disconnect"
        await anyio.sleep_forever()

    gate = gate_for(runtime, Transport(script), deadline=0.3)
    reply = run(exchange(gate, scope(), call(9), then=[{"type": "http.disconnect"}]))
    assert reply.body == PRIMING  # nothing written to a client that is gone
    assert one_owed(runtime).status == "lost"


def test_a_request_the_server_cancels_still_settles_its_id_and_its_session(
    make_runtime: MakeRuntime,
) -> None:
    """The server cancels the request's task (a shutdown past its grace period) while the
    transport works on it: the gate still settles its id as lost (for the session's next GET:
    what the cancelled stream is sent may never arrive), rather than leaving it owed by a live
    incarnation, and ends the request, so the session goes idle."""
    runtime = make_runtime()
    opened(runtime)

    async def scenario() -> None:
        reached = anyio.Event()

        async def hang_once_reached(scope: Any, receive: Any, send: Any) -> None:
            reached.set()
            await anyio.sleep_forever()

        gate = gate_for(runtime, Transport(hang_once_reached), deadline=60)
        async with anyio.create_task_group() as group:
            group.start_soon(exchange, gate, scope(), call(6))
            await reached.wait()
            group.cancel_scope.cancel()

    run(scenario())
    assert (
        one_owed(runtime).status == "lost"
    )  # for the next GET: the cancelled stream may not deliver
    assert session_status(runtime) == "idle"
