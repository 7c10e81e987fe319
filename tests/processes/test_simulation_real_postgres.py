"""The fault-injection simulator's several-instance scenarios, for real: they need a database
server (on SQLite one box's file), so they run on a real PostgreSQL server."""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
import pytest
from typer.testing import CliRunner

from lockgate.server import cli
from lockgate.simulation.real_process import run_in_process
from lockgate.simulation.scenarios import by_name
from lockgate.spec import CrashPoint
from tests.support.postgres import PostgresServer


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
