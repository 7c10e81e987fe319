"""`lockgate sources`: the operator adds, lists and removes tool sources stored in the
database (global, or one principal's), which every instance serves within
`LOCKGATE_SOURCES_REFRESH_SECS`. The sources file stays the place for sources kept in
version control; these are for sources added at run time."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer

from lockgate.server.cli_admin import configured_settings, fail

sources_app = typer.Typer(
    help="Manage tool sources stored in the database (global or per principal).",
    no_args_is_help=True,
)


@contextlib.contextmanager
def opened_catalog() -> Iterator[Any]:
    """The configured database's `SourceCatalog`, over the configured sources (released
    at the end: an upstream MCP server's process among them)."""
    from lockgate.machine.db.migrate import prepare_database
    from lockgate.machine.db.store import SqlStore
    from lockgate.machine.runtime import configured_sources, source_catalog
    from lockgate.machine.secret_store import SecretCipher, StoredSecrets
    from lockgate.machine.tools.admin_source import AdminSource

    settings = configured_settings()
    store = SqlStore(prepare_database(settings))
    try:
        secrets = StoredSecrets(store.secrets, SecretCipher.from_settings(settings))
        configured, _direct = configured_sources(settings, secrets=secrets)
        chosen = [*configured, AdminSource()]
        catalog = source_catalog(settings, store, chosen, secrets)
        try:
            yield catalog
        finally:
            catalog.book.close()
    finally:
        store.engine.dispose()


def _failed(exc: Any, code: int) -> typer.Exit:
    return fail(exc.message + (f" {exc.hint}" if exc.hint else ""), code)


def _scope(principal: str | None) -> str:
    return "(everyone)" if principal is None else principal


def _kinds_help() -> str:
    # Read from the registry of kinds, imported only to build the help (it is small).
    from lockgate.machine.tools.kinds import STORED_KINDS

    return "; ".join(f"{kind.name}: {kind.target_help}" for kind in STORED_KINDS)


@sources_app.command("add")
def sources_add(
    kind: Annotated[str, typer.Argument(help="openapi, graphql or mcp.")],
    name: Annotated[str, typer.Argument(help="Agent code calls tools.<name>.<tool>(...).")],
    target: Annotated[str, typer.Argument(help=_kinds_help())],
    principal: Annotated[
        str | None, typer.Option(help="Only this principal's (default: everyone's).")
    ] = None,
    base_url: Annotated[
        str | None, typer.Option(help="openapi: where calls go, instead of the document's.")
    ] = None,
    schema: Annotated[
        Path | None, typer.Option(help="graphql: an SDL file, instead of introspection.")
    ] = None,
    auth: Annotated[
        str | None,
        typer.Option(help='The auth table as JSON, e.g. \'{"bearer": "my_token"}\'.'),
    ] = None,
    env: Annotated[
        list[str] | None,
        typer.Option(help="mcp over stdio: KEY=VALUE the command gets (repeatable)."),
    ] = None,
) -> None:
    """Add a source (checked first: its document read, its endpoint or server reached)."""
    from lockgate.machine.errors import LockgateError
    from lockgate.machine.tools.kinds import kind_named
    from lockgate.machine.tools.source_kind import CommandLine
    from lockgate.machine.tools.source_tables import Origin
    from lockgate.server.keys import check_principal

    pairs = [pair.partition("=") for pair in env or []]
    if any(not key or not sep for key, sep, _ in pairs):
        raise fail("--env takes KEY=VALUE", 2)
    given = CommandLine(
        target=target,
        cwd=str(Path.cwd()),
        base_url=base_url,
        schema=None if schema is None else str(schema.resolve()),
        env={key: value for key, _, value in pairs},
    )
    try:
        if principal is not None:
            check_principal(principal)
        added_kind = kind_named(kind, stored=True)
        assert added_kind.command_line is not None  # a stored kind has one
        entry: dict[str, Any] = {"name": name, **added_kind.command_line(given)}
        unused = sorted(option for option in given.given if option not in entry)
        if unused:
            options = ", ".join(f"--{option.replace('_', '-')}" for option in unused)
            raise fail(f"{options}: not an option of a {kind} source", 2)
        if auth is not None:
            try:
                entry["auth"] = json.loads(auth)
            except json.JSONDecodeError:
                raise fail(f"--auth is not JSON: {auth!r}", 2) from None
        with opened_catalog() as catalog:
            added = catalog.add(
                kind,
                entry,
                principal=principal,
                origin=Origin("the command line", Path.cwd()),
                by_operator=True,
            )
    except LockgateError as exc:
        raise _failed(exc, 2) from None
    typer.echo(
        f"added {added.kind} source {added.name} for {_scope(principal)}: {added.tools} tools"
    )
    for warning in added.left_out:
        typer.echo(f"  left out: {warning}")


@sources_app.command("list")
def sources_list(
    principal: Annotated[
        str | None,
        typer.Option(help="What this principal's code sees (default: every stored source)."),
    ] = None,
) -> None:
    """List sources: with --principal, what its code sees and how many tools each gives."""
    with opened_catalog() as catalog:
        if principal is not None:
            for found in catalog.listed(principal):
                typer.echo(
                    f"{found.name:<24} {found.kind:<8} {found.scope:<10} {found.tools} tools"
                )
                for warning in found.left_out:
                    typer.echo(f"  left out: {warning}")
            return
        for row in catalog.every():
            typer.echo(f"{row.name:<24} {row.kind:<8} {_scope(row.principal_id)}")


@sources_app.command("remove")
def sources_remove(
    name: Annotated[str, typer.Argument(help="The source's name.")],
    principal: Annotated[
        str | None, typer.Option(help="The principal's own source (default: the global one).")
    ] = None,
) -> None:
    """Remove a stored source: its tools are gone for later calls on every instance."""
    from lockgate.machine.errors import LockgateError

    try:
        with opened_catalog() as catalog:
            removed = catalog.remove(name, principal=principal)
    except LockgateError as exc:
        raise _failed(exc, 1) from None
    typer.echo(f"removed {removed.kind} source {removed.name} ({_scope(principal)})")
