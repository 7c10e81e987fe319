"""The fault-injection simulator's real-process runs: a real server process, SIGKILLed at
the armed point (or at its drain), restarted as a supervisor would, checked afterwards."""

from __future__ import annotations

import pytest

from lockgate.simulation.real_process import run_in_process
from lockgate.simulation.scenarios import CATALOG, by_name
from lockgate.spec import CrashPoint


@pytest.mark.slow
def test_a_real_server_process_killed_at_a_point_recovers() -> None:
    """The server itself reports where it fired (its evidence file), and the run checks the
    death was SIGKILL's; nothing the harness writes about itself is asserted."""
    point = CrashPoint.parse("tool_call:dispatch:approved->dispatched:after_effect")
    result = run_in_process(by_name("approval_accepted"), point)
    assert result.fired == [point]
    assert point in result.reached
    assert result.violations == []


@pytest.mark.slow
def test_a_real_process_run_whose_armed_point_never_fires_fails() -> None:
    """`plain` never destroys a session within a run: arming that point must not pass as a
    crash-tested run."""
    point = CrashPoint.parse("session:destroy:idle->expired:after_commit")
    result = run_in_process(by_name("plain"), point)
    assert result.fired == []
    assert [v.invariant for v in result.violations] == ["the armed point fires"]


@pytest.mark.slow
def test_every_scenario_with_a_client_door_has_a_real_process_drive() -> None:
    from lockgate.simulation.remote import IN_PROCESS_ONLY, NO_CLIENT_DOOR, remote_drive

    for scenario in CATALOG:
        if scenario.name in NO_CLIENT_DOOR or scenario.name in IN_PROCESS_ONLY:
            continue
        assert callable(remote_drive(scenario)), scenario.name
    assert set(NO_CLIENT_DOOR) == {
        "execution_cancelled",
        "left_by_an_earlier_version",
        "left_by_an_earlier_version_conservative",
    }


@pytest.mark.slow
def test_the_real_process_drive_of_a_session_runs_clean() -> None:
    result = run_in_process(by_name("session_requests"), None)
    assert result.violations == [], result.trace
    assert result.reached  # the server's own evidence of the points it passed


@pytest.mark.slow
def test_a_real_server_killed_during_its_boot_is_started_again() -> None:
    point = CrashPoint.parse("instance:heartbeat:live->live:before_commit")
    result = run_in_process(by_name("plain"), point)
    assert result.fired == [point]  # the first boot died at its first heartbeat
    assert result.violations == []  # and the death was SIGKILL's: the run checks its status


@pytest.mark.slow
@pytest.mark.parametrize("moment", ["before_commit", "after_commit"])
def test_a_real_server_that_dies_at_its_armed_point_while_draining_counts_as_that_crash(
    moment: str,
) -> None:
    """The run's own SIGTERM at the end is where a drain point fires: the SIGKILL there is
    the armed crash, restarted as a supervisor would, not an unexplained death."""
    point = CrashPoint.parse(f"instance:drain:live->draining:{moment}")
    result = run_in_process(by_name("approval_accepted"), point)
    assert result.fired == [point]
    assert result.violations == [], result.trace


@pytest.mark.slow
def test_a_graceful_restart_that_dies_at_its_drain_point_is_restarted() -> None:
    point = CrashPoint.parse("instance:drain:live->draining:after_commit")
    result = run_in_process(by_name("graceful_shutdown"), point)
    assert result.fired == [point]
    assert result.violations == [], result.trace


@pytest.mark.slow
def test_a_real_server_that_dies_handing_its_running_code_back_is_recovered() -> None:
    """SIGTERM while code runs: the drain stops the code and hands the execution back; a
    SIGKILL at the hand-back's commit is that crash (restarted as a supervisor would), and
    the execution is still run to its result, once."""
    point = CrashPoint.parse("execution:hand_back:running->pending:before_commit")
    result = run_in_process(by_name("drain_while_running"), point)
    assert result.fired == [point]
    assert result.violations == [], result.trace


def test_the_points_left_to_the_in_process_sweep_are_real_crash_points() -> None:
    """`TIMED` and `TIMED_IN_SCENARIO` name points (and scenarios) by text: a renamed
    transition or scenario would silently stop matching."""
    from lockgate.simulation.real_process_plan import TIMED, TIMED_IN_SCENARIO
    from lockgate.spec import MACHINES
    from lockgate.spec.crash_points import crash_points

    every = {p for spec in MACHINES.values() for p in crash_points(spec)}
    assert TIMED and every >= TIMED
    for name, points in TIMED_IN_SCENARIO.items():
        assert by_name(name).name == name
        assert points and every >= points
