"""`lockgate serve`: the checks before anything starts, the banner and first key, and the
server itself, in this process or as several workers behind one port (`server/workers.py`)."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

import typer

from lockgate.server.cli_admin import configured_settings
from lockgate.server.cli_admin import fail as _fail
from lockgate.server.cli_approvers import enrolment_text

if TYPE_CHECKING:
    from lockgate.machine.tools.registry import ToolSource


def is_loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def run_server(
    host: str | None, port: int | None, *, extra_sources: Sequence[ToolSource] = ()
) -> None:
    """`serve`: with `extra_sources`, those tool sources are registered next to the notes
    tools (a test launcher, tests/support/procs/canary_server.py, serves a leaking source
    this way). One worker serves in this process; several are forked behind one port
    (`server/workers.py`)."""
    import sys

    from lockgate.machine.db.migrate import DatabaseNotMigrated
    from lockgate.server.malloc_arenas import cap_malloc_arenas
    from lockgate.server.operations import configure_logging
    from lockgate.server.signing_keys import SigningKeyFileInvalid, SigningKeysMissing, signing_keys
    from lockgate.server.workers import worker_count

    # First, while this is the process's only thread: the workers it forks inherit it.
    cap_malloc_arenas()
    overrides: dict[str, Any] = {}
    if host is not None:
        overrides["host"] = host
    if port is not None:
        overrides["port"] = port
    settings = configured_settings(**overrides)
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
        try:
            application = _startable_app(settings, signing, extra_sources)
        except CannotStart as exc:
            raise _fail(str(exc), 2) from None
        # Only once the server can be served: a start refused above leaves no key nobody saw.
        _welcome(settings, keys, first_start, workers=1)
        _serve(application, settings)
    else:
        _serve_workers(settings, signing, extra_sources, keys, first_start, count)


class CannotStart(Exception):
    """Why the application cannot be served, in words for the operator."""


def _startable_app(
    settings: Any, signing: Any, extra_sources: Sequence[ToolSource], *, accept_early: bool = True
) -> Any:
    """The application; CannotStart saying why it cannot be served."""
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
        raise CannotStart(f"cannot start: {exc.message}.{hint}") from None
    except TracingMisconfigured as exc:
        raise CannotStart(f"cannot start: {exc}") from None


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
        # uvicorn's "auto" takes uvloop and httptools where they import (they are
        # dependencies: uvloop is not built for Windows, where this falls back to asyncio).
        loop="auto" if settings.event_loop == "auto" else "asyncio",
        http="auto" if settings.event_loop == "auto" else "h11",
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
    from lockgate.machine.runtime import default_instance_name
    from lockgate.server import operations
    from lockgate.server.workers import (
        Startup,
        Supervisor,
        WorkerRefused,
        instance_name,
        listen,
    )

    try:
        listening = listen(settings.host, settings.port)
    except OSError as exc:
        raise _fail(
            f"cannot listen on {settings.host}:{settings.port}: {exc.strerror or exc}", 2
        ) from None
    base_name = default_instance_name(settings)
    with operations.shared_metrics() as metrics_dir:

        def worker(slot: int, startup: Startup) -> None:
            name = instance_name(base_name, slot)
            # What reads the settings again (a plugin, a log line) sees its own name too.
            os.environ["LOCKGATE_INSTANCE_NAME"] = name
            mine = settings.model_copy(update={"instance_name": name})
            operations.use_shared_metrics(metrics_dir)
            try:
                application = _startable_app(mine, signing, extra_sources, accept_early=False)
            except CannotStart as exc:  # said once, by the supervisor
                raise WorkerRefused(str(exc)) from None
            startup.built()
            _serve(application, mine, [listening])

        # The parent's connections are closed before the fork: each worker opens its own.
        keys.store.engine.dispose()
        stop_within = settings.drain_timeout.total_seconds() + 5
        supervisor = Supervisor(count, worker, stop_within=stop_within)
        try:
            refused = supervisor.start()
            if refused is not None:
                raise _fail(refused, 2)
            _welcome(settings, keys, first_start, workers=count)
            status = supervisor.serve()
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
