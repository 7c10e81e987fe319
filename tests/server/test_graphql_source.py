"""A GraphQL API as a tool source, against a real endpoint on loopback (graphql-core behind
the test API): `query` made at once, `mutate` waiting for a person and made once, documents
validated against the schema (read by introspection or from an SDL file) before any pause,
and the API's own errors reaching the code in words."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from lockgate.machine.engine import Action
from lockgate.machine.policy import PolicyDecision
from lockgate.machine.runtime import Runtime
from lockgate.machine.tools.errors import InvalidToolSource
from lockgate.machine.tools.http_calls import HttpLimits
from lockgate.machine.tools.source_file import load_sources
from lockgate.spec import ExecutionStatus
from tests.support.engine_records import MakeRuntime, caught
from tests.support.http_api import SHOP_SDL, ItemsApi, RunningApi, serve


@pytest.fixture(name="api")
def api_fixture() -> Iterator[RunningApi]:
    yield from serve(ItemsApi())


def sources_file(tmp_path: Path, api: RunningApi, *, sdl: bool = False) -> Path:
    lines = ["[[graphql]]", 'name = "shop"', f'endpoint = "{api.url}/graphql"']
    if sdl:
        (tmp_path / "shop.graphql").write_text(SHOP_SDL)
        lines.append('schema = "shop.graphql"')
    path = tmp_path / "sources.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def runtime(make_runtime: MakeRuntime, tmp_path: Path, api: RunningApi) -> Runtime:
    return make_runtime(sources_file=sources_file(tmp_path, api))


@pytest.mark.parametrize("sdl", [False, True], ids=["introspection", "sdl-file"])
def test_a_query_tool_and_a_mutation_tool_with_their_policies(
    tmp_path: Path, api: RunningApi, sdl: bool
) -> None:
    [source] = load_sources(sources_file(tmp_path, api, sdl=sdl), HttpLimits())
    query, mutate = (tool.spec for tool in source.tools())
    assert (query.call_name, query.idempotent, query.default_policy) == (
        "tools.shop.query", True, PolicyDecision.APPROVE,
    )  # fmt: skip
    assert (mutate.call_name, mutate.idempotent, mutate.default_policy) == (
        "tools.shop.mutate", False, PolicyDecision.REQUIRE_APPROVAL,
    )  # fmt: skip
    assert query.bare_signature() == (
        "tools.shop.query(query: str, variables: dict[str, Any] = ...) -> dict[str, Any]"
    )


def test_a_query_is_made_at_once_with_its_variables(
    make_runtime: MakeRuntime, tmp_path: Path, api: RunningApi
) -> None:
    api.api.items[1] = {"id": 1, "name": "pen", "price": 1.0, "tags": []}
    api.api.items[2] = {"id": 2, "name": "cup", "price": 2.0, "tags": []}
    rt = runtime(make_runtime, tmp_path, api)
    code = (
        'tools.shop.query(query="query($n: Int) { items(limit: $n) { id name } }", '
        'variables={"n": 1})'
    )
    done = rt.engine.execute("alice", code)
    assert done.status is ExecutionStatus.COMPLETED, done.error
    assert done.result == {"items": [{"id": 1, "name": "pen"}]}


def test_a_mutation_waits_for_a_person_then_is_made_once(
    make_runtime: MakeRuntime, tmp_path: Path, api: RunningApi
) -> None:
    rt = runtime(make_runtime, tmp_path, api)
    document = 'mutation { addItem(name: "lamp") { id name } }'
    paused = rt.engine.execute("alice", f"tools.shop.mutate(query={document!r})")
    assert paused.status is ExecutionStatus.WAITING_FOR_INTERACTION
    assert paused.pending is not None and paused.pending.arguments_preview == {"query": document}
    assert api.api.effects == []
    done = rt.engine.resume(paused.id, "alice", Action.ACCEPT)
    assert done.result == {"addItem": {"id": 1, "name": "lamp"}}, done.error
    assert api.api.effects == [{"created": 1}]


@pytest.mark.parametrize(
    ("call", "problem"),
    [
        (
            "tools.shop.query(query='mutation { addItem(name: \"x\") { id } }')",
            "argument 'query' is a mutation: use tools.shop.mutate",
        ),
        (
            "tools.shop.mutate(query='{ items { id } }')",
            "argument 'query' is a query: use tools.shop.query",
        ),
        (
            "tools.shop.query(query='{ items { id price } }')",
            "argument 'query': Cannot query field 'price' on type 'Item'.",
        ),
        (
            "tools.shop.query(query='{ items { id ')",
            "argument 'query' is not GraphQL: Syntax Error: Expected Name, found <EOF>.",
        ),
        (
            "tools.shop.query(query='query A { items { id } } query B { items { id } }')",
            "argument 'query' must hold one operation (it holds 2)",
        ),
    ],
)
def test_a_document_the_api_would_refuse_fails_before_any_pause(
    make_runtime: MakeRuntime, tmp_path: Path, api: RunningApi, call: str, problem: str
) -> None:
    rt = runtime(make_runtime, tmp_path, api)
    done = rt.engine.execute("alice", caught(call))
    assert done.status is ExecutionStatus.COMPLETED, done.error
    assert isinstance(done.result, str) and done.result.startswith("TypeError: tools.shop.")
    assert problem in done.result, done.result
    assert done.calls == [] and api.api.effects == []


def test_the_api_s_errors_reach_the_code_in_words(
    make_runtime: MakeRuntime, tmp_path: Path, api: RunningApi
) -> None:
    rt = runtime(make_runtime, tmp_path, api)
    done = rt.engine.execute("alice", caught("tools.shop.query(query='{ item(id: 9) { id } }')"))
    assert done.result == (
        "RuntimeError: tools.shop.query failed: GraphQL query: the API answered errors: no item 9"
    )


def test_an_endpoint_that_answers_no_schema_is_refused_at_start(tmp_path: Path) -> None:
    path = tmp_path / "sources.toml"
    path.write_text('[[graphql]]\nname = "shop"\nendpoint = "http://127.0.0.1:9/graphql"\n')
    with pytest.raises(
        InvalidToolSource, match="source 'shop': GraphQL introspection: the request"
    ):
        load_sources(path, HttpLimits(timeout_secs=2))
