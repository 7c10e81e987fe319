"""Sources stored in the database: added by agent code (`tools.lockgate.add_*_source`, once a
person approved) or by the operator (`lockgate sources add`), global or one principal's,
served by every instance, removable.

Two principals throughout: a source one of them added must never reach the other.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from lockgate.machine.engine import Action
from lockgate.machine.runtime import Runtime
from lockgate.machine.tools.errors import InvalidToolSource
from lockgate.machine.views import ExecutionView
from lockgate.server.cli import app
from lockgate.spec import ExecutionStatus
from tests.support.engine_records import MakeRuntime, caught
from tests.support.http_api import SHOP_SDL, ItemsApi, RunningApi, serve

ROOT = Path(__file__).resolve().parents[2]
LIST = "tools.items.list_items()"
CREATE = 'tools.items.create_item(body={"name": "pen", "price": 1.5})'


@pytest.fixture(name="api")
def api_fixture() -> Iterator[RunningApi]:
    yield from serve(ItemsApi())


def sources_runtime(make_runtime: MakeRuntime, **settings: Any) -> Runtime:
    # Checked at every look-up: these tests add sources and expect them at once. The APIs
    # principals add here listen on loopback, which the operator allows for them (a
    # principal's source reaches public addresses only otherwise: test_principal_reach).
    settings.setdefault("source_allowed_networks", "127.0.0.0/8")
    return make_runtime(sources_refresh_secs=0, **settings)


def add_code(api: RunningApi, name: str = "items", **extra: Any) -> str:
    arguments = {"name": name, "document": json.dumps(api.document), "base_url": api.url}
    return f"tools.lockgate.add_openapi_source(**{ {**arguments, **extra}!r})"


def approved(rt: Runtime, principal: str, code: str) -> ExecutionView:
    """Run `code` for `principal`, accepting the one call it waits for."""
    paused = rt.engine.execute(principal, code)
    assert paused.status is ExecutionStatus.WAITING_FOR_INTERACTION, paused.error
    done = rt.engine.resume(paused.id, principal, Action.ACCEPT)
    assert done.status is ExecutionStatus.COMPLETED, done.error
    return done


def listed_names(rt: Runtime, principal: str) -> set[str]:
    listed = rt.engine.execute(principal, "tools.lockgate.list_sources()")
    assert isinstance(listed.result, list), listed.error
    return {str(entry["name"]) for entry in listed.result if isinstance(entry, dict)}


def test_a_source_added_in_code_waits_for_approval_and_serves_only_its_principal(
    make_runtime: MakeRuntime, api: RunningApi
) -> None:
    rt = sources_runtime(make_runtime)
    paused = rt.engine.execute("alice", add_code(api))
    assert paused.status is ExecutionStatus.WAITING_FOR_INTERACTION
    assert paused.pending is not None
    assert paused.pending.tool == "lockgate.add_openapi_source"
    # Nothing is added before the decision.
    before = rt.engine.execute("alice", caught(LIST))
    assert "AttributeError" in str(before.result), before.result

    done = rt.engine.resume(paused.id, "alice", Action.ACCEPT)
    assert done.status is ExecutionStatus.COMPLETED, done.error
    assert done.result == {"name": "items", "kind": "openapi", "scope": "own", "tools": 10}

    # alice's code calls the API: reads at once, writes wait for a person as any write.
    read = rt.engine.execute("alice", LIST)
    assert read.status is ExecutionStatus.COMPLETED, read.error
    assert read.result == []
    write = rt.engine.execute("alice", CREATE)
    assert write.status is ExecutionStatus.WAITING_FOR_INTERACTION
    assert api.api.effects == []

    # bob sees none of it: not in his code, not in his list.
    bob = rt.engine.execute("bob", caught(LIST))
    assert bob.status is ExecutionStatus.COMPLETED
    assert bob.result == "AttributeError: module 'tools' has no attribute 'items'"
    assert "items" not in listed_names(rt, "bob")
    assert "items" in listed_names(rt, "alice")
    mine = rt.engine.execute("alice", "tools.lockgate.list_sources()")
    assert isinstance(mine.result, list)
    assert {"name": "items", "kind": "openapi", "scope": "own", "tools": 10} in mine.result

    # bob may have an `items` of his own, independent of alice's.
    approved(rt, "bob", add_code(api))
    assert rt.engine.execute("bob", LIST).status is ExecutionStatus.COMPLETED


def test_removing_a_source_waits_for_approval_and_a_waiting_call_of_it_then_fails_in_words(
    make_runtime: MakeRuntime, api: RunningApi
) -> None:
    rt = sources_runtime(make_runtime)
    approved(rt, "alice", add_code(api))
    write = rt.engine.execute("alice", caught(CREATE))
    assert write.status is ExecutionStatus.WAITING_FOR_INTERACTION

    removed = approved(rt, "alice", 'tools.lockgate.remove_source(name="items")')
    assert removed.result == {"name": "items", "kind": "openapi", "scope": "own", "tools": 0}
    gone = rt.engine.execute("alice", caught(LIST))
    assert gone.result == "AttributeError: module 'tools' has no attribute 'items'"

    # The write approved after its source went is not made: the code hears why.
    done = rt.engine.resume(write.id, "alice", Action.ACCEPT)
    assert done.status is ExecutionStatus.COMPLETED, done.error
    assert "tools.items.create_item is no longer available" in str(done.result)
    assert api.api.effects == []

    # bob cannot remove what is not his, nor the server's own sources.
    refused = approved(rt, "bob", caught('tools.lockgate.remove_source(name="items")'))
    assert "there is no source of yours named 'items'" in str(refused.result)
    own = approved(rt, "bob", caught('tools.lockgate.remove_source(name="notes")'))
    assert "'notes' is one of the server's configured sources" in str(own.result)


def test_what_can_only_fail_is_refused_before_anyone_is_asked(
    make_runtime: MakeRuntime, api: RunningApi
) -> None:
    rt = sources_runtime(make_runtime)
    cases = {
        # A file on the server, which a request may not name.
        'tools.lockgate.add_openapi_source(name="x", document="/etc/passwd")': (
            "give the document's text or its http(s) URL"
        ),
        # Not an OpenAPI document.
        'tools.lockgate.add_openapi_source(name="x", document="{\\"swagger\\": \\"2.0\\"}")': (
            "not an OpenAPI 3.0 or 3.1 document"
        ),
        # The server's own source's name.
        add_code(api, name="notes"): "the name of one of the server's configured sources",
        # A command to run on the server: not even an argument of the tool.
        'tools.lockgate.add_mcp_source(name="x", url="http://127.0.0.1:9", command="rm")': (
            "command"
        ),
        # A schema that is not GraphQL SDL.
        'tools.lockgate.add_graphql_source(name="x", endpoint="http://h", schema="type Q {")': (
            "Syntax Error"
        ),
    }
    for code, words in cases.items():
        view = rt.engine.execute("alice", caught(code))
        assert view.status is ExecutionStatus.COMPLETED, (code, view.error)
        assert str(view.result).startswith("TypeError"), (code, view.result)
        assert words in str(view.result), (code, view.result)
    assert rt.engine.store.sources.all() == []


def test_a_principal_may_add_a_bounded_number_of_sources(
    make_runtime: MakeRuntime, api: RunningApi
) -> None:
    rt = sources_runtime(make_runtime, max_sources_per_principal=1)
    approved(rt, "alice", add_code(api, name="first"))
    second = approved(rt, "alice", caught(add_code(api, name="second")))
    assert "you already have 1 sources, the most one principal may add" in str(second.result)
    # A repeat of the same add (a retried call) is no change; another under the name is refused.
    again = approved(rt, "alice", add_code(api, name="first"))
    assert again.result == {"name": "first", "kind": "openapi", "scope": "own", "tools": 10}
    other = approved(rt, "alice", caught(add_code(api, name="first", base_url="http://h:1")))
    assert "a source named 'first' is already stored" in str(other.result)
    # bob's count is his own.
    approved(rt, "bob", add_code(api, name="first"))


def test_a_graphql_source_added_by_introspection_is_stored_as_its_schema(
    make_runtime: MakeRuntime, api: RunningApi
) -> None:
    rt = sources_runtime(make_runtime)
    added = approved(
        rt, "alice", f'tools.lockgate.add_graphql_source(name="shop", endpoint="{api.url}/graphql")'
    )
    assert added.result == {"name": "shop", "kind": "graphql", "scope": "own", "tools": 2}
    (row,) = rt.engine.store.sources.all()
    assert isinstance(row.config, dict) and "addItem" in str(row.config["schema"])
    assert SHOP_SDL  # the API's schema, which introspection found
    items = rt.engine.execute("alice", 'tools.shop.query(query="{ items { id name } }")')
    assert items.status is ExecutionStatus.COMPLETED, items.error


def test_every_instance_serves_a_source_another_one_stored(
    make_runtime: MakeRuntime, api: RunningApi
) -> None:
    first = sources_runtime(make_runtime)
    second = sources_runtime(make_runtime, instance_name="second")
    # From a URL: fetched once, when added; the stored row holds its text.
    approved(first, "alice", add_code(api, document=f"{api.url}/openapi.json"))
    (row,) = first.engine.store.sources.all()
    assert isinstance(row.config, dict)
    assert json.loads(str(row.config["document"]))["info"]["title"] == "Items"
    view = second.engine.execute("alice", LIST)
    assert view.status is ExecutionStatus.COMPLETED, view.error
    bob = second.engine.execute("bob", caught(LIST))
    assert "AttributeError" in str(bob.result)


def test_the_operator_adds_lists_and_removes_global_sources(
    make_runtime: MakeRuntime,
    api: RunningApi,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    database_url: str,
) -> None:
    rt = sources_runtime(make_runtime)
    document = tmp_path / "items.json"
    document.write_text(json.dumps(api.document))
    monkeypatch.setenv("LOCKGATE_DATABASE_URL", database_url)
    monkeypatch.setenv("LOCKGATE_NOTES_DIR", str(tmp_path / "notes"))
    monkeypatch.chdir(tmp_path)
    cli = CliRunner()

    added = cli.invoke(
        app, ["sources", "add", "openapi", "items", "items.json", "--base-url", api.url]
    )
    assert added.exit_code == 0, added.output
    assert added.output == "added openapi source items for (everyone): 10 tools\n"
    for principal in ("alice", "bob"):
        assert rt.engine.execute(principal, LIST).status is ExecutionStatus.COMPLETED

    # alice cannot take the name, nor remove the global source.
    clash = approved(rt, "alice", caught(add_code(api)))
    assert "'items' is the name of a global source" in str(clash.result)
    kept = approved(rt, "alice", caught('tools.lockgate.remove_source(name="items")'))
    assert "there is no source of yours named 'items'" in str(kept.result)

    listed = cli.invoke(app, ["sources", "list"])
    assert listed.exit_code == 0 and "items" in listed.output and "(everyone)" in listed.output
    seen = cli.invoke(app, ["sources", "list", "--principal", "alice"])
    assert "items                    openapi  global     10 tools" in seen.output, seen.output

    bad = cli.invoke(app, ["sources", "add", "soap", "x", "y"])
    assert bad.exit_code == 2 and "unknown kind of source 'soap'" in bad.output
    assert "A source is openapi, graphql or mcp." in bad.output
    # An option another kind takes is refused, not silently dropped.
    stray = cli.invoke(
        app, ["sources", "add", "graphql", "shop", "http://127.0.0.1:9/", "--base-url", api.url]
    )
    assert stray.exit_code == 2, stray.output
    assert "--base-url: not an option of a graphql source" in stray.output
    missing = cli.invoke(app, ["sources", "remove", "nothing"])
    assert missing.exit_code == 1 and "there is no global source named 'nothing'" in missing.output

    removed = cli.invoke(app, ["sources", "remove", "items"])
    assert removed.exit_code == 0, removed.output
    gone = rt.engine.execute("bob", caught(LIST))
    assert "AttributeError" in str(gone.result)


def test_an_operator_s_stdio_mcp_server_is_stored_and_started_where_it_is_used(
    make_runtime: MakeRuntime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, database_url: str
) -> None:
    rt = sources_runtime(make_runtime)
    monkeypatch.setenv("LOCKGATE_DATABASE_URL", database_url)
    monkeypatch.setenv("LOCKGATE_NOTES_DIR", str(tmp_path / "notes"))
    monkeypatch.chdir(ROOT)  # the command runs where `lockgate sources add` was run
    command = f"{sys.executable} -m tests.support.upstream_mcp {tmp_path / 'effects'}"
    cli = CliRunner()
    added = cli.invoke(app, ["sources", "add", "mcp", "up", command, "--principal", "alice"])
    assert added.exit_code == 0, added.output
    assert added.output == "added mcp source up for alice: 5 tools\n"

    # Started by this runtime on alice's first use, from what was stored; bob never has it.
    done = rt.engine.execute("alice", 'tools.up.lookup(key="abc")')
    assert done.status is ExecutionStatus.COMPLETED, done.error
    assert done.result == {"key": "abc", "value": "ABC"}
    assert "AttributeError" in str(rt.engine.execute("bob", caught("tools.up.pid()")).result)

    # A request may not name a command: add_mcp_source takes a URL only, and the table a
    # request gives is refused a command even where the schema is not asked.
    from lockgate.machine.tools.source_tables import REQUEST

    with pytest.raises(InvalidToolSource, match="a command cannot be given here"):
        rt.catalog.add("mcp", {"name": "x", "command": ["true"]}, principal="bob", origin=REQUEST)

    removed = cli.invoke(app, ["sources", "remove", "up", "--principal", "alice"])
    assert removed.exit_code == 0, removed.output
    gone = rt.engine.execute("alice", caught('tools.up.lookup(key="abc")'))
    assert "AttributeError" in str(gone.result)
    rt.close_sources()
