"""The `lockgate` command line.

Exit codes: 0 success; 1 the check ran and found a problem (an invalid spec, an invariant
violation, stale diagrams); 2 the command could not run as asked (bad usage, missing tool).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Annotated

import typer

from lockgate.machine.bindings import binding_names
from lockgate.server.cli_admin import (
    audit_app,
    configured_settings,
    keys_app,
    policy_app,
    secrets_app,
)
from lockgate.server.cli_admin import fail as _fail
from lockgate.server.cli_approvers import approvers_app
from lockgate.server.cli_sources import sources_app
from lockgate.server.cli_webhooks import webhook_app
from lockgate.spec import COMPOSITIONS, MACHINES, SpecInvalid, every_crash_point, load

app = typer.Typer(
    help="Lockgate: a durable, approval-gated code-execution MCP server.",
    no_args_is_help=True,
    add_completion=False,
)
spec_app = typer.Typer(help="Inspect and validate the lifecycle specs.", no_args_is_help=True)
app.add_typer(spec_app, name="spec")
db_app = typer.Typer(help="Manage the database schema.", no_args_is_help=True)
app.add_typer(db_app, name="db")

#: The repository's diagrams/, for `lockgate diagrams` run from its root (`make diagrams`):
#: relative to where it runs, because an installed package has no such folder beside it.
DEFAULT_DIAGRAMS = Path("diagrams")


@spec_app.command("check")
def spec_check() -> None:
    """Validate every lifecycle against the static rules and the machine layer's bindings."""
    try:
        machines = load(MACHINES, bindings=binding_names())
    except SpecInvalid as exc:
        raise _fail(str(exc), 1) from None
    for name, spec in machines.items():
        typer.echo(
            f"{name}: {len(spec.states)} states, {len(spec.transitions)} transitions, "
            f"{len(every_crash_point(spec))} crash points: ok"
        )


@app.command("model-check")
def model_check() -> None:
    """Explore every lifecycle (and execution x tool call) with crashes at every point."""
    from lockgate.spec.model_checker import check_all

    try:
        machines = load(MACHINES, bindings=binding_names())
    except SpecInvalid as exc:
        raise _fail(str(exc), 1) from None
    reports = check_all(machines, COMPOSITIONS)
    for report in reports:
        typer.echo(report.render())
    failed = [r.name for r in reports if not r.ok]
    if failed:
        raise _fail(f"model check failed: {', '.join(failed)}", 1)
    typer.echo("model check passed: no invariant violated")


@app.command("diagrams")
def diagrams(
    check: Annotated[
        bool, typer.Option("--check", help="Only report whether the files are up to date.")
    ] = False,
    out: Annotated[Path, typer.Option(help="Where the diagrams live.")] = DEFAULT_DIAGRAMS,
) -> None:
    """Regenerate the lifecycle diagrams from the spec (or, with --check, detect drift)."""
    from lockgate.spec import diagrams as render

    if check:
        problems = render.drift(out)
        if problems:
            raise _fail("\n".join(problems), 1)
        typer.echo(f"diagrams in {out} match the spec")
        return
    try:
        written = render.write(out)
    except render.GraphvizMissing as exc:
        raise _fail(str(exc), 2) from None
    typer.echo(f"wrote {len(written)} files to {out}")


@app.command("simulate")
def simulate(
    scenario: Annotated[
        list[str] | None, typer.Option("--scenario", help="Only this scenario (repeatable).")
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed for sampling the real-process runs.")] = 0,
    real_process: Annotated[
        bool,
        typer.Option(
            "--real-process",
            help="Also run scenarios against a real engine process, SIGKILLed at the point.",
        ),
    ] = False,
    exhaustive: Annotated[
        bool, typer.Option(help="Real-process mode: every crash point, not a sample.")
    ] = False,
    sample_size: Annotated[
        int, typer.Option(help="Real-process runs to sample when not exhaustive.")
    ] = 8,
    crash_at: Annotated[
        str | None,
        typer.Option(help="Run only this plan: crash point names, comma-separated."),
    ] = None,
    report: Annotated[Path | None, typer.Option(help="Write a JSON report here.")] = None,
    postgres: Annotated[
        str | None,
        typer.Option(
            help="Real-process mode: give each run a fresh database on this PostgreSQL "
            "server (an admin URL, e.g. postgresql://postgres@127.0.0.1/postgres); the "
            "several-instance scenarios run for real only then.",
        ),
    ] = None,
    jobs: Annotated[
        int, typer.Option(min=1, help="Processes sweeping scenarios in parallel (in process).")
    ] = max(1, min(4, os.cpu_count() or 1)),
) -> None:
    """Crash the engine at every transition of every scenario, restart, check invariants."""
    import concurrent.futures

    from lockgate.simulation import real_process_plan as processes
    from lockgate.simulation import report as reporting
    from lockgate.simulation import warm_start
    from lockgate.simulation.scenarios import CATALOG, by_name
    from lockgate.simulation.sweep import sweep
    from lockgate.spec import CrashPoint

    try:
        chosen = [by_name(n) for n in scenario] if scenario else list(CATALOG)
        plan = [CrashPoint.parse(n) for n in crash_at.split(",")] if crash_at else None
    except (KeyError, ValueError) as exc:
        raise _fail(str(exc).strip("'\""), 2) from None
    apart = None
    if real_process:
        if postgres is not None:
            from lockgate.machine.db.provision import fresh_databases

            try:  # reachable? (said now, not after the in-process sweep)
                with fresh_databases(postgres):
                    pass
            except (ValueError, OSError) as exc:
                raise _fail(f"--postgres: {exc}", 2) from None
        # The real-process runs go on in a process of their own while this one sweeps: they
        # mostly wait for real time to pass, the sweep mostly computes.
        apart = concurrent.futures.ProcessPoolExecutor(1, mp_context=warm_start.context())
        picking = apart.submit(
            processes.plan_runs_apart,
            [s.name for s in chosen],
            None if exhaustive else sample_size,
            seed,
            postgres,
        )
    started = time.monotonic()
    result = sweep(chosen, only=plan, jobs=jobs)
    timings = [f"in process {time.monotonic() - started:.0f} s"]
    mode = "in-process"
    if apart is not None:
        with apart:
            picked = picking.result()
        result.runs += picked.runs
        timings.append(f"real processes {picked.seconds:.0f} s (alongside)")
        mode = (
            f"in-process + {len(picked.runs)} real-process runs over {picked.scenarios} "
            f"scenarios (seed {seed})"
        )
    typer.echo(reporting.coverage_matrix(result))
    for run in result.violations:
        typer.echo(reporting.describe_violation(run, seed if real_process else None))
    typer.echo(reporting.summary(result, len(chosen), mode))
    typer.echo(f"took {', '.join(timings)}")
    if report is not None:
        reporting.write_json(result, report, mode=mode, seed=seed)
    whole = not scenario and plan is None
    unreached = result.unreached() if whole else []
    if unreached:
        names = "\n  ".join(p.name for p in unreached)
        typer.echo(
            f"coverage gate: {len(unreached)} crash points reached by no scenario:\n  {names}",
            err=True,
        )
    # Every transition of a tool call is crashed with an OpenAPI call too.
    over_http = result.unreached_over_http() if whole else []
    if over_http:
        names = "\n  ".join(p.name for p in over_http)
        typer.echo(
            f"coverage gate: {len(over_http)} tool call crash points reached by no scenario "
            f"over HTTP (the OpenAPI source):\n  {names}",
            err=True,
        )
    if result.violations or unreached or over_http:
        raise typer.Exit(1)


app.add_typer(keys_app, name="keys")
app.add_typer(policy_app, name="policy")
app.add_typer(secrets_app, name="secrets")
app.add_typer(sources_app, name="sources")
app.add_typer(audit_app, name="audit")
app.add_typer(webhook_app, name="webhook")
app.add_typer(approvers_app, name="approvers")


@app.command("serve")
def serve(
    host: Annotated[str | None, typer.Option(help="Address to bind (default 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(help="Port to bind (default 8000).")] = None,
) -> None:
    """Run the Lockgate MCP server (streamable HTTP at /mcp)."""
    from lockgate.server.cli_serve import run_server

    run_server(host, port)


@app.command("settings")
def settings_reference() -> None:
    """Print the configuration reference (every environment variable, default, meaning)."""
    from lockgate.machine.settings_reference import reference_table

    typer.echo(reference_table(), nl=False)


@db_app.command("upgrade")
def db_upgrade() -> None:
    """Apply every schema migration to the database in DATABASE_URL (or LOCKGATE_DATABASE_URL).

    The embedded SQLite default is migrated automatically on start; PostgreSQL is migrated
    only by this command, so an operator decides when a shared schema changes."""

    from lockgate.machine.db.migrate import MigrationFailed, upgrade_database
    settings = configured_settings()
    try:
        revision = upgrade_database(settings.database_url)
    except MigrationFailed as exc:
        # The driver's message names the host and the reason, never the password.
        raise _fail(f"could not migrate the database: {exc.reason}", 1) from None
    typer.echo(f"database schema is at revision {revision}")


if __name__ == "__main__":  # pragma: no cover
    app()
