"""Durable sessions through the real application (`server.app.create_app`, over ASGI):
sessions that outlive their process. A session opened on one instance is served by another,
which revives it from its row with the client's initialize state restored (also from a
malformed row; stored capabilities kept); a revived session runs a tool, primes its stream
with the configured retry, replays only its own streams, logs its opening and revival,
refuses another Host or Origin (opened and revived transports), is let go and revived again
after its loop crashed, and leaves memory (with its replay log) once idle for
LOCKGATE_SESSION_MEMORY_SECS, to come back at its next request.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
from collections.abc import Callable
from typing import Any

import pytest
from pydantic import JsonValue

from lockgate.machine.runtime import Runtime
from lockgate.server.durable_sessions import DurableSessionManager, restored_params
from lockgate.server.session_gate import SessionGate
from tests.support.servers import run
from tests.support.sessions import (
    PROTOCOL,
    URL,
    FakeClock,
    eventually,
    execute_request,
    headers,
    key_for,
    raw_initialize,
    serving,
)
from tests.support.sse import sse_messages

MakeRuntime = Callable[..., Runtime]


# -- through the application: sessions that outlive their process ---------------------------


def test_a_session_opened_on_one_instance_is_served_by_another(make_runtime: MakeRuntime) -> None:
    """The second instance holds no transport for the session: it revives it from its row,
    with the client's initialize state restored, and answers without a new initialize."""
    first = make_runtime(instance_name="first")
    key = key_for(first, "alice")
    second = make_runtime(instance_name="second")
    listed = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}

    async def scenario() -> None:
        async with serving(first) as (http, _):
            session_id = await raw_initialize(http, URL, key)
        async with serving(second) as (http, _):
            answer = await http.post(URL, headers=headers(key, session_id), json=listed)
            assert answer.status_code == 200, answer.text
            [message] = sse_messages(answer.content)
            assert message["id"] == 2
            assert "execute" in {tool["name"] for tool in message["result"]["tools"]}
            unknown = await http.post(URL, headers=headers(key, "no-such-session"), json=listed)
            assert unknown.status_code == 404
            closed = await http.delete(URL, headers=headers(key, session_id))
            assert closed.status_code == 200
            again = await http.post(URL, headers=headers(key, session_id), json=listed)
            assert again.status_code == 404, again.text
        row = second.sessions.get(session_id)
        assert row is not None and row.status == "closed"
        assert row.client_info == {"name": "raw-test", "version": "1.0"}

    run(scenario())


def test_restored_initialize_parameters_survive_a_malformed_row(
    make_runtime: MakeRuntime,
) -> None:
    runtime = make_runtime()
    runtime.sessions.open("good", "alice", PROTOCOL, {"name": "c", "version": "2"}, {})
    runtime.sessions.open("bad", "alice", PROTOCOL, {"name": 3}, {"roots": "not an object"})
    good, bad = runtime.sessions.get("good"), runtime.sessions.get("bad")
    assert good is not None and bad is not None
    params = restored_params(good)
    assert (params.client_info.name, params.client_info.version) == ("c", "2")
    assert params.protocol_version == PROTOCOL
    fallback = restored_params(bad)
    assert (fallback.client_info.name, fallback.client_info.version) == ("unknown", "0")
    assert fallback.capabilities.roots is None


def test_restored_initialize_parameters_keep_the_stored_capabilities(
    make_runtime: MakeRuntime,
) -> None:
    runtime = make_runtime()
    caps: JsonValue = {"roots": {"listChanged": True}, "elicitation": {}}
    runtime.sessions.open("s", "alice", PROTOCOL, {"name": "c", "version": "2"}, caps)
    row = runtime.sessions.get("s")
    assert row is not None
    params = restored_params(row)
    assert params.capabilities.roots is not None
    assert params.capabilities.roots.list_changed is True
    assert params.capabilities.elicitation is not None


def test_a_revived_session_runs_tools_and_replays_its_own_streams_only(
    make_runtime: MakeRuntime, caplog: pytest.LogCaptureFixture
) -> None:
    """Another instance revives the session: a tool call runs there, its stream can be
    resumed there (and only on that session), and a DELETE lets the transport go."""
    first = make_runtime(instance_name="first")
    key = key_for(first, "alice")
    second = make_runtime(instance_name="second")
    execute = execute_request(2, "6 * 7")

    async def scenario() -> None:
        caplog.set_level(logging.INFO, logger="lockgate.sessions")
        async with serving(first) as (http, _):
            session_id = await raw_initialize(http, URL, key)
        assert f"opened session {session_id}" in caplog.messages
        async with serving(second) as (http, auth):
            gate = auth.app
            assert isinstance(gate, SessionGate)
            assert not gate.held(session_id)
            answer = await http.post(URL, headers=headers(key, session_id), json=execute)
            assert answer.status_code == 200, answer.text
            assert f"revived session {session_id} from its row" in caplog.messages
            [message] = sse_messages(answer.content)
            assert message["id"] == 2 and "error" not in message, message
            assert "42" in json.dumps(message["result"])
            assert gate.held(session_id)
            # The priming event tells the client how soon to reconnect (the configured retry).
            assert f"retry: {second.settings.sse_retry_ms}" in answer.text
            event_ids = re.findall(r"^id: (\S+)", answer.text, re.MULTILINE)
            assert event_ids, answer.text  # the priming event, at least
            assert gate.replayable(session_id, event_ids[0])
            assert not gate.replayable(session_id, "2:999")
            assert not gate.replayable("another-session", event_ids[0])
            closed = await http.delete(URL, headers=headers(key, session_id))
            assert closed.status_code == 200
            await eventually(lambda: not gate.held(session_id), "the transport to go")
            assert not gate.replayable(session_id, event_ids[0])

    run(scenario())


def test_a_session_request_naming_another_host_is_refused_by_the_transport(
    make_runtime: MakeRuntime,
) -> None:
    """/mcp's Host and Origin checks are the SDK transport's: every session's transport,
    opened or revived, carries the server's security settings."""
    first = make_runtime(instance_name="first")
    key = key_for(first, "alice")
    second = make_runtime(instance_name="second")
    listed = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}

    async def scenario() -> None:
        async with serving(first) as (http, _):
            session_id = await raw_initialize(http, URL, key)
            bad_host = headers(key, session_id, Host="evil.example")
            refused = await http.post(URL, headers=bad_host, json=listed)
            assert refused.status_code == 421, refused.text
        async with serving(second) as (http, _):  # revived here
            bad_origin = headers(key, session_id, Origin="http://evil.example")
            refused = await http.post(URL, headers=bad_origin, json=listed)
            assert refused.status_code == 403, refused.text
            ok = await http.post(URL, headers=headers(key, session_id), json=listed)
            assert ok.status_code == 200, ok.text

    run(scenario())


def test_a_revived_session_whose_loop_crashed_is_let_go_and_revived_again(
    make_runtime: MakeRuntime, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = make_runtime(instance_name="first")
    key = key_for(first, "alice")
    second = make_runtime(instance_name="second")
    listed = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
    import lockgate.server.durable_sessions as durable

    real = durable.serve_connection  # type: ignore[attr-defined]
    crashes = [True]

    async def crashing(*args: Any, **kwargs: Any) -> None:
        if crashes and crashes.pop():
            raise RuntimeError("the session loop broke")
        await real(*args, **kwargs)

    monkeypatch.setattr(durable, "serve_connection", crashing)

    async def scenario() -> None:
        async with serving(first) as (http, _):
            session_id = await raw_initialize(http, URL, key)
        caplog.set_level(logging.INFO, logger="lockgate.sessions")
        async with serving(second) as (http, auth):
            gate = auth.app
            assert isinstance(gate, SessionGate)
            with contextlib.suppress(Exception):
                await http.post(URL, headers=headers(key, session_id), json=listed)
            await eventually(lambda: not gate.held(session_id), "the crashed transport to go")
            assert f"revived session {session_id} crashed" in caplog.messages
            again = await http.post(URL, headers=headers(key, session_id), json=listed)
            assert again.status_code == 200, again.text
            [message] = sse_messages(again.content)
            assert message["id"] == 2 and "tools" in message["result"]

    run(scenario())


def test_an_idle_session_leaves_memory_and_comes_back_at_its_next_request(
    make_runtime: MakeRuntime,
) -> None:
    """The row is the session; its transport stays in memory only while it is used, plus
    LOCKGATE_SESSION_MEMORY_SECS. The row's clock stands still (the session stays within its
    idle timeout however slowly this machine runs); the transport's memory is bounded by
    real time, which is what is measured here."""
    clock = FakeClock()
    first = make_runtime(instance_name="first", clock=clock)
    key = key_for(first, "alice")
    bobs = key_for(first, "bob")
    second = make_runtime(instance_name="second", session_memory_secs="1", clock=clock)
    listed = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}

    async def scenario() -> None:
        async with serving(first) as (http, _):
            session_id = await raw_initialize(http, URL, key)
        async with serving(second) as (http, auth):
            gate = auth.app
            assert isinstance(gate, SessionGate)
            manager = getattr(gate.replayable, "__self__")  # noqa: B009
            assert isinstance(manager, DurableSessionManager)
            ok = await http.post(URL, headers=headers(key, session_id), json=listed)
            assert ok.status_code == 200, ok.text
            assert gate.held(session_id)
            assert manager.replay.bytes_held > 0  # the stream's events, for a resumption
            await eventually(lambda: not gate.held(session_id), "the idle transport to go", 10)
            # Its replay log goes with it.
            await eventually(lambda: manager.replay.bytes_held == 0, "the replay log to go")
            # Out of memory is not up for grabs: another principal naming it gets the 404 an
            # unknown session gets, and does not bring it back.
            other = await http.post(URL, headers=headers(bobs, session_id), json=listed)
            assert other.status_code == 404, other.text
            assert not gate.held(session_id)
            # The session itself did not end: its owner's next request brings it back.
            again = await http.post(URL, headers=headers(key, session_id), json=listed)
            assert again.status_code == 200, again.text
            assert gate.held(session_id)

    run(scenario())
