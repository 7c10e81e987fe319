"""An OpenAPI document as a tool source, against a real HTTP API on loopback (FastAPI, its
generated 3.1 document): one tool per operation, reads made at once, writes waiting for a
person and made once, arguments checked against the document's schemas (through `$ref`s)
before any pause, HTTP failures and limits reaching the code in words, the sources file."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lockgate.machine.db.audit_queries import AuditQueries
from lockgate.machine.engine import Action
from lockgate.machine.policy import PolicyDecision
from lockgate.machine.runtime import Runtime
from lockgate.machine.secrets import REDACTED, StaticSecrets
from lockgate.machine.tools.errors import InvalidToolSource
from lockgate.machine.tools.http_calls import HttpLimits
from lockgate.machine.tools.openapi import OpenApiSource, to_json_schema
from lockgate.machine.tools.source_file import load_sources
from lockgate.spec import ExecutionStatus
from tests.support.canary import CANARY
from tests.support.engine_records import MakeRuntime, caught, restart
from tests.support.http_api import ItemsApi, RunningApi, serve, sources_file


@pytest.fixture(name="api")
def api_fixture() -> Iterator[RunningApi]:
    yield from serve(ItemsApi())


def runtime_on(
    make_runtime: MakeRuntime, tmp_path: Path, api: RunningApi, **settings: Any
) -> Runtime:
    return make_runtime(sources_file=sources_file(tmp_path, api), **settings)


def test_each_operation_is_a_tool_reads_approved_writes_gated(api: RunningApi) -> None:
    source = OpenApiSource("items", api.document, base_url=api.url)
    specs = {tool.spec.name: tool.spec for tool in source.tools()}
    assert sorted(specs) == [
        "big", "create_item", "delete_item_items__item_id__delete", "get_file", "get_item",
        "held", "list_items", "loop", "place_order", "whoami",
    ]  # fmt: skip
    listing = specs["list_items"]
    assert listing.idempotent and listing.default_policy is PolicyDecision.APPROVE
    assert listing.description == "List the items (GET /items)"
    assert (
        listing.bare_signature()
        == "tools.items.list_items(limit: int = 10, tag: str | None = ...) -> Any"
    )
    create = specs["create_item"]
    assert not create.idempotent and create.default_policy is PolicyDecision.REQUIRE_APPROVAL
    assert create.bare_signature() == "tools.items.create_item(body: dict[str, Any]) -> Any"
    assert specs["get_item"].bare_signature() == "tools.items.get_item(item_id: int) -> Any"
    # Each tool carries the components it refers to, not the document's whole set.
    item = api.document["components"]["schemas"]["Item"]
    assert create.parameters["components"] == {"schemas": {"Item": item}}
    assert "components" not in listing.parameters


def test_a_read_is_made_at_once_and_answers_with_the_api_s_json(
    make_runtime: MakeRuntime, tmp_path: Path, api: RunningApi
) -> None:
    api.api.items[1] = {"id": 1, "name": "pen", "price": 1.5, "tags": ["office"]}
    api.api.items[2] = {"id": 2, "name": "cup", "price": 3.0, "tags": []}
    rt = runtime_on(make_runtime, tmp_path, api)
    done = rt.engine.execute("alice", 'tools.items.list_items(limit=5, tag="office")')
    assert done.status is ExecutionStatus.COMPLETED, done.error
    assert done.result == [{"id": 1, "name": "pen", "price": 1.5, "tags": ["office"]}]


def test_a_write_waits_for_a_person_then_is_made_once(
    make_runtime: MakeRuntime, tmp_path: Path, api: RunningApi
) -> None:
    rt = runtime_on(make_runtime, tmp_path, api)
    code = 'tools.items.create_item(body={"name": "pen", "price": 1.5})'
    paused = rt.engine.execute("alice", code)
    assert paused.status is ExecutionStatus.WAITING_FOR_INTERACTION
    assert paused.pending is not None and paused.pending.tool == "items.create_item"
    assert paused.pending.arguments_preview == {"body": {"name": "pen", "price": 1.5}}
    assert api.api.effects == []  # nothing reached the API before the decision
    done = rt.engine.resume(paused.id, "alice", Action.ACCEPT)
    assert done.status is ExecutionStatus.COMPLETED, done.error
    assert done.result == {"id": 1, "name": "pen", "price": 1.5, "tags": []}
    assert api.api.effects == [{"created": 1}]
    # The write carried its call's journal id, for an API that deduplicates by it.
    assert api.api.idempotency_keys == [f"{paused.id}:1"]


def test_arguments_breaking_the_document_s_schema_fail_before_any_pause(
    make_runtime: MakeRuntime, tmp_path: Path, api: RunningApi
) -> None:
    rt = runtime_on(make_runtime, tmp_path, api)
    # `body` is a $ref to components/schemas/Item: its rules apply through the reference.
    done = rt.engine.execute(
        "alice", caught('tools.items.create_item(body={"name": "", "price": -1})')
    )
    assert done.status is ExecutionStatus.COMPLETED, done.error
    assert isinstance(done.result, str)
    assert done.result.startswith("TypeError: tools.items.create_item: ")
    assert "argument 'body.name': '' should be non-empty (rule: minLength)" in done.result
    assert (
        "argument 'body.price': -1 is less than the minimum of 0.0 (rule: minimum)" in done.result
    )
    assert done.calls == [] and api.api.effects == []


def test_an_http_error_reaches_the_code_with_its_status_and_body(
    make_runtime: MakeRuntime, tmp_path: Path, api: RunningApi
) -> None:
    rt = runtime_on(make_runtime, tmp_path, api)
    done = rt.engine.execute("alice", caught("tools.items.get_item(item_id=7)"))
    assert done.result == (
        "RuntimeError: tools.items.get_item failed: GET /items/7 answered HTTP 404: "
        '{"detail":"no item 7"}'
    )


def test_outbound_calls_are_bounded_in_size_time_and_redirects(
    make_runtime: MakeRuntime, tmp_path: Path, api: RunningApi
) -> None:
    rt = runtime_on(
        make_runtime, tmp_path, api, http_max_response_bytes=1000, http_timeout_secs=0.5,
        http_max_redirects=2,
    )  # fmt: skip
    code = (
        "out = []\n"
        "for call in (lambda: tools.items.big(size=999), lambda: tools.items.big(size=1001),\n"
        "             tools.items.held, tools.items.loop):\n"
        "    try:\n"
        "        got = call()\n"
        "        out.append(len(got))\n"
        "    except RuntimeError as e:\n"
        "        out.append(str(e))\n"
        "out"
    )
    done = rt.engine.execute("alice", code)
    assert done.result == [
        999,
        "tools.items.big failed: GET /big: the response is larger than 1000 bytes "
        "(LOCKGATE_HTTP_MAX_RESPONSE_BYTES); ask for less (a filter, a page).",
        "tools.items.held failed: GET /held: not answered in full within 0.5 s "
        "(LOCKGATE_HTTP_TIMEOUT_SECS, the whole call's bound).",
        "tools.items.loop failed: GET /loop: more than 2 redirects (LOCKGATE_HTTP_MAX_REDIRECTS).",
    ], done.error


def test_a_write_sent_and_never_answered_is_left_in_doubt(
    make_runtime: MakeRuntime, tmp_path: Path, api: RunningApi
) -> None:
    rt = runtime_on(make_runtime, tmp_path, api, http_timeout_secs=0.5)
    paused = rt.engine.execute("alice", "tools.items.place_order(quantity=3)")
    assert paused.status is ExecutionStatus.WAITING_FOR_INTERACTION
    done = rt.engine.resume(paused.id, "alice", Action.ACCEPT)
    assert api.api.effects == [{"ordered": 3}]  # it was made; its answer never came
    # In doubt, as recovery leaves a call whose instance died after dispatching it.
    assert done.status is ExecutionStatus.INTERRUPTED
    assert [(c.tool, c.status) for c in done.calls] == [("items.place_order", "in_doubt")]
    assert isinstance(done.what_ran, dict)
    assert done.what_ran["in_doubt"] == [{"seq": 1, "tool": "items.place_order"}]
    assert done.what_ran["cause"] == (
        "POST /orders: not answered in full within 0.5 s (LOCKGATE_HTTP_TIMEOUT_SECS, the "
        "whole call's bound) after the request was sent: whether it took effect is unknown."
    )


def test_openapi_3_0_schemas_become_json_schema() -> None:
    legacy = {
        "type": "object",
        "properties": {
            "note": {"type": "string", "nullable": True},
            "any": {"nullable": True, "minLength": 1},
            "count": {"type": "integer", "minimum": 0, "exclusiveMinimum": True},
            "cap": {"type": "integer", "maximum": 9, "exclusiveMaximum": False},
        },
    }
    assert to_json_schema(legacy) == {
        "type": "object",
        "properties": {
            "note": {"type": ["string", "null"]},
            "any": {"anyOf": [{"minLength": 1}, {"type": "null"}]},
            "count": {"type": "integer", "exclusiveMinimum": 0},
            "cap": {"type": "integer", "maximum": 9},
        },
    }


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ('[[openapi]]\nname = "items"\ndocument = "missing.json"\n', "cannot be read"),
        ('[[openapi]]\nname = "my-api"\ndocument = "x.json"\n', "a Python identifier"),
        ('[[openapi]]\nname = "items"\ndocument = "x.json"\ncolour = 1\n', "unknown keys colour"),
        ('[[soap]]\nname = "g"\n', "unknown sections: soap"),
        ('[[openapi]]\nname = "items"\ndocument = """{"swagger": "2.0"}"""\n', "not an OpenAPI 3"),
        ('[[openapi]]\nname = "items"\ndocument = """{"openapi": "3.1.0"}"""\n', "names no server"),
        ("[[openapi]\n", "not valid TOML"),
    ],
)
def test_a_sources_file_it_cannot_serve_is_refused_naming_why(
    tmp_path: Path, toml: str, message: str
) -> None:
    path = tmp_path / "sources.toml"
    path.write_text(toml)
    with pytest.raises(InvalidToolSource, match=message):
        load_sources(path, HttpLimits())


def test_a_paused_write_is_made_once_by_the_next_incarnation(
    make_runtime: MakeRuntime, tmp_path: Path, api: RunningApi
) -> None:
    first = runtime_on(make_runtime, tmp_path, api)
    paused = first.engine.execute(
        "alice", 'tools.items.create_item(body={"name": "pen", "price": 2})'
    )
    assert paused.status is ExecutionStatus.WAITING_FOR_INTERACTION
    # The first incarnation is gone (nothing of it is kept); the next one reads the same
    # sources file and the paused execution from the database.
    second = restart(make_runtime, sources_file=tmp_path / "sources.toml")
    done = second.engine.resume(paused.id, "alice", Action.ACCEPT)
    assert done.status is ExecutionStatus.COMPLETED, done.error
    assert done.result == {"id": 1, "name": "pen", "price": 2.0, "tags": []}
    assert api.api.effects == [{"created": 1}]


def test_a_path_parameter_stays_one_segment_of_its_operation_s_path(
    make_runtime: MakeRuntime, tmp_path: Path, api: RunningApi
) -> None:
    rt = runtime_on(make_runtime, tmp_path, api)
    code = "[tools.items.get_file(name=n)['name'] for n in ('..', '.', 'x y')]"
    done = rt.engine.execute("alice", code)
    # Unencoded, `..` would have gone to GET / (URL normalisation resolves it).
    assert done.result == ["..", ".", "x y"], done.error
    # A slash stays inside the segment (this API's server decodes it and finds no route).
    sent = rt.engine.execute("alice", caught("tools.items.get_file(name='a/../b')"))
    assert isinstance(sent.result, str)
    assert "GET /files/a%2F..%2Fb answered HTTP 404" in sent.result


@pytest.mark.parametrize(
    ("auth", "sent"),
    [
        ('{ bearer = "notes_token" }', {"authorization": f"Bearer {REDACTED}", "api_key": None}),
        (
            '{ query = "api_key", secret = "notes_token" }',
            {"authorization": None, "api_key": REDACTED},
        ),
        (
            '{ header = "Authorization", secret = "notes_token" }',
            {"authorization": REDACTED, "api_key": None},
        ),
    ],
)
def test_a_source_s_credential_is_a_secret_sent_and_never_kept(
    make_runtime: MakeRuntime, tmp_path: Path, api: RunningApi, auth: str, sent: dict[str, Any]
) -> None:
    rt = make_runtime(sources_file=sources_file(tmp_path, api, auth=auth))
    done = rt.engine.execute("alice", "tools.items.whoami()")
    # The API got the secret (it echoed it back); the result kept only its redaction.
    assert done.result == sent, done.error
    stored = AuditQueries(rt.engine.store.engine).stored_text()
    assert not [table for table, text in stored if CANARY in text]


def test_basic_auth_sends_the_secret_as_user_and_password(
    make_runtime: MakeRuntime, tmp_path: Path, api: RunningApi
) -> None:
    rt = make_runtime(sources_file=sources_file(tmp_path, api, auth='{ basic = "notes_token" }'))
    done = rt.engine.execute("alice", "tools.items.whoami()['authorization']")
    assert done.result == "Basic " + base64.b64encode(CANARY.encode()).decode(), done.error


@pytest.mark.parametrize(
    "auth", ['"notes_token"', '{ bearer = "" }', '{ header = "X-Key" }', '{ cookie = "a" }']
)
def test_an_auth_it_cannot_use_is_refused_naming_the_forms(
    tmp_path: Path, api: RunningApi, auth: str
) -> None:
    with pytest.raises(InvalidToolSource, match="auth must be one of"):
        load_sources(sources_file(tmp_path, api, auth=auth), HttpLimits())


@pytest.mark.parametrize(
    ("operation", "problem"),
    [
        (
            {"requestBody": {"content": {"application/json": {"schema": {"$ref": "#/x/Nope"}}}}},
            "POST /a (tool broken.post__a) is left out: its $ref '#/x/Nope' points to nothing "
            "in the document (no 'x' at # (the document's root))",
        ),
        (
            {"requestBody": {"$ref": "#/components/requestBodies/A"}},
            "POST /a (tool broken.post__a) is left out: it has more than 32 $refs in a row "
            "(a cycle?)",
        ),
        (
            {"parameters": [{"name": "q", "in": "query", "schema": {"type": "strnig"}}]},
            "POST /a (tool broken.post__a) is left out: parameters at properties/q/type is not "
            "a valid JSON Schema: 'strnig' is not a JSON type",
        ),
        (
            {"parameters": [{"name": "q", "in": "query", "schema": {"pattern": "(?P<x>a)"}}]},
            "POST /a (tool broken.post__a) is left out: parameters at properties/q/pattern is "
            "not a valid JSON Schema: '(?P<x>a)' is not an ECMA-262 regular expression: "
            "invalid group modifier",
        ),
    ],
)
def test_an_operation_that_cannot_be_served_is_left_out_and_named(
    operation: dict[str, Any], problem: str, caplog: pytest.LogCaptureFixture
) -> None:
    bodies = "#/components/requestBodies/"
    cycle = {"A": {"$ref": f"{bodies}B"}, "B": {"$ref": f"{bodies}A"}}  # refers to itself
    document: dict[str, Any] = {
        "openapi": "3.1.0",
        "servers": [{"url": "http://x"}],
        "paths": {"/a": {"post": operation, "get": {"operationId": "fine"}}},
        "components": {"requestBodies": cycle},
    }
    source = OpenApiSource("broken", document)
    assert [tool.spec.name for tool in source.tools()] == ["fine"]
    (left_out,) = source.left_out
    assert left_out.startswith(problem), left_out
    assert [r.getMessage() for r in caplog.records] == [f"source 'broken': {left_out}"]
    # With no operation left to serve, the document is refused whole, naming the first.
    del document["paths"]["/a"]["get"]
    with pytest.raises(InvalidToolSource) as caught:
        OpenApiSource("broken", document)
    assert caught.value.message.startswith(
        f"source 'broken': none of its 1 operations can be served; the first: {problem}"
    ), caught.value.message


def test_a_document_is_read_from_a_url_and_a_missing_one_is_named(
    make_runtime: MakeRuntime, tmp_path: Path, api: RunningApi
) -> None:
    path = tmp_path / "sources.toml"
    path.write_text(
        f'[[openapi]]\nname = "items"\ndocument = "{api.url}/openapi.json"\n'
        f'base_url = "{api.url}"\n'
    )
    rt = make_runtime(sources_file=path)
    done = rt.engine.execute("alice", caught("tools.items.get_item(item_id=7)"))
    assert isinstance(done.result, str) and "answered HTTP 404" in done.result
    path.write_text(f'[[openapi]]\nname = "items"\ndocument = "{api.url}/nowhere.json"\n')
    with pytest.raises(InvalidToolSource) as refused:
        load_sources(path, HttpLimits())
    assert refused.value.message == (
        f"source 'items': fetching its document at {api.url}/nowhere.json answered HTTP 404: "
        '{"detail":"Not Found"}'
    )


def test_parameters_the_document_does_not_complete_are_left_out_not_a_crash() -> None:
    document = {
        "openapi": "3.1.0",
        "servers": [{"url": "http://x"}],
        "paths": {
            "/a": {
                "parameters": {"not": "a list"},
                "get": {"parameters": [{"in": "query"}, {"name": "q", "in": "query"}]},
                "post": {"parameters": None},
            }
        },
    }
    signatures = [tool.spec.bare_signature() for tool in OpenApiSource("s", document).tools()]
    assert signatures == ["tools.s.get__a(q: Any = ...) -> Any", "tools.s.post__a() -> Any"]


def oauth_runtime(
    make_runtime: MakeRuntime, tmp_path: Path, api: RunningApi, credentials: str
) -> Runtime:
    auth = f'{{ oauth_token_url = "{api.url}/oauth/token", secret = "items_client", scope = "r" }}'
    return make_runtime(
        sources_file=sources_file(tmp_path, api, auth=auth),
        secrets=StaticSecrets({"items_client": credentials}),
    )


def test_oauth_client_credentials_get_a_token_once_and_it_is_never_kept(
    make_runtime: MakeRuntime, tmp_path: Path, api: RunningApi
) -> None:
    rt = oauth_runtime(make_runtime, tmp_path, api, "client:s3cret-client")
    for _ in range(2):
        done = rt.engine.execute("alice", "tools.items.whoami()")
        # The API echoed the access token; what was kept is its redaction.
        assert done.result == {"authorization": f"Bearer {REDACTED}", "api_key": None}, done.error
    # One token, asked for once with the grant and scope, then reused until near its expiry.
    assert api.api.token_requests == [{"grant_type": "client_credentials", "scope": "r"}]
    assert api.api.credentials == ["Bearer access-1-5e2b7d9c"] * 2
    stored = "\n".join(text for _, text in AuditQueries(rt.engine.store.engine).stored_text())
    assert "access-1-5e2b7d9c" not in stored and "s3cret-client" not in stored


def test_oauth_credentials_the_token_endpoint_refuses_fail_the_call_in_words(
    make_runtime: MakeRuntime, tmp_path: Path, api: RunningApi
) -> None:
    rt = oauth_runtime(make_runtime, tmp_path, api, "client:wrong")
    done = rt.engine.execute("alice", caught("tools.items.whoami()"))
    assert done.result == (
        "RuntimeError: tools.items.whoami failed: getting an OAuth access token answered "
        'HTTP 401: {"detail":"invalid_client"}'
    )
    assert api.api.credentials == []  # the API itself was never called
