"""Fault injection is for the simulator: a production server carries none of it.

A server nobody arms passes no crash point and keeps no bookkeeping (before, every heartbeat
and transition was appended to a list that was never freed), and the variables that arm a
server (`LOCKGATE_CRASH_AT`, `LOCKGATE_STOP_AT`, `LOCKGATE_FAULT_EVIDENCE`) are obeyed only
when `LOCKGATE_FAULT_INJECTION` switches it on.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from lockgate.machine.faults import Faults, InjectedCrash
from lockgate.machine.runtime import Runtime
from lockgate.machine.settings import Settings
from lockgate.spec.crash_points import CrashPoint
from tests.support.servers import make_deployment

HEARTBEAT = "instance:heartbeat:live->live:before_commit"


@pytest.fixture(name="runtime_settings")
def runtime_settings_fixture(tmp_path: Path) -> Settings:
    return Settings(database_url=f"sqlite:///{tmp_path / 'db.sqlite'}", notes_dir=tmp_path)


@pytest.fixture(name="made")
def made_fixture(runtime_settings: Settings) -> Iterator[list[Runtime]]:
    made: list[Runtime] = []
    yield made
    for runtime in made:
        runtime.close()


def test_a_server_nobody_arms_keeps_no_fault_bookkeeping(
    runtime_settings: Settings, made: list[Runtime], monkeypatch: pytest.MonkeyPatch
) -> None:
    for variable in ("LOCKGATE_CRASH_AT", "LOCKGATE_STOP_AT", "LOCKGATE_FAULT_EVIDENCE"):
        monkeypatch.delenv(variable, raising=False)
    runtime = Runtime.create(runtime_settings)
    made.append(runtime)
    for _ in range(50):  # fifty maintenance rounds: heartbeats, recovery, sweeps
        runtime.maintain()
    assert runtime.engine.write.faults is None


def test_the_crash_variables_alone_arm_nothing(
    runtime_settings: Settings,
    made: list[Runtime],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv("LOCKGATE_CRASH_AT", HEARTBEAT)
    with caplog.at_level(logging.WARNING, logger="lockgate.machine.faults"):
        runtime = Runtime.create(runtime_settings)
    made.append(runtime)
    runtime.maintain()  # a heartbeat: the point it names, passed without a crash
    assert runtime.engine.write.faults is None
    assert any("ignoring LOCKGATE_CRASH_AT" in r.getMessage() for r in caplog.records)


def test_an_armed_server_keeps_a_bounded_record(
    runtime_settings: Settings,
    made: list[Runtime],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Switched on, a long-lived server still keeps no trail of every point it passed: its
    evidence file says what it reached, and the per-point counts are bounded by the spec."""
    monkeypatch.setenv("LOCKGATE_STOP_AT", "")
    monkeypatch.setenv("LOCKGATE_CRASH_AT", "session:destroy:idle->expired:after_commit")
    switched = runtime_settings.model_copy(update={"fault_injection": True})
    with caplog.at_level(logging.WARNING):
        runtime = Runtime.create(switched)
    made.append(runtime)
    assert (
        "fault injection is ON: this server obeys LOCKGATE_CRASH_AT, LOCKGATE_STOP_AT, "
        "LOCKGATE_FAULT_EVIDENCE"
    ) in [r.getMessage() for r in caplog.records]
    for _ in range(50):
        runtime.maintain()
    faults = runtime.engine.write.faults
    assert isinstance(faults, Faults)
    assert faults.trail == []
    assert faults.hits[CrashPoint.parse(HEARTBEAT)] >= 50
    assert faults.armed == {CrashPoint.parse("session:destroy:idle->expired:after_commit")}


@pytest.mark.slow
def test_a_real_server_obeys_a_crash_point_only_when_switched_on(tmp_path: Path) -> None:
    deployment = make_deployment(f"sqlite:///{tmp_path / 'db.sqlite'}", tmp_path)
    try:
        off = deployment.start(
            name="off", LOCKGATE_CRASH_AT=HEARTBEAT, LOCKGATE_FAULT_INJECTION="false"
        )
        # Ready means it renewed its lease at boot: the named point was passed, and ignored.
        assert off.exited() is None
        assert "ignoring LOCKGATE_CRASH_AT" in off.stderr()
        off.terminate()
        on = deployment.spawn(name="on", LOCKGATE_CRASH_AT=HEARTBEAT)
        assert on.wait_exit() == -signal.SIGKILL
    finally:
        deployment.stop_all()


def test_an_armed_point_is_reported_to_the_evidence_file_and_kept_in_the_trail(
    tmp_path: Path,
) -> None:
    """The simulator learns from the trail what came after a crash, and a simulator in
    another process learns from the evidence file which points a server reached: one line
    per point, the first time, with the process that reached it."""
    evidence = tmp_path / "evidence"
    heartbeat, armed = (
        CrashPoint.parse(HEARTBEAT),
        CrashPoint.parse("session:destroy:idle->expired:after_commit"),
    )
    faults = Faults([armed], evidence=evidence)
    faults.reached(heartbeat)
    faults.reached(heartbeat)
    with pytest.raises(InjectedCrash):
        faults.reached(armed)
    faults.reached(armed)  # a point kills once: recovery passes it again
    assert faults.trail == [heartbeat, heartbeat, armed, armed]
    assert (faults.fired, faults.fired_at) == ([armed], [2])
    pid = os.getpid()
    assert evidence.read_text("utf-8").splitlines() == [
        f"reached {heartbeat.name} {pid}",
        f"reached {armed.name} {pid}",
    ]
