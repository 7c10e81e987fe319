"""Report acknowledgements and ended sessions in the ledger's core (`machine/ledger.py`):
the event id a report is written under names the reports the client has, a `Last-Event-ID`
naming them settles exactly those, and a report nobody can collect any more (its session
ended) is abandoned, at once or by recovery. On the real store, with a fake clock."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest

from lockgate.machine.db.schema import OwedRequest
from lockgate.machine.ledger import (
    MAX_REPORTS_PER_RESPONSE,
    acknowledged_reports,
    report_event_ids,
)
from lockgate.machine.records import Record, RowRecord
from lockgate.machine.runtime import Runtime
from lockgate.machine.write_path import Step
from tests.support.sessions import FakeClock, opened, owed_status

MakeRuntime = Callable[..., Runtime]

A = "0123456789abcdef" * 2
B = "fedcba9876543210" * 2


def lost(runtime: Runtime, session_id: str, request_id: int) -> Record:
    owed = runtime.ledger.owe(session_id, request_id, "tools/call", None)
    runtime.ledger.lose(owed)
    return owed


def _record(owed_id: str) -> Record:
    return Record("owed_request", owed_id, "lost", 1, {})


# -- event ids -------------------------------------------------------------------------------


def test_each_reports_event_id_names_it_and_every_report_before_it() -> None:
    assert report_event_ids("7", [_record(A), _record(B)]) == [f"7:r{A}", f"7:r{A}.{B}"]
    assert report_event_ids("_GET_stream", []) == []


def test_a_reports_event_id_reads_back_as_its_stream_and_reports() -> None:
    for stream in ("7", "_GET_stream", "a:b"):
        [first, both] = report_event_ids(stream, [_record(A), _record(B)])
        assert acknowledged_reports(first) == (stream, [A])
        assert acknowledged_reports(both) == (stream, [A, B])


def test_an_event_id_that_is_not_a_reports_acknowledges_nothing() -> None:
    refused = [
        None,
        "",
        f"r{A}",  # no stream
        f":r{A}",  # an empty stream
        f"7:{A}",  # not a report token
        f"7:x{A}",
        "7:r",  # names nothing
        f"7:r{A}.",
        f"7:r{A[:-1]}",  # 31 characters
        f"7:r{A}0",  # 33
        f"7:r{A.upper()}",  # not lower-case hex
        f"7:r{A[:-1]}g",
        f"7:r{A[:-1]}X",
        "_GET_stream:0",  # the SDK's own event ids
        "7:r" + ".".join([A] * (MAX_REPORTS_PER_RESPONSE + 1)),  # more than one response
    ]
    for event_id in refused:
        assert acknowledged_reports(event_id) is None, event_id
    most = "7:r" + ".".join([A] * MAX_REPORTS_PER_RESPONSE)
    assert acknowledged_reports(most) == ("7", [A] * MAX_REPORTS_PER_RESPONSE)


# -- acknowledging ---------------------------------------------------------------------------


def test_acknowledging_settles_the_named_lost_reports_of_the_session_only(
    make_runtime: MakeRuntime,
) -> None:
    runtime = make_runtime()
    opened(runtime, "s")
    opened(runtime, "t", principal="bob")
    first, second, kept = lost(runtime, "s", 1), lost(runtime, "s", 2), lost(runtime, "s", 3)
    still_owed = runtime.ledger.owe("s", 4, "tools/call", None)
    answered = runtime.ledger.owe("s", 5, "tools/call", None)
    runtime.ledger.answered(answered, lambda: None)
    bobs = lost(runtime, "t", 1)
    named = [first.id, second.id, still_owed.id, answered.id, bobs.id, B]
    assert runtime.ledger.acknowledge("s", named) == 2
    assert [owed_status(runtime, o.id) for o in (first, second, kept)] == [
        "reported",
        "reported",
        "lost",
    ]
    assert owed_status(runtime, still_owed.id) == "owed"
    assert owed_status(runtime, answered.id) == "answered"
    assert owed_status(runtime, bobs.id) == "lost"
    assert [r.id for r, _ in runtime.ledger.lost_reports("s")] == [kept.id]
    assert runtime.ledger.acknowledge("s", named) == 0  # already settled


def test_get_owed_reads_one_entry(make_runtime: MakeRuntime) -> None:
    runtime = make_runtime()
    opened(runtime)
    owed = runtime.ledger.owe("s", "x", "tools/list", "e1")
    row = runtime.ledger.get(owed.id)
    assert row is not None
    assert (row.session_id, row.request_id, row.method, row.status) == (
        "s",
        "x",
        "tools/list",
        "owed",
    )
    assert row.execution_id == "e1"
    assert runtime.ledger.get(B) is None


# -- reports nobody can collect ----------------------------------------------------------------


def test_an_id_lost_after_its_session_closed_is_abandoned_at_once(
    make_runtime: MakeRuntime,
) -> None:
    """A DELETE while the request ran: nobody will GET its report."""
    runtime = make_runtime()
    opened(runtime, "s")
    opened(runtime, "t")
    running = runtime.ledger.owe("s", 1, "tools/call", None)
    elsewhere = runtime.ledger.owe("t", 1, "tools/call", None)
    assert runtime.sessions.close("s")
    runtime.ledger.lose(running)
    runtime.ledger.lose(elsewhere)
    assert owed_status(runtime, running.id) == "uncollected"
    assert owed_status(runtime, elsewhere.id) == "lost"  # its session is live
    runtime.ledger.lose(running)  # losing it again is harmless
    assert owed_status(runtime, running.id) == "uncollected"


def test_recovery_abandons_what_a_dead_incarnation_lost_after_its_session_ended(
    make_runtime: MakeRuntime,
) -> None:
    clock = FakeClock()
    dead = make_runtime(clock=clock, instance_name="dead", lease_ttl="1")
    for session_id in ("gone", "live"):
        opened(dead, session_id)
    on_gone = [dead.ledger.owe("gone", n, "tools/call", None) for n in (1, 2)]
    on_live = dead.ledger.owe("live", 1, "tools/call", None)
    clock.advance(timedelta(seconds=5))
    alive = make_runtime(clock=clock, instance_name="alive", lease_ttl="60")
    assert alive.sessions.close("gone")  # its owed ids are not lost yet: they stay owed
    assert [owed_status(alive, o.id) for o in on_gone] == ["owed", "owed"]
    # Three ids lost, then the two of the ended session abandoned.
    assert alive.sessions.recover() == 5
    assert [owed_status(alive, o.id) for o in on_gone] == ["uncollected", "uncollected"]
    assert owed_status(alive, on_live.id) == "lost"  # still the live session's to collect
    assert alive.sessions.recover() == 0


def test_an_id_another_instance_lost_first_does_not_stop_recovery_losing_the_rest(
    make_runtime: MakeRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dead incarnation owed two requests; between recovery's read and its write, another
    instance declares the first lost. Recovery skips that one and still loses the second, so
    its report is not held back until the next round."""
    clock = FakeClock()
    dead = make_runtime(clock=clock, instance_name="dead", lease_ttl="1")
    opened(dead, "s")
    owed = [dead.ledger.owe("s", n, "tools/call", None) for n in (1, 2)]
    clock.advance(timedelta(seconds=5))
    alive = make_runtime(clock=clock, instance_name="alive", lease_ttl="60")
    other = make_runtime(clock=clock, instance_name="other", lease_ttl="60")
    read = alive.engine.store.sessions.all_owed

    def raced() -> list[OwedRequest]:
        rows = sorted(read(), key=lambda r: r.id != owed[0].id)
        fresh = other.ledger.get(owed[0].id)
        assert fresh is not None
        other.engine.write.apply(Step(RowRecord.of("owed_request", fresh), "lose_in_crash"))
        return rows  # the first as recovery read it, before the other instance moved it

    monkeypatch.setattr(alive.engine.store.sessions, "all_owed", raced)
    assert alive.ledger.recover() == 1
    assert [owed_status(alive, o.id) for o in owed] == ["lost", "lost"]
