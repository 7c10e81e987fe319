"""The `lockgate` command line.

Exit codes: 0 success; 1 the check ran and found a problem (an invalid spec, an invariant
violation, stale diagrams); 2 the command could not run as asked (bad usage, missing tool).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from machine.bindings import binding_names
from spec import COMPOSITIONS, MACHINES, SpecInvalid, crash_points, load

app = typer.Typer(
    help="Lockgate: a durable, approval-gated code-execution MCP server.",
    no_args_is_help=True,
    add_completion=False,
)
spec_app = typer.Typer(help="Inspect and validate the lifecycle specs.", no_args_is_help=True)
app.add_typer(spec_app, name="spec")
db_app = typer.Typer(help="Manage the database schema.", no_args_is_help=True)
app.add_typer(db_app, name="db")

DEFAULT_DIAGRAMS = Path(__file__).resolve().parent.parent / "diagrams"  # the repository's


def _fail(message: str, code: int) -> typer.Exit:
    typer.echo(message, err=True)
    return typer.Exit(code)


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
            f"{len(crash_points(spec))} crash points: ok"
        )


@app.command("model-check")
def model_check() -> None:
    """Explore every lifecycle (and execution x tool call) with crashes at every point."""
    from spec.model_checker import check_all

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
    from spec import diagrams as render

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


@app.command("settings")
def settings_reference() -> None:
    """Print the configuration reference (every environment variable, default, meaning)."""
    from machine.settings import reference_table

    typer.echo(reference_table(), nl=False)


@db_app.command("upgrade")
def db_upgrade() -> None:
    """Apply every schema migration to the database in DATABASE_URL (or LOCKGATE_DATABASE_URL).

    The embedded SQLite default is migrated automatically on start; PostgreSQL is migrated
    only by this command, so an operator decides when a shared schema changes."""
    from pydantic import ValidationError
    from sqlalchemy.exc import SQLAlchemyError

    from machine.db.connect import open_engine
    from machine.db.migrate import current_revision, upgrade
    from machine.settings import Settings

    try:
        settings = Settings()
    except ValidationError as exc:
        raise _fail(f"invalid configuration: {exc.errors()[0]['msg']}", 2) from None
    try:
        engine = open_engine(settings.database_url)
        upgrade(engine)
        revision = current_revision(engine)
    except SQLAlchemyError as exc:
        # The driver's message names the host and the reason, never the password.
        orig = getattr(exc, "orig", None)
        reason = str(orig) if orig is not None else type(exc).__name__
        raise _fail(f"could not migrate the database: {reason.strip()}", 1) from None
    typer.echo(f"database schema is at revision {revision}")


if __name__ == "__main__":  # pragma: no cover
    app()
