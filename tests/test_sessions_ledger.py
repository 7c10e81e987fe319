"""Durable sessions and the owed-request ledger's core (`machine/sessions.py`), driven as the
HTTP layer drives it, on the real store with a fake clock: a session is active while a
request is in flight, every owed id ends answered or reported, and a dead incarnation's
sessions and debts are taken over."""

from __future__ import annotations

import contextlib
import json
import logging
import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from pydantic import JsonValue
from sqlmodel import select

from lockgate.machine.db.schema import Session
from lockgate.machine.faults import Faults, InjectedCrash
from lockgate.machine.lost_report import REQUEST_LOST, request_key
from lockgate.machine.runtime import Runtime
from lockgate.server.durable_sessions import DurableSessionManager, restored_params
from lockgate.server.session_gate import SessionGate
from lockgate.spec import CrashPoint
from tests.support.servers import run
from tests.support.sessions import (
    PROTOCOL,
    URL,
    FakeClock,
    eventually,
    headers,
    key_for,
    opened,
    owed_status,
    raw_initialize,
    serving,
    session_status,
)
from tests.support.sse import sse_messages

MakeRuntime = Callable[..., Runtime]


def test_a_session_is_active_while_any_request_is_in_flight(make_runtime: MakeRuntime) -> None:
    clock = FakeClock()
    runtime = make_runtime(clock=clock)
    runtime.sessions.open("s", "alice", PROTOCOL, {"name": "t", "version": "1"}, {"x": 1})
    row = runtime.sessions.get("s")
    assert row is not None
    assert (row.status, row.principal_id, row.protocol_version) == ("active", "alice", PROTOCOL)
    assert (row.client_info, row.capabilities) == ({"name": "t", "version": "1"}, {"x": 1})
    assert row.incarnation == runtime.lease.incarnation
    runtime.sessions.end_request("s")
    assert session_status(runtime, "s") == "idle"
    clock.advance(timedelta(seconds=3))
    runtime.sessions.begin_request("s")
    runtime.sessions.begin_request("s")
    assert session_status(runtime, "s") == "active"
    runtime.sessions.end_request("s")
    assert session_status(runtime, "s") == "active"  # one is still in flight
    runtime.sessions.end_request("s")
    row = runtime.sessions.get("s")
    assert row is not None and row.status == "idle"
    assert row.last_activity == clock.now


def test_closing_ends_the_session_and_settles_its_uncollected_reports(
    make_runtime: MakeRuntime,
) -> None:
    runtime = make_runtime()
    opened(runtime)
    lost = runtime.ledger.owe("s", 1, "tools/call", None)
    runtime.ledger.lose(lost)
    owed = runtime.ledger.owe("s", 2, "tools/call", None)
    assert runtime.sessions.live_count("alice") == 1
    assert runtime.sessions.close("s") is True
    assert session_status(runtime, "s") == "closed"
    assert owed_status(runtime, lost.id) == "uncollected"
    assert owed_status(runtime, owed.id) == "owed"
    assert runtime.sessions.live("s") is None
    assert runtime.sessions.live_count("alice") == 0
    assert runtime.sessions.close("s") is False  # already closed
    assert runtime.sessions.close("nobody") is False


def test_live_count_counts_the_principals_live_sessions_only(make_runtime: MakeRuntime) -> None:
    runtime = make_runtime()
    opened(runtime, "a1")
    runtime.sessions.open("a2", "alice", PROTOCOL, {}, {})  # active
    opened(runtime, "b1", principal="bob")
    opened(runtime, "a3")
    runtime.sessions.close("a3")
    assert runtime.sessions.live_count("alice") == 2
    assert runtime.sessions.live_count("bob") == 1
    assert runtime.sessions.live_count("carol") == 0


def test_every_owed_id_ends_answered_or_reported(make_runtime: MakeRuntime) -> None:
    runtime = make_runtime()
    opened(runtime)
    answered = runtime.ledger.owe("s", 1, "tools/call", None)
    runtime.ledger.answered(answered)
    assert owed_status(runtime, answered.id) == "answered"
    runtime.ledger.answered(answered)  # twice is harmless
    reported = runtime.ledger.owe("s", "two", "tools/call", None)
    runtime.ledger.lose(reported)
    assert owed_status(runtime, reported.id) == "lost"
    assert runtime.ledger.still_owed("s", "two") is False
    runtime.ledger.reported(reported)
    assert owed_status(runtime, reported.id) == "reported"
    assert runtime.ledger.lost_reports("s") == []


def test_lost_reports_for_one_stream_name_only_its_request(make_runtime: MakeRuntime) -> None:
    runtime = make_runtime()
    opened(runtime)
    for request_id in (1, "b"):
        runtime.ledger.lose(runtime.ledger.owe("s", request_id, "tools/call", None))
    still = runtime.ledger.owe("s", 3, "tools/call", None)
    [(record, error)] = runtime.ledger.lost_reports("s", "b")
    assert error["id"] == "b"
    assert record.status == "lost"
    assert sorted(str(e["id"]) for _, e in runtime.ledger.lost_reports("s")) == ["1", "b"]
    assert runtime.ledger.still_owed("s", "3") is True
    assert runtime.ledger.still_owed("s", "1") is False
    assert owed_status(runtime, still.id) == "owed"


def test_a_lost_request_that_started_nothing_says_to_send_it_again(
    make_runtime: MakeRuntime,
) -> None:
    runtime = make_runtime()
    opened(runtime)
    runtime.ledger.lose(runtime.ledger.owe("s", 5, "tools/list", None))
    [(_, error)] = runtime.ledger.lost_reports("s")
    assert error == {
        "jsonrpc": "2.0",
        "id": 5,
        "error": {
            "code": REQUEST_LOST,
            "message": "The server lost this request (it restarted or the stream broke) "
            "before answering it.",
            "data": {
                "requestMethod": "tools/list",
                "executionId": None,
                "next": "re-execute",
                "hint": "The server stopped before this request started any execution: "
                "nothing ran. Send it again.",
            },
        },
    }


def _data(runtime: Runtime) -> dict[str, Any]:
    [(_, error)] = runtime.ledger.lost_reports("s")
    body: Any = error["error"]
    assert body["code"] == REQUEST_LOST
    data: dict[str, Any] = body["data"]
    return data


def test_a_lost_request_names_what_became_of_its_execution(make_runtime: MakeRuntime) -> None:
    runtime = make_runtime()
    opened(runtime)
    # Found by the request that started it.
    paused = runtime.engine.execute(
        "alice", "tools.notes.write(key='k', text='v')", "s", request_key("s", 1)
    )
    runtime.ledger.lose(runtime.ledger.owe("s", 1, "tools/call", None))
    data = _data(runtime)
    assert (data["executionId"], data["status"], data["next"]) == (
        paused.id,
        "waiting_for_interaction",
        "resume",
    )
    assert data["hint"] == (
        "The execution is paused for approval: call `resume` with this executionId and "
        "action accept, decline or cancel."
    )
    [(record, _)] = runtime.ledger.lost_reports("s")
    runtime.ledger.reported(record)
    # Or named by the resume that was lost.
    done = runtime.engine.execute("alice", "1 + 1")
    runtime.ledger.lose(runtime.ledger.owe("s", 2, "tools/call", done.id))
    data = _data(runtime)
    assert (data["executionId"], data["status"], data["next"]) == (done.id, "completed", "fetch")
    assert data["hint"] == (
        "The execution is completed: call `resume` with this executionId and no action to "
        "read its outcome."
    )


def test_a_dead_incarnations_sessions_go_idle_and_its_debts_are_lost(
    make_runtime: MakeRuntime,
) -> None:
    clock = FakeClock()
    dead = make_runtime(clock=clock, instance_name="dead", lease_ttl="1")
    dead.sessions.open("s", "alice", PROTOCOL, {}, {})  # active, owing a request
    owed = dead.ledger.owe("s", 1, "tools/call", None)
    clock.advance(timedelta(seconds=5))
    alive = make_runtime(clock=clock, instance_name="alive", lease_ttl="60")
    mine = alive.ledger.owe("s", 2, "tools/call", None)
    assert alive.sessions.recover() == 2  # one session released, one request lost
    assert session_status(alive, "s") == "idle"
    assert owed_status(alive, owed.id) == "lost"
    assert owed_status(alive, mine.id) == "owed"  # its own debts are never orphans
    assert alive.sessions.recover() == 0


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


# -- edges of the core ---------------------------------------------------------------------


def test_requests_on_unknown_sessions_are_ignored(make_runtime: MakeRuntime) -> None:
    runtime = make_runtime()
    runtime.sessions.begin_request("nobody")
    runtime.sessions.end_request("nobody")
    assert runtime.sessions.get("nobody") is None
    assert runtime.sessions.live("nobody") is None


def test_live_is_the_row_of_a_live_session(make_runtime: MakeRuntime) -> None:
    runtime = make_runtime()
    opened(runtime)
    live = runtime.sessions.live("s")
    assert live is not None and (live.id, live.status) == ("s", "idle")


def test_a_session_taken_over_by_another_instance_is_its_own(make_runtime: MakeRuntime) -> None:
    """A request on another instance makes the session that incarnation's; its end idles the
    session there, though that process never saw the session begin."""
    first = make_runtime(instance_name="first")
    opened(first)
    second = make_runtime(instance_name="second")
    second.sessions.begin_request("s")
    row = second.sessions.get("s")
    assert row is not None and row.status == "active"
    assert row.incarnation == second.lease.incarnation
    third = make_runtime(instance_name="third")
    third.sessions.end_request("s")  # this process never counted it in flight
    assert session_status(third, "s") == "idle"


def test_the_sweep_keeps_a_session_with_running_work_only(make_runtime: MakeRuntime) -> None:
    clock = FakeClock()
    started = CrashPoint.parse("execution:start:pending->running:after_commit")
    limits = {"session_idle_timeout": "60", "session_lease": "60", "session_cap": "600"}
    runtime = make_runtime(clock=clock, faults=Faults([started]), **limits)
    opened(runtime, "busy")
    opened(runtime, "quiet")
    lost = runtime.ledger.owe("quiet", 1, "tools/call", None)
    runtime.ledger.lose(lost)  # a report nobody collected
    with pytest.raises(InjectedCrash):  # the execution stays running, in session busy
        runtime.engine.execute("alice", "1 + 1", "busy", request_key("busy", 1))
    clock.advance(timedelta(seconds=90))
    assert runtime.sessions.sweep() == ["quiet"]
    assert session_status(runtime, "busy") == "idle"
    assert session_status(runtime, "quiet") == "expired"
    assert owed_status(runtime, lost.id) == "uncollected"  # settled with the session


def test_a_report_for_one_session_takes_over_only_that_sessions_debts(
    make_runtime: MakeRuntime,
) -> None:
    clock = FakeClock()
    dead = make_runtime(clock=clock, instance_name="dead", lease_ttl="1")
    opened(dead, "s")
    opened(dead, "t")
    on_s = dead.ledger.owe("s", 1, "tools/call", None)
    on_t = dead.ledger.owe("t", 1, "tools/call", None)
    clock.advance(timedelta(seconds=5))
    alive = make_runtime(clock=clock, instance_name="alive", lease_ttl="60")
    [(record, error)] = alive.ledger.lost_reports("s")
    assert record.id == on_s.id and error["id"] == 1
    assert owed_status(alive, on_t.id) == "owed"  # t's GET will report it
    assert [r.id for r, _ in alive.ledger.lost_reports("t")] == [on_t.id]


def test_recovery_takes_over_dead_incarnations_only(make_runtime: MakeRuntime) -> None:
    clock = FakeClock()
    dead = make_runtime(clock=clock, instance_name="dead", lease_ttl="10")
    for session_id in ("d1", "d2"):
        dead.sessions.open(session_id, "alice", PROTOCOL, {}, {})
    lost = [dead.ledger.owe("d1", n, "tools/call", None) for n in (1, 2)]
    alive = make_runtime(clock=clock, instance_name="alive", lease_ttl="60")
    other = make_runtime(clock=clock, instance_name="other", lease_ttl="60")
    assert alive.sessions.recover() == 0  # nobody is dead yet
    alive.sessions.open("mine", "alice", PROTOCOL, {}, {})
    theirs = other.ledger.owe("mine", 9, "tools/call", None)
    clock.advance(timedelta(seconds=10))  # dead's lease ends exactly now
    assert alive.sessions.recover() == 4  # two sessions released, two requests lost
    assert [session_status(alive, s) for s in ("d1", "d2", "mine")] == ["idle", "idle", "active"]
    assert [owed_status(alive, o.id) for o in lost] == ["lost", "lost"]
    assert owed_status(alive, theirs.id) == "owed"  # other's lease holds


def _lost_data_after(runtime: Runtime, session_id: str = "s") -> dict[str, Any]:
    [(_, error)] = runtime.ledger.lost_reports(session_id)
    body: Any = error["error"]
    data: dict[str, Any] = body["data"]
    return data


def test_a_lost_request_whose_execution_runs_on_says_to_wait(make_runtime: MakeRuntime) -> None:
    started = CrashPoint.parse("execution:start:pending->running:after_commit")
    runtime = make_runtime(faults=Faults([started]))
    opened(runtime)
    with pytest.raises(InjectedCrash):
        runtime.engine.execute("alice", "1 + 1", "s", request_key("s", 1))
    runtime.ledger.lose(runtime.ledger.owe("s", 1, "tools/call", None))
    data = _lost_data_after(runtime)
    assert (data["status"], data["next"]) == ("running", "wait")
    assert data["hint"] == (
        "The execution was recovered and is running again: call `resume` with this "
        "executionId and no action to get its result."
    )


def test_a_lost_request_whose_execution_was_interrupted_says_what_ran(
    make_runtime: MakeRuntime,
) -> None:
    clock = FakeClock()
    common = {"policy": "notes.write=approve", "lease_ttl": "1"}
    write_ran = CrashPoint.parse("tool_call:dispatch:approved->dispatched:after_effect")
    dying = make_runtime(clock=clock, instance_name="a", faults=Faults([write_ran]), **common)
    opened(dying)
    dying.ledger.owe("s", 3, "tools/call", None)
    with pytest.raises(InjectedCrash):
        dying.engine.execute(
            "alice", "tools.notes.write(key='k', text='v')", "s", request_key("s", 3)
        )
    clock.advance(timedelta(seconds=5))
    data = _lost_data_after(make_runtime(clock=clock, instance_name="b", **common))
    assert (data["status"], data["next"]) == ("interrupted", "check")
    assert data["whatRan"] == {
        "calls": [{"seq": 1, "tool": "notes.write", "status": "in_doubt"}],
        "in_doubt": [{"seq": 1, "tool": "notes.write"}],
    }
    assert data["hint"] == (
        "The execution was interrupted; whatRan names the calls that ran and the call in "
        "doubt. Check it before running the code again."
    )


class MovedMeanwhile(Faults):
    """Another instance closes a session from this one's first write of `event` on it (its
    before-commit point), so this one's write finds the row moved."""

    def __init__(self, event: str) -> None:
        super().__init__()
        self.event = event
        self.other: Runtime | None = None
        self.session_id = ""

    def reached(self, point: CrashPoint) -> None:
        super().reached(point)
        if self.other is not None and point.machine == "session" and point.event == self.event:
            other, self.other = self.other, None
            assert other.sessions.close(self.session_id)


def test_a_close_that_lost_the_race_says_so(make_runtime: MakeRuntime) -> None:
    faults = MovedMeanwhile("close")
    here = make_runtime(faults=faults, instance_name="here")
    opened(here)
    faults.other, faults.session_id = make_runtime(instance_name="elsewhere"), "s"
    assert here.sessions.close("s") is False  # the other instance closed it first
    assert session_status(here, "s") == "closed"


def test_a_sweep_that_lost_one_session_goes_on_with_the_rest(make_runtime: MakeRuntime) -> None:
    clock = FakeClock()
    limits = {"session_idle_timeout": "60", "session_cap": "600"}
    faults = MovedMeanwhile("destroy")
    here = make_runtime(clock=clock, faults=faults, instance_name="here", **limits)
    opened(here, "s1")
    opened(here, "s2")
    with here.engine.store.session() as s:
        first, second = [row.id for row in s.exec(select(Session))]
    faults.other = make_runtime(clock=clock, instance_name="elsewhere", **limits)
    faults.session_id = first
    clock.advance(timedelta(seconds=90))
    assert here.sessions.sweep() == [second]
    assert (session_status(here, first), session_status(here, second)) == ("closed", "expired")


def test_recovery_that_lost_one_session_goes_on_with_the_rest(make_runtime: MakeRuntime) -> None:
    clock = FakeClock()
    dead = make_runtime(clock=clock, instance_name="dead", lease_ttl="1")
    for session_id in ("d1", "d2"):
        dead.sessions.open(session_id, "alice", PROTOCOL, {}, {})  # left active
    clock.advance(timedelta(seconds=5))
    faults = MovedMeanwhile("release")
    here = make_runtime(clock=clock, faults=faults, instance_name="here")
    with here.engine.store.session() as s:
        first, second = [row.id for row in s.exec(select(Session))]
    faults.other = make_runtime(clock=clock, instance_name="elsewhere")
    faults.session_id = first
    assert here.sessions.recover() == 1  # the other instance closed the first one
    assert (session_status(here, first), session_status(here, second)) == ("closed", "idle")


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
    execute = {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "tools/call",
        "params": {"name": "execute", "arguments": {"code": "6 * 7"}},
    }

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


def test_a_revived_session_idle_past_the_cap_leaves_memory(make_runtime: MakeRuntime) -> None:
    """The row is the session; its transport stays in memory at most the session cap."""
    first = make_runtime(instance_name="first")
    key = key_for(first, "alice")
    second = make_runtime(instance_name="second", session_cap="1", session_idle_timeout="1")
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

    run(scenario())
