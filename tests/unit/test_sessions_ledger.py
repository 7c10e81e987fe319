"""The owed-request ledger's core (`machine/ledger.py`), driven as the HTTP layer drives it,
on the real store: every owed id ends answered or reported, lost reports per stream and per
session (a report for one session takes over only that session's debts from a dead
incarnation), and the -32010 body of every branch: re-execute, wait, resume, check with
whatRan, fetch.

The session lifecycle is in `test_sessions_lifecycle.py`, sessions revived through the
application in `test_sessions_revived.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from lockgate.machine.faults import Faults, InjectedCrash
from lockgate.machine.lost_report import REQUEST_LOST, request_key
from lockgate.machine.runtime import Runtime
from lockgate.spec import CrashPoint
from tests.support.sessions import FakeClock, opened, owed_status

MakeRuntime = Callable[..., Runtime]


def test_every_owed_id_ends_answered_or_reported(make_runtime: MakeRuntime) -> None:
    runtime = make_runtime()
    opened(runtime)
    answered = runtime.ledger.owe("s", 1, "tools/call", None)
    written: list[str] = []

    def write() -> None:
        # The response goes out while the entry is still owed: consumed only after.
        written.append(owed_status(runtime, answered.id))

    runtime.ledger.answered(answered, write)
    assert written == ["owed"]
    assert owed_status(runtime, answered.id) == "answered"
    runtime.ledger.answered(answered, write)  # twice is harmless, and writes nothing again
    assert written == ["owed"]
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
            "message": "The server lost request 5 (tools/list) before answering it (it "
            "restarted, shut down, or the stream broke). The request started no execution: "
            "nothing ran. Send it again.",
            "data": {
                "requestMethod": "tools/list",
                "executionId": None,
                "next": "re-execute",
                "hint": "The request started no execution: nothing ran. Send it again.",
            },
        },
    }


def _data(runtime: Runtime) -> dict[str, Any]:
    [(_, error)] = runtime.ledger.lost_reports("s")
    body: Any = error["error"]
    assert body["code"] == REQUEST_LOST
    data: dict[str, Any] = body["data"]
    # The message carries the same next step, for clients that show a model nothing else.
    assert body["message"].endswith(data["hint"]), body
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
        f"Execution {paused.id} is paused for approval: call `resume` with "
        f"executionId={paused.id} and no action to see the call and its approval link "
        "(decline or cancel give it up; accept only where the server lets the agent approve)."
    )
    [(record, _)] = runtime.ledger.lost_reports("s")
    runtime.ledger.reported(record)
    # Or named by the resume that was lost.
    done = runtime.engine.execute("alice", "1 + 1")
    runtime.ledger.lose(runtime.ledger.owe("s", 2, "tools/call", done.id))
    data = _data(runtime)
    assert (data["executionId"], data["status"], data["next"]) == (done.id, "completed", "fetch")
    assert data["hint"] == (
        f"Execution {done.id} is completed: call `resume` with executionId={done.id} and no "
        "action to read its outcome."
    )


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


def test_a_request_another_live_instance_still_owes_is_left_to_it(
    make_runtime: MakeRuntime,
) -> None:
    # A session moves between instances: its request in flight on a live one is that one's
    # to answer, whatever the session's next request on another instance reads; the one a
    # dead instance owed is reported there.
    clock = FakeClock()
    dead = make_runtime(clock=clock, instance_name="dead", lease_ttl="1")
    opened(dead, "s")
    orphan = dead.ledger.owe("s", 1, "tools/call", None)
    clock.advance(timedelta(seconds=5))
    busy = make_runtime(clock=clock, instance_name="busy", lease_ttl="60")
    in_flight = busy.ledger.owe("s", 2, "tools/call", None)
    here = make_runtime(clock=clock, instance_name="here", lease_ttl="60")
    mine = here.ledger.owe("s", 3, "tools/call", None)
    assert [r.id for r, _ in here.ledger.lost_reports("s")] == [orphan.id]
    assert owed_status(here, in_flight.id) == "owed"
    assert owed_status(here, mine.id) == "owed"


def _lost_data_after(runtime: Runtime, session_id: str = "s") -> dict[str, Any]:
    [(_, error)] = runtime.ledger.lost_reports(session_id)
    body: Any = error["error"]
    data: dict[str, Any] = body["data"]
    assert body["message"].endswith(data["hint"]), body
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
    name = data["executionId"]
    assert data["hint"] == (
        f"Execution {name} is running: call `resume` with executionId={name} and no action "
        "to wait for its result."
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
    name = data["executionId"]
    assert data["hint"].startswith(
        f"Execution {name} was interrupted: a call may or may not have taken effect"
    )
