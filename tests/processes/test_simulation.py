"""The fault-injection simulator: it passes on the real engine and catches planted bugs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
import pytest
from typer.testing import CliRunner

import lockgate.machine.bindings as bindings
from lockgate.machine.db.schema import Execution
from lockgate.machine.engine import record_of
from lockgate.machine.recovery import Recovery
from lockgate.machine.secrets import Redactor
from lockgate.machine.write_path import Step, WritePath
from lockgate.server import cli
from lockgate.simulation.real_process import run_in_process
from lockgate.simulation.report import coverage_matrix, describe_violation
from lockgate.simulation.scenarios import CATALOG, by_name
from lockgate.simulation.sweep import run_plan, sweep
from lockgate.spec import CrashPoint, ExecutionStatus
from tests.support.postgres import PostgresServer

runner = CliRunner()


def test_a_scenario_is_swept_at_every_point_it_reaches_without_violation() -> None:
    report = sweep([by_name("approval_accepted")])
    assert report.violations == []
    fault_free = report.runs[0]
    assert fault_free.plan == ()
    single = {run.plan[0] for run in report.runs if len(run.plan) == 1}
    assert single == fault_free.reached  # every point of the run was crashed at once
    assert any(len(run.plan) == 2 for run in report.runs)  # and crashes inside recovery
    assert "declare_dead" in coverage_matrix(report)


def careless_recovery(self: Recovery, row: Execution) -> ExecutionStatus:
    """A planted bug: recovery always requeues, even with a non-idempotent call in doubt
    (still fenced on the latest call, as the real one is, so only the rule is missing)."""
    calls = self.store.executions.calls(row.id)
    fence = record_of(calls[-1]) if calls else None
    self.write.apply(Step(record_of(row), "requeue", {"unsafe_in_doubt": False}), fence=fence)
    return ExecutionStatus.PENDING


def mkdir(path: Path) -> Path:
    path.mkdir()
    return path


@pytest.mark.illegal_trace
def test_recovery_committing_over_a_call_its_stalled_owner_dispatched_is_caught(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A planted bug: recovery's requeue drops its fence on the call it read. The scenario
    that holds the stalled owner's dispatch between recovery's read and its commit finds
    it on its crash-free run (the bug the real-process simulator once hit under load)."""
    scenario = by_name("woken_before_recovery_commits")
    assert run_plan(scenario, (), mkdir(tmp_path / "fenced")).violations == []
    original = WritePath.apply

    def unfenced(self: WritePath, *steps: Step, **given: Any) -> Any:
        if any(s.event == "requeue" for s in steps):
            given["fence"] = None
        return original(self, *steps, **given)

    monkeypatch.setattr(WritePath, "apply", unfenced)
    unfenced_run = run_plan(scenario, (), mkdir(tmp_path / "unfenced"))
    found = "\n".join(v.detail for v in unfenced_run.violations)
    assert "requeue running->pending: committed under fence None" in found, found
    assert "is dispatched but its execution is failed" in found, found


def test_the_sweep_catches_a_disabled_recovery_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Recovery, "recover_execution", careless_recovery)
    report = sweep([by_name("in_doubt_non_idempotent")])
    assert report.violations
    # The run crashed after the write's dispatch ran (its intent commits with its
    # checkpoint and approval, whose points come first in that commit).
    run = next(r for r in report.violations if any(p.event == "dispatch" for p in r.plan))
    text = describe_violation(run, seed=None)
    assert "tool_call:dispatch:approved->dispatched" in text  # the crash point
    assert "CRASH at" in text and "persisted transitions:" in text  # the trace
    assert "reproduce: lockgate simulate --scenario in_doubt_non_idempotent --crash-at" in text
    invariants = {v.invariant for r in report.violations for v in r.violations}
    assert "no call is left in flight by a finished execution" in invariants


def test_the_sweep_catches_a_retry_of_a_non_idempotent_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A guard that lets every call be made again: the write the policy approves is made at
    once, with no intent written first, and a crash after it ran makes it again."""
    monkeypatch.setattr(Recovery, "recover_execution", careless_recovery)
    monkeypatch.setitem(bindings.BINDINGS["tool_call"].guards, "retry_allowed", lambda f: True)
    point = CrashPoint.parse("tool_call:succeed_at_least_once:requested->succeeded:after_effect")
    report = sweep([by_name("in_doubt_non_idempotent")], only=[point])
    [run] = report.runs
    assert {v.invariant for v in run.violations} == {
        "no non-idempotent effect is dispatched twice",
        "a call is made again only where the spec allows it",
    }


def test_every_catalog_scenario_runs_clean_without_faults() -> None:
    report = sweep(CATALOG, only=[])
    assert [r.scenario for r in report.runs] == [s.name for s in CATALOG]
    assert report.violations == [], [describe_violation(r, None) for r in report.violations]


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
@pytest.mark.postgres
def test_a_stalled_server_s_work_is_recovered_by_another_on_postgresql(
    postgres_server: PostgresServer, postgres_template: str
) -> None:
    """Several instances need a database server (on SQLite a stalled process's transaction
    would lock the others out of the file): a stops itself mid-run, b takes its work over."""
    url = postgres_server.url(postgres_server.create_database(template=postgres_template))
    result = run_in_process(by_name("stalled_before_dispatch"), None, url)
    assert result.violations == [], result.trace
    stop = CrashPoint.parse("tool_call:dispatch:approved->dispatched:before_commit")
    assert stop in result.reached


def test_several_instance_scenarios_run_for_real_only_on_a_database_server() -> None:
    from lockgate.simulation.real_process_plan import plan_runs
    from lockgate.simulation.remote import SEVERAL_INSTANCES

    planned = plan_runs([by_name(n) for n in sorted(SEVERAL_INSTANCES)], 3, seed=1)
    assert planned.runs == [] and planned.scenarios == 0


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
@pytest.mark.postgres
def test_the_cli_runs_several_instance_scenarios_for_real_on_a_postgresql_server(
    postgres_server: PostgresServer, tmp_path: Path
) -> None:
    """`--postgres` gives each real-process run a fresh database on that server (and drops
    it afterwards): a several-instance scenario then runs for real, not only in process."""
    report = tmp_path / "report.json"
    result = CliRunner().invoke(
        cli.app,
        [
            "simulate",
            "--real-process",
            "--postgres",
            postgres_server.admin_url,
            "--scenario",
            "lease_takeover",
            "--crash-at",
            "instance:declare_dead:live->dead:after_commit",
            "--sample-size",
            "1",
            "--jobs",
            "1",
            "--report",
            str(report),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "real-process runs over 1 scenarios" in result.output
    with psycopg.connect(postgres_server.admin_url) as conn:
        left = conn.execute("SELECT datname FROM pg_database WHERE datname LIKE 'lockgate_sim%'")
        assert left.fetchall() == []  # every run's database was dropped
    assert json.loads(report.read_text())["violations"] == []


def test_the_cli_refuses_a_postgres_url_it_cannot_use() -> None:
    result = CliRunner().invoke(
        cli.app,
        ["simulate", "--real-process", "--postgres", "sqlite:///x", "--scenario", "plain"],
    )
    assert result.exit_code == 2
    assert "not a PostgreSQL URL" in result.output


@pytest.mark.slow
def test_a_real_server_that_dies_handing_its_running_code_back_is_recovered() -> None:
    """SIGTERM while code runs: the drain stops the code and hands the execution back; a
    SIGKILL at the hand-back's commit is that crash (restarted as a supervisor would), and
    the execution is still run to its result, once."""
    point = CrashPoint.parse("execution:hand_back:running->pending:before_commit")
    result = run_in_process(by_name("drain_while_running"), point)
    assert result.fired == [point]
    assert result.violations == [], result.trace


def test_the_canary_invariant_catches_an_engine_that_stops_scrubbing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The leaky tools put their secret in a result, an error and an exception: with the
    engine's scrubbing switched off, the crash-free run stores it, and the invariant (which
    reads every column of every row, snapshots included) names the table."""
    monkeypatch.setattr(Redactor, "redact_text", lambda self, text: text)
    report = sweep([by_name("leaky_tools")], only=[])
    found = [v for run in report.violations for v in run.violations]
    assert any(v.invariant == "the canary secret appears nowhere" for v in found), found
    assert any("in table" in v.detail for v in found), found


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


def test_a_scenario_over_http_makes_its_calls_through_the_openapi_source(tmp_path: Path) -> None:
    """The twin's calls are the OpenAPI source's (journaled as `api.*`), and the API's own
    log holds the write once, under its call's id: what the invariants count."""
    result = run_plan(by_name("approval_accepted_http"), (), tmp_path)
    assert result.ok, result.trace
    [[(made, ran_to_end)]] = result.calls.values()
    assert [tool for tool, _ in made] == ["api.write", "api.read"] and ran_to_end


def test_a_write_sent_twice_over_http_is_caught(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The effect count reads the HTTP API's own log: an OpenAPI source that sent a write
    twice fails the run (a check that can fail)."""
    from lockgate.machine.tools.http_calls import send as real

    def twice(*args: Any, **kwargs: Any) -> Any:
        real(*args, **kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr("lockgate.machine.tools.openapi.send", twice)
    result = run_plan(by_name("in_doubt_non_idempotent_http"), (), tmp_path)
    assert any("happened 2 times" in v.detail for v in result.violations), result.violations


def test_the_canary_scan_reads_the_secret_store_s_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """The simulated deployments keep their secrets in the server's encrypted store: a store
    that kept a value in the clear is found there."""
    from lockgate.machine.secret_store import SecretCipher

    monkeypatch.setattr(SecretCipher, "encrypt", lambda self, value: value.encode())
    monkeypatch.setattr(SecretCipher, "decrypt", lambda self, token, name: token.decode())
    report = sweep([by_name("plain")], only=[])
    found = [v.detail for run in report.violations for v in run.violations]
    assert "in table secrets" in found, found
