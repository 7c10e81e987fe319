"""The fault-injection simulator in process: it passes on the real engine and catches planted
bugs. (Its real-process runs: `test_simulation_real_process.py`, and on a PostgreSQL server
`test_simulation_real_postgres.py`; three files, so the process layer's workers share them.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import lockgate.machine.bindings as bindings
from lockgate.machine.db.schema import Execution
from lockgate.machine.engine import record_of
from lockgate.machine.recovery import Recovery
from lockgate.machine.secrets import Redactor
from lockgate.machine.write_path import Step, WritePath
from lockgate.simulation.report import coverage_matrix, describe_violation
from lockgate.simulation.scenarios import CATALOG, by_name
from lockgate.simulation.sweep import run_plan, sweep
from lockgate.spec import CrashPoint, ExecutionStatus


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
