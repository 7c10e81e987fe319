"""Durable sessions' lifecycle (`machine/sessions.py`), driven as the HTTP layer drives it,
on the real store with a fake clock: a session is active while any request is in flight,
closing settles its uncollected reports, live counts per principal, requests on unknown
sessions, a session taken over by another instance, the sweep keeping a session with running
work only, a dead incarnation's sessions and debts taken over (and live ones left alone),
and a close, a sweep or a recovery that loses a race to another instance.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from sqlmodel import select

from lockgate.machine.db.schema import Session
from lockgate.machine.faults import Faults, InjectedCrash
from lockgate.machine.lost_report import request_key
from lockgate.machine.runtime import Runtime
from lockgate.machine.sessions import SessionBusy
from lockgate.spec import CrashPoint
from tests.support.sessions import (
    PROTOCOL,
    FakeClock,
    close_always_loses,
    opened,
    owed_status,
    session_status,
)

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


def test_an_idle_session_is_expired_at_its_next_use_not_at_the_next_sweep(
    make_runtime: MakeRuntime,
) -> None:
    clock = FakeClock()
    limits = {"session_idle_timeout": "60", "session_lease": "60", "session_cap": "600"}
    runtime = make_runtime(clock=clock, **limits)
    opened(runtime, "quiet")
    clock.advance(timedelta(seconds=59))
    assert runtime.sessions.live("quiet") is not None  # within its idle timeout
    clock.advance(timedelta(seconds=2))  # one second past it; no sweep has run
    assert runtime.sessions.live("quiet") is None
    assert session_status(runtime, "quiet") == "expired"
    assert runtime.sessions.sweep() == []  # nothing left for the sweep


def test_a_session_past_its_idle_timeout_with_running_work_is_kept_at_use(
    make_runtime: MakeRuntime,
) -> None:
    clock = FakeClock()
    started = CrashPoint.parse("execution:start:pending->running:after_commit")
    limits = {"session_idle_timeout": "60", "session_lease": "60", "session_cap": "600"}
    runtime = make_runtime(clock=clock, faults=Faults([started]), **limits)
    opened(runtime, "busy")
    with pytest.raises(InjectedCrash):  # the execution stays running, in session busy
        runtime.engine.execute("alice", "1 + 1", "busy", request_key("busy", 1))
    clock.advance(timedelta(seconds=90))
    row = runtime.sessions.live("busy")
    assert row is not None and row.status == "idle"


def test_a_close_that_loses_a_race_with_the_last_requests_end_still_closes(
    make_runtime: MakeRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DELETE raced the previous request's bookkeeping: that request's `end_request` lands
    between the close reading the row and writing it. The session must end anyway (a 200
    with the row still live let the next request revive it)."""
    runtime = make_runtime()
    opened(runtime, "s")
    runtime.sessions.begin_request("s")  # the previous request, still finishing
    read = runtime.sessions.get
    raced: list[str] = []

    def read_then_race(session_id: str) -> Any:
        row = read(session_id)
        if not raced:
            raced.append(session_id)
            runtime.sessions.end_request(session_id)  # active -> idle, after the read
        return row

    monkeypatch.setattr(runtime.sessions, "get", read_then_race)
    assert runtime.sessions.close("s") is True
    assert raced == ["s"]
    assert session_status(runtime, "s") == "closed"
    assert runtime.sessions.live("s") is None


def test_a_close_that_every_attempt_loses_says_so_instead_of_pretending(
    make_runtime: MakeRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime = make_runtime()
    opened(runtime, "s")
    close_always_loses(runtime, monkeypatch, "s")
    with pytest.raises(SessionBusy):
        runtime.sessions.close("s")
    monkeypatch.undo()
    assert runtime.sessions.live("s") is not None  # still open: the DELETE is retried


def test_a_request_whose_check_saw_the_session_before_the_last_request_ended_makes_it_active(
    make_runtime: MakeRuntime,
) -> None:
    """The check of a new request read the session while the request before it was still
    in flight (active); that request then ended (idle). The new request makes it active
    again, whatever its check saw: a session left idle under a request in flight could
    reach its idle timeout mid-request."""
    runtime = make_runtime()
    opened(runtime, "s")
    runtime.sessions.begin_request("s")  # the request before, in flight: active
    seen = runtime.sessions.live("s")
    assert seen is not None and seen.status == "active"
    runtime.sessions.end_request("s")  # it ends after the new request's check
    assert session_status(runtime, "s") == "idle"
    runtime.sessions.begin_request("s", seen)
    assert session_status(runtime, "s") == "active"


def test_a_request_whose_check_saw_an_idle_session_that_moved_since_makes_it_active(
    make_runtime: MakeRuntime,
) -> None:
    """Seen idle, then another instance's request came and went (the row moved on, idle
    again): the write from the row seen is stale, so the row is read again and the session
    made active, not left idle under the request."""
    runtime = make_runtime()
    opened(runtime, "s")
    seen = runtime.sessions.live("s")
    assert seen is not None and seen.status == "idle"
    runtime.sessions.begin_request("s")  # a request elsewhere, come and gone
    runtime.sessions.end_request("s")
    moved = runtime.sessions.get("s")
    assert moved is not None and moved.version > seen.version
    runtime.sessions.begin_request("s", seen)
    assert session_status(runtime, "s") == "active"


def test_a_request_that_ends_after_its_session_moved_still_leaves_it_idle(
    make_runtime: MakeRuntime,
) -> None:
    """The last request to end writes from the row its begin left (no read), unless the row
    moved since (here, the client set its log level meanwhile): then it reads the row again
    and ends it from there, keeping what the other write stored."""
    runtime = make_runtime()
    opened(runtime, "s")
    runtime.sessions.begin_request("s")
    assert runtime.sessions.set_log_level("s", "error")
    runtime.sessions.end_request("s")
    row = runtime.sessions.get("s")
    assert row is not None
    assert (row.status, row.log_level) == ("idle", "error")
    runtime.sessions.begin_request("s")  # and the next request, on the row as it is now
    assert session_status(runtime, "s") == "active"
    runtime.sessions.end_request("s")
    assert session_status(runtime, "s") == "idle"
