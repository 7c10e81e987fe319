"""The `lockgate` command line.

Exit codes: 0 success; 1 the check ran and found a problem (an invalid spec, an invariant
violation, stale diagrams); 2 the command could not run as asked (bad usage, missing tool).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer

from lockgate.machine.bindings import binding_names
from lockgate.server.cli_admin import audit_app, keys_app, policy_app, secrets_app
from lockgate.server.cli_admin import fail as _fail
from lockgate.server.cli_approvers import approvers_app, enrolment_text
from lockgate.server.cli_sources import sources_app
from lockgate.server.cli_webhooks import webhook_app
from lockgate.spec import COMPOSITIONS, MACHINES, SpecInvalid, every_crash_point, load

if TYPE_CHECKING:
    from lockgate.machine.tools.registry import ToolSource

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


def is_loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@app.command("serve")
def serve(
    host: Annotated[str | None, typer.Option(help="Address to bind (default 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(help="Port to bind (default 8000).")] = None,
) -> None:
    """Run the Lockgate MCP server (streamable HTTP at /mcp)."""
    run_server(host, port)


def run_server(
    host: str | None, port: int | None, *, extra_sources: Sequence[ToolSource] = ()
) -> None:
    """`serve`: with `extra_sources`, those tool sources are registered next to the notes
    tools (a test launcher, tests/support/procs/canary_server.py, serves a leaking source
    this way). One worker serves in this process; several are forked behind one port
    (`server/workers.py`)."""
    import sys

    from pydantic import ValidationError

    from lockgate.machine.db.migrate import DatabaseNotMigrated
    from lockgate.machine.settings import Settings
    from lockgate.server.operations import configure_logging
    from lockgate.server.signing_keys import SigningKeyFileInvalid, SigningKeysMissing, signing_keys
    from lockgate.server.workers import worker_count

    overrides: dict[str, Any] = {}
    if host is not None:
        overrides["host"] = host
    if port is not None:
        overrides["port"] = port
    try:
        settings = Settings(**overrides)
    except ValidationError as exc:
        raise _fail(f"invalid configuration: {exc.errors()[0]['msg']}", 2) from None
    try:
        keys = _keys_for(settings)
    except DatabaseNotMigrated as exc:
        raise _fail(str(exc), 2) from None
    try:
        # Before anything is created (an API key, the runtime): a server that cannot seal
        # state the way its other instances do must not start at all.
        signing = signing_keys(settings)
    except (SigningKeysMissing, SigningKeyFileInvalid) as exc:
        raise _fail(str(exc), 2) from None
    first_start = not keys.any_active()
    if first_start and not is_loopback(settings.host):
        raise _fail(
            f"Refusing to listen on {settings.host}: no API key exists, so anyone who can "
            "reach it could run code. Create one first: `lockgate keys create <name>`.",
            2,
        )
    configure_logging(log_format(settings.log_format, sys.stderr))
    count = worker_count(settings.workers, settings.database_url)
    if count == 1:
        application = _startable_app(settings, signing, extra_sources)
        # Only once the server can be served: a start refused above leaves no key nobody saw.
        _welcome(settings, keys, first_start, workers=1)
        _serve(application, settings)
    else:
        _serve_workers(settings, signing, extra_sources, keys, first_start, count)


def _startable_app(
    settings: Any, signing: Any, extra_sources: Sequence[ToolSource], *, accept_early: bool = True
) -> Any:
    """The application, or the command's failure saying why it cannot be served."""
    from lockgate.machine.secret_store import SecretKeyProblem
    from lockgate.machine.tools.errors import InvalidToolSource
    from lockgate.machine.tracing import TracingMisconfigured
    from lockgate.server.app import create_app

    try:
        runtime = None
        if extra_sources:
            from lockgate.machine.runtime import Runtime
            from lockgate.machine.tools.notes import NotesSource

            runtime = Runtime.create(
                settings, sources=[NotesSource(settings.notes_dir), *extra_sources]
            )
        return create_app(settings, runtime, signing, accept_early=accept_early)
    except (InvalidToolSource, SecretKeyProblem) as exc:
        # A source the operator configured cannot be served, or stored secrets cannot be
        # read: say which and why, not a trace.
        hint = f" {exc.hint}" if exc.hint else ""
        raise _fail(f"cannot start: {exc.message}.{hint}", 2) from None
    except TracingMisconfigured as exc:
        raise _fail(f"cannot start: {exc}", 2) from None


def _welcome(settings: Any, keys: Any, first_start: bool, *, workers: int) -> None:
    """The banner; on a first start, the first API key and an enrolment link for the person
    who approves its calls (each shown once)."""
    from datetime import UTC, datetime

    from lockgate.machine.people import People
    from lockgate.machine.write_path import WritePath

    store = keys.store
    people = People(
        store=store, write=WritePath(store), settings=settings, clock=lambda: datetime.now(UTC)
    )
    created = keys.create("local") if first_start else None
    processes = f" ({workers} worker processes)" if workers > 1 else ""
    typer.echo(f"Lockgate MCP server: {settings.base_url}/mcp{processes}")
    if created is not None:
        typer.echo(
            f"Created an API key for principal 'local' (shown once):\n  {created.secret}\n"
            f"Connect a client with the header  Authorization: Bearer {created.secret}"
        )
        if not people.rows.count():
            # The person who approves the agent's calls is not the key: on a first start,
            # an approver for 'local', who registers a passkey with a link shown here only.
            approver = people.add("Local operator", principals=["local"])
            link = people.issue_enrolment(approver.id)
            typer.echo(
                "A person approves the agent's calls, not its key. "
                + enrolment_text(settings.base_url, link.token, link.expires_at)
            )
    else:
        typer.echo("Connect with  Authorization: Bearer <API key>  (`lockgate keys create`).")
    if not people.rows.count():
        typer.echo(
            "No approver exists: no call can be approved outside approval mode `model`. Add "
            "one: lockgate approvers add NAME --principal PRINCIPAL"
        )
    # Flushed now: a worker's log and the supervisor's banner go to different buffers.
    sys.stdout.flush()


def _serve(application: Any, settings: Any, sockets: list[Any] | None = None) -> None:
    """Serve `application` until SIGTERM or SIGINT, then drain: on `sockets` when given (a
    worker's inherited one), else on the configured host and port."""
    import logging
    import signal
    import threading

    import uvicorn

    drain = application.state.drain
    draining_runtime = application.state.runtime

    def drain_runtime() -> None:
        try:
            draining_runtime.drain()
        except Exception:  # the stop goes on; what was not recorded, recovery takes over
            logging.getLogger("lockgate.server").exception("the drain failed")

    class DrainingServer(uvicorn.Server):
        """SIGTERM starts the drain at once: open requests are answered or reported before
        uvicorn's graceful wait, instead of holding it up, and the runtime's drain begins
        (running code stopped, executions handed back) in parallel with that wait, so the
        whole stop keeps to `drain_timeout`."""

        def handle_exit(self, sig: int, frame: Any) -> None:
            drain.trigger()
            # Off the signal handler: the drain writes to the database.
            threading.Thread(target=drain_runtime, name="lockgate-drain", daemon=True).start()
            super().handle_exit(sig, frame)

    config = uvicorn.Config(
        application,
        host=settings.host,
        port=settings.port,
        log_config=None,
        # Open connections get the drain's bound (uvicorn counts whole seconds), then the
        # app's shutdown spends what is left of it (Runtime.close).
        timeout_graceful_shutdown=max(1, int(settings.drain_timeout.total_seconds())),
    )
    # uvicorn re-raises the signal it stopped for once it has shut down; a drained stop is
    # a clean exit, so that re-raise lands here and exits 0.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    DrainingServer(config).run(sockets)


def _serve_workers(
    settings: Any,
    signing: Any,
    extra_sources: Sequence[ToolSource],
    keys: Any,
    first_start: bool,
    count: int,
) -> None:
    """`count` workers behind one port, each an instance named after its slot."""
    from multiprocessing.synchronize import Event

    from lockgate.machine.runtime import default_instance_name
    from lockgate.server import operations
    from lockgate.server.workers import CANNOT_START, Supervisor, instance_name, listen

    try:
        listening = listen(settings.host, settings.port)
    except OSError as exc:
        raise _fail(
            f"cannot listen on {settings.host}:{settings.port}: {exc.strerror or exc}", 2
        ) from None
    base_name = default_instance_name(settings)
    with operations.shared_metrics() as metrics_dir:

        def worker(slot: int, created: Event) -> None:
            name = instance_name(base_name, slot)
            # What reads the settings again (a plugin, a log line) sees its own name too.
            os.environ["LOCKGATE_INSTANCE_NAME"] = name
            mine = settings.model_copy(update={"instance_name": name})
            operations.use_shared_metrics(metrics_dir)
            try:
                application = _startable_app(mine, signing, extra_sources, accept_early=False)
            except typer.Exit as refused:  # its reason is on stderr already
                sys.exit(refused.exit_code or CANNOT_START)
            created.set()
            _serve(application, mine, [listening])

        # The parent's connections are closed before the fork: each worker opens its own.
        keys.store.engine.dispose()
        stop_within = settings.drain_timeout.total_seconds() + 5
        supervisor = Supervisor(count, worker, stop_within=stop_within)
        try:
            if not supervisor.start():
                raise _fail("cannot start: a worker could not start (its reason is above).", 2)
            _welcome(settings, keys, first_start, workers=count)
            status = supervisor.supervise()
        finally:
            supervisor.stop()
            listening.close()
    if status:
        raise typer.Exit(status)


def log_format(setting: str, stream: Any) -> Literal["text", "json"]:
    """`auto`: readable lines for a person watching the terminal the log goes to (stderr),
    JSON for whatever collects it otherwise (a file, a pipe, a container runtime)."""
    if setting == "text" or (setting == "auto" and stream.isatty()):
        return "text"
    return "json"


def _keys_for(settings: Any) -> Any:
    from lockgate.machine.db.migrate import prepare_database
    from lockgate.machine.db.store import SqlStore
    from lockgate.server.keys import ApiKeys

    return ApiKeys(SqlStore(prepare_database(settings)))


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
    from pydantic import ValidationError

    from lockgate.machine.db.migrate import MigrationFailed, upgrade_database
    from lockgate.machine.settings import Settings

    try:
        settings = Settings()
    except ValidationError as exc:
        raise _fail(f"invalid configuration: {exc.errors()[0]['msg']}", 2) from None
    try:
        revision = upgrade_database(settings.database_url)
    except MigrationFailed as exc:
        # The driver's message names the host and the reason, never the password.
        raise _fail(f"could not migrate the database: {exc.reason}", 1) from None
    typer.echo(f"database schema is at revision {revision}")


if __name__ == "__main__":  # pragma: no cover
    app()
